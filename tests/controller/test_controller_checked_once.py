"""The controller judges each object's shape once, as the object comes in, and its full analyses
take those verdicts: a bad spec or status field is reported exactly as a check of everything
reports it (object, field, what is wrong), an object put right is analysed again, nothing is
checked twice, and the verdicts of objects let go are let go too."""

from __future__ import annotations

import copy

import orjson

from gwpolicy import shapes
from gwpolicy.analysis import analyse
from gwpolicy.bench.controller_inproc import write_status
from gwpolicy.bench.generate import cluster
from gwpolicy.controller.model import ClusterModel
from gwpolicy.refs import GATEWAY_GROUP

CONTROLLER = "gwpolicy.io/policy-controller"


def _model() -> ClusterModel:
    m = ClusterModel(CONTROLLER)
    for o in cluster(40):
        m.event("ADDED", orjson.loads(orjson.dumps(o, default=str)))
    return m


def _route(m: ClusterModel, name: str) -> dict:
    """A copy of the route to change and feed back, with the new resourceVersion the API server
    would give the change."""
    raw = copy.deepcopy(next(o for k, o in m.objects.items() if k[1] == "HTTPRoute" and k[3] == name))
    raw["metadata"]["resourceVersion"] = str(int(raw["metadata"].get("resourceVersion") or 0) + 1)
    return raw


def _skipped(warnings: list[str]) -> list[str]:
    return [w for w in warnings if w.endswith("; skipped")]


def _as_a_check_of_everything_says(m: ClusterModel) -> list[str]:
    return _skipped(analyse(copy.deepcopy(list(m.objects.values())), controller=CONTROLLER).warnings)


def test_bad_fields_are_reported_as_a_check_of_everything_reports_them() -> None:
    m = _model()
    first = m.reconcile()
    write_status(m, first)  # every object now carries status (new copies, same specs)
    bad_status = _route(m, "route-000001")
    bad_status["status"]["parents"][0]["conditions"][0]["observedGeneration"] = "one"
    bad_spec = _route(m, "route-000002")
    bad_spec["spec"]["hostnames"] = [5]
    for raw in (bad_status, bad_spec):
        m.event("MODIFIED", raw)
    m.stale = True
    m.reconcile()
    reported = _skipped(m.analysis.warnings)
    assert reported == _as_a_check_of_everything_says(m)
    assert [w.split(": ", 1)[1] for w in reported] == [
        "HTTPRoute app-0001/route-000001: status.parents[0].conditions[0].observedGeneration: "
        "must be an integer, not a string ('one'); skipped",
        "HTTPRoute app-0000/route-000002: spec.hostnames[0]: must be a string, not a number (5); skipped"]
    # put right again (the status as it was): analysed again, nothing reported
    fixed = _route(m, "route-000001")
    fixed["status"]["parents"][0]["conditions"][0]["observedGeneration"] = 1
    m.event("MODIFIED", fixed)
    m.event("DELETED", _route(m, "route-000002"))
    m.stale = True
    m.reconcile()
    assert _skipped(m.analysis.warnings) == [] == _as_a_check_of_everything_says(m)
    assert len(m._checked.verdicts) == len(m.objects)  # a deleted or replaced copy's verdict goes with it


def test_a_full_analysis_checks_nothing_that_was_judged_as_it_came_in() -> None:
    m = _model()
    calls: list[object] = []
    key = (GATEWAY_GROUP, "HTTPRoute")
    real = shapes._CHECKERS[key]
    shapes._CHECKERS[key] = lambda v: calls.append(v) or real(v)
    try:
        route = _route(m, "route-000003")
        route["spec"]["hostnames"] = ["other.example.com"]
        m.event("MODIFIED", route)
        assert len(calls) == 1  # the new copy, as it came in
        m.stale = True
        m.reconcile()
        assert len(calls) == 1  # and not again
    finally:
        shapes._CHECKERS[key] = real
