"""The webhook answers every kind the engine updates in place without a full analysis: the object
under review is applied with `inplace.apply.apply_change` (as the controller's and the gateway's
changes are), and a change to the cluster reaches the next answer through the model's in-place
update. What the answer says is what a full analysis would say."""

from __future__ import annotations

import copy

import pytest

from gwpolicy.controller.model import ClusterModel
from gwpolicy.engine.analysis import analyse
from gwpolicy.webhook import review as review_module
from gwpolicy.webhook.review import Options, Verdict, _verdict, ref_of_raw, review
from gwpolicy.webhook.server import Reviewer
from helpers import NOW
from test_controller_loop import running
from test_webhook import analysed, effective_items, find, parable_raws, request


@pytest.fixture(scope="module")
def raws():
    return parable_raws()


@pytest.fixture
def no_full_analysis(monkeypatch):
    """A review that analyses the cluster whole fails the test."""
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the review ran a full analysis")

    monkeypatch.setattr(review_module, "analyse", refuse)


def _payments_in_the_shop(raws):
    ns = copy.deepcopy(find(raws, "Namespace", None, "payments"))
    ns["metadata"]["labels"]["shop"] = "true"  # prod-web's http listener admits it now (from: Selector)
    return ns


def _cake_without_metrics(raws):
    svc = copy.deepcopy(find(raws, "Service", "baker", "cake"))
    svc["spec"]["ports"] = [p for p in svc["spec"]["ports"] if p["name"] != "metrics"]
    return svc


def _prod_web_with_an_admin_listener(raws):
    gw = copy.deepcopy(find(raws, "Gateway", "infra", "prod-web"))
    gw["spec"]["listeners"].append({"name": "admin", "port": 9000, "protocol": "HTTP",
                                    "allowedRoutes": {"namespaces": {"from": "All"}}})
    return gw


def _grant_to_payments(_raws):
    return {"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "from-baker", "namespace": "payments", "creationTimestamp": NOW},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "baker"}],
                     "to": [{"group": "", "kind": "Service"}]}}


EDITS = {"a Namespace's labels": _payments_in_the_shop, "a Service's ports": _cake_without_metrics,
         "a Gateway's listeners": _prod_web_with_an_admin_listener, "a new ReferenceGrant": _grant_to_payments}


def _full_verdict(raws, edited) -> Verdict:
    """What the review would answer from a whole analysis of the cluster with the edit applied."""
    ref = ref_of_raw(edited)
    others = [o for o in raws if ref_of_raw(o) != ref]
    return _verdict(analyse(copy.deepcopy([*others, edited]), default_namespace="default", now=NOW), ref, Options())


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_non_policy_edit_is_reviewed_in_place_with_the_answer_of_a_full_analysis(raws, what, no_full_analysis):
    edited = EDITS[what](raws)
    want = _full_verdict(raws, edited)
    a = analysed(raws)
    before = effective_items(a)
    old = next((o for o in raws if ref_of_raw(o) == ref_of_raw(edited)), None)
    verdict, broken = review(a, request("UPDATE" if old else "CREATE", edited, old), Options(), lambda: raws)
    assert not broken
    assert (verdict.allowed, verdict.warnings) == (want.allowed, want.warnings)
    assert effective_items(a) == before  # taken back out


def test_a_service_review_says_what_the_edit_changes(raws, no_full_analysis):
    """Without its metrics port the Service is no longer affected by the policy on that port."""
    a = analysed(raws)
    cake = find(raws, "Service", "baker", "cake")
    as_is, _ = review(a, request("UPDATE", copy.deepcopy(cake), cake), Options(), lambda: raws)
    edited, _ = review(a, request("UPDATE", _cake_without_metrics(raws), cake), Options(), lambda: raws)
    assert any("cake-metrics-health" in w for w in as_is.warnings), as_is.warnings
    assert edited.warnings and not any("cake-metrics-health" in w for w in edited.warnings), edited.warnings


def test_an_object_in_a_namespace_the_analysis_does_not_know_is_analysed_whole_and_leaves_the_model_as_it_was(raws):
    """apply_change declines a new namespace before changing anything: the review falls back to a whole
    analysis of a copy and does not make the webhook's model analyse everything again."""
    a = analysed(raws)
    before = effective_items(a)
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "brand-new"},
           "spec": {"ports": [{"name": "http", "port": 80}]}}
    verdict, broken = review(a, request("CREATE", svc), Options(), lambda: raws)
    assert verdict.allowed and not broken
    assert effective_items(a) == before


def _review_of(raw, old=None):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": request("UPDATE" if old is not None else "CREATE", copy.deepcopy(raw), old)}


def test_a_namespace_label_change_reaches_the_webhooks_next_answer_without_a_full_analysis(raws, no_full_analysis):
    """The webhook's model (the controller's, fed by informers) takes the Namespace's new labels in
    place; the next review of a route in that namespace says what the http listener now gives it."""
    model = ClusterModel("gwpolicy.io/controller")
    for o in copy.deepcopy(raws):
        model.event("ADDED", o)
    model.reconcile()
    woken: list[bool] = []
    reviewer = Reviewer(model, Options(), lambda: woken.append(True))
    route = find(raws, "HTTPRoute", "payments", "checkout")

    def web_timeouts() -> str:
        warnings = reviewer.answer(_review_of(route, route))["response"].get("warnings", [])
        return next(w for w in warnings if "TimeoutPolicy infra/web-timeouts" in w)

    assert "idle=" not in web_timeouts()
    model.event("MODIFIED", _payments_in_the_shop(raws))
    model.reconcile()  # what the webhook's loop runs after the event
    assert "idle=120s" in web_timeouts()
    assert model.reconciles == 1 and model.incremental_updates >= 1
    assert not model.stale and not woken


def test_the_webhooks_loop_takes_a_namespace_change_in_place_and_its_metrics_say_so(raws):
    """The webhook's own loop (kube/loop.py) on its model: one full analysis at the start, the
    Namespace's new labels as an in-place update, and /metrics counting both as the controller's do."""
    import asyncio

    from gwpolicy.controller.app import Options as ControllerOptions
    from gwpolicy.webhook.server import WebhookOptions, WebhookProcess

    async def go() -> None:
        hook = WebhookProcess(WebhookOptions(ControllerOptions(leader_election=False)))
        for o in copy.deepcopy(raws):
            hook.model.event("ADDED", o)

        async def settled() -> None:
            hook.wake.set()
            for _ in range(500):
                await asyncio.sleep(0.01)
                if not hook.wake.is_set() and not hook.busy and not hook.model.stale:
                    return
            raise AssertionError("the webhook's loop did not settle")

        def sample(name: str) -> float:
            return hook.metrics.registry.get_sample_value(name) or 0.0

        async with running(hook.reconcile_loop()):
            await settled()
            assert sample("gwpolicy_full_analyses_total") == 1 and sample("gwpolicy_reconcile_passes_total") == 1
            hook.model.event("MODIFIED", _payments_in_the_shop(raws))
            await settled()
            assert sample("gwpolicy_full_analyses_total") == 1
            assert sample("gwpolicy_incremental_updates_total") == 1 and sample("gwpolicy_reconcile_passes_total") == 2
        route = find(raws, "HTTPRoute", "payments", "checkout")
        warnings = hook.reviewer.answer(_review_of(route, route))["response"].get("warnings", [])
        assert any("TimeoutPolicy infra/web-timeouts" in w and "idle=120s" in w for w in warnings), warnings

    asyncio.run(go())


def test_the_webhook_benchmark_reviews_every_kind_in_place():
    """`gwpolicy bench webhook` on a small cluster: policy, route, Service and Namespace reviews, none
    analysed whole, the model left as it was."""
    from gwpolicy.bench.webhook import measure_webhook, webhook_table

    row = measure_webhook(30, reviews=5)
    for kind in ("policy", "route", "service", "namespace"):
        assert row[kind]["reviews"] >= 1 and row[kind]["full_analyses"] == 0, (kind, row[kind])
    assert not row["stale"]
    assert "| 30 |" in webhook_table([row])[-1] and "(0 of" in webhook_table([row])[-1]
    assert review_module.analyse is analyse  # the count taken back out of the module
