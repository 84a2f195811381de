"""What the controller keeps of an object (controller/store.py) changes nothing it computes or writes:
the analysis of the kept forms equals that of the whole objects, and every status write (the merge
patch and our annotation) is the same."""

from __future__ import annotations

import copy
import sys
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import GW, cluster
from gwpolicy.controller import model as model_module
from gwpolicy.controller.informer import seen, tombstone
from gwpolicy.controller.kube import Kind, merge_patch_of
from gwpolicy.controller.model import ClusterModel
from gwpolicy.controller.store import kept, shared
from gwpolicy.output import effective_list, encode
from gwpolicy.refs import Ref
from gwpolicy.status import ANNOTATION, DEFAULT_CONTROLLER
from helpers import NOW

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
CONDITION = {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "fine",
             "lastTransitionTime": "2024-01-01T00:00:00Z", "observedGeneration": 1}


def _crd_for_field_policy() -> dict[str, Any]:
    """A labelled CRD whose schema is full of descriptions, one of them a property named `description`."""
    def described(schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": "words " * 40, **schema}

    settings_schema = described({"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {
        "description": described({"type": "string"}),
        "window": described({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                             "items": described({"type": "object", "properties": {"name": {"type": "string"}}})}),
    }})
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "fieldpolicies.example.io", "labels": {"gateway.networking.k8s.io/policy": "inherited"}},
            "spec": {"group": "example.io", "scope": "Namespaced", "names": {"kind": "FieldPolicy", "plural": "fieldpolicies"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": described({"type": "object", "properties": {
                                       "spec": described({"type": "object", "properties": {
                                           "targetRefs": {"type": "array", "items": {"type": "object"}},
                                           "defaults": settings_schema, "overrides": settings_schema}}),
                                       "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}})}}]}}


@st.composite
def served(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A cluster as an API server hands it out after a while: bookkeeping, other writers' status
    (and some of ours), annotations of kubectl and of users, fields the engine never reads."""
    objs = copy.deepcopy(draw(cluster()))
    if draw(st.booleans()):
        objs.append(_crd_for_field_policy())
    if draw(st.booleans()):  # settings mapped onto a route's own fields, one through an annotation
        objs.append({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": {"name": "fieldpolicy"},
                     "spec": {"group": "example.io", "kind": "FieldPolicy", "fieldMappings": [
                         {"setting": "timeout", "field": "spec.timeouts.request",
                          "targetKind": {"group": GW, "kind": "HTTPRoute"}},
                         {"setting": "retries", "field": "metadata.annotations.retries",
                          "targetKind": {"group": GW, "kind": "HTTPRoute"}}]}})
    for i, o in enumerate(objs):
        meta = o["metadata"]
        meta["uid"] = f"uid-{i}"
        meta["resourceVersion"] = str(100 + i)
        meta["managedFields"] = [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]
        ann = {}
        if draw(st.booleans()):
            ann[LAST_APPLIED] = orjson.dumps(o).decode()
        if draw(st.booleans()):
            ann[ANNOTATION] = "true"  # a breadcrumb of ours, right or stale
        if draw(st.booleans()):
            ann["retries"] = draw(st.sampled_from(["1", "2"]))
        if ann:
            meta["annotations"] = ann
        kind = o["kind"]
        if kind == "HTTPRoute":
            if draw(st.booleans()):
                o["spec"]["timeouts"] = {"request": draw(st.sampled_from(["1s", "9s"]))}
            o["spec"]["rules"][0]["matches"] = [{"path": {"type": "PathPrefix", "value": "/x"}}]
            parents = [{"parentRef": dict(p), "controllerName": draw(st.sampled_from(["other.io/gw", DEFAULT_CONTROLLER])),
                        "conditions": [dict(CONDITION, type=draw(st.sampled_from(["Accepted", "gwpolicy.io/FieldPolicyAffected"])))]}
                       for p in o["spec"].get("parentRefs") or [] if draw(st.booleans())]
            o["status"] = {"parents": parents}
        elif kind in ("Gateway", "GatewayClass"):
            o["status"] = {"conditions": [dict(CONDITION, type=t) for t in
                                          draw(st.lists(st.sampled_from(["Accepted", "Programmed", "gwpolicy.io/FieldPolicyAffected"]),
                                                        unique=True))],
                           "listeners": [{"name": "http", "attachedRoutes": 1, "conditions": [CONDITION]}],
                           "addresses": [{"type": "IPAddress", "value": "10.0.0.1"}]}
        elif kind == "Service":
            o["spec"].update({"clusterIP": f"10.1.0.{i}", "selector": {"app": o["metadata"]["name"]}, "type": "ClusterIP"})
            o["status"] = {"loadBalancer": {}, "conditions": [CONDITION]}
        elif kind == "Namespace":
            o["spec"] = {"finalizers": ["kubernetes"]}
            o["status"] = {"phase": "Active"}
        elif kind.endswith("Policy") and draw(st.booleans()):
            o["status"] = {"ancestors": [{"ancestorRef": {"group": GW, "kind": "Gateway", "name": "gw0", "namespace": "a"},
                                          "controllerName": draw(st.sampled_from(["other.io/gw", DEFAULT_CONTROLLER])),
                                          "conditions": [CONDITION]}],
                           "somethingElse": {"x": 1}}
    return objs


def _writes(objects: list[dict[str, Any]], keep: Any = None) -> tuple[Any, dict[Ref, Any]]:
    """What the controller computes and writes from these objects: its analysis and, per object it
    would write, the status merge patch (None: no status write) and our annotation. With `keep`, the
    model keeps objects that way instead of `store.kept` (the identity: as it kept them before)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, "utc_now", lambda: NOW)
        if keep is not None:
            mp.setattr(model_module, "kept", keep)
            mp.setattr(model_module, "share_unchanged", lambda old, new: None)
        m = ClusterModel(DEFAULT_CONTROLLER)
        for o in objects:
            m.event("ADDED", copy.deepcopy(o))
        refs = m.reconcile()
        out = {}
        for ref in refs:
            want = m.desired(ref)
            if want is None:  # the controller writes nothing to it
                out[ref] = None
                continue
            status, annotations = want
            have = m.current(ref).get("status") or {}
            out[ref] = (merge_patch_of(have, status) if status != have else None, annotations.get(ANNOTATION))
        return m.analysis, out


def _affected(a: Any) -> dict[Ref, Any]:
    return {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds.items()} for o, kinds in a.affected.items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(served())
def test_the_kept_forms_give_the_same_analysis_and_the_same_writes(objs: list[dict[str, Any]]) -> None:
    whole, whole_writes = _writes(objs, keep=lambda raw: raw)
    compact, compact_writes = _writes(objs)
    assert encode(effective_list(compact), "json") == encode(effective_list(whole), "json")
    assert _affected(compact) == _affected(whole)
    assert {r: [(o.declared, o.reason, o.message) for o in outs] for r, outs in compact.outcomes.items()} == \
        {r: [(o.declared, o.reason, o.message) for o in outs] for r, outs in whole.outcomes.items()}
    assert compact_writes == whole_writes


def test_what_is_not_read_is_not_kept() -> None:
    crd = _crd_for_field_policy()
    crd["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    crd["metadata"]["annotations"] = {LAST_APPLIED: orjson.dumps(crd).decode(), "note": "kept", ANNOTATION: "true"}
    crd["status"] = {"acceptedNames": {"kind": "FieldPolicy"}}
    k = kept(crd)
    assert "managedFields" not in k["metadata"]
    assert k["metadata"]["annotations"] == {"note": "kept", ANNOTATION: "true"}
    assert "status" not in k
    schema = k["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "description" not in schema and "description" not in schema["properties"]["spec"]
    settings_schema = schema["properties"]["spec"]["properties"]["defaults"]
    assert settings_schema["properties"]["description"] == {"type": "string"}  # a field named description stays
    assert settings_schema["properties"]["window"]["x-kubernetes-list-map-keys"] == ["name"]
    assert len(orjson.dumps(k)) < len(orjson.dumps(crd)) / 4
    gw = {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": {"name": "g", "namespace": "a"},
          "spec": {"listeners": [{"name": "http", "port": 80}]},
          "status": {"conditions": [CONDITION], "listeners": [{"name": "http"}], "addresses": []}}
    assert kept(gw) == {**gw, "status": {"conditions": [CONDITION]}}
    assert kept(gw)["spec"] is not gw["spec"]  # a copy: the informer's object is not changed


def test_equal_status_values_are_held_once_and_strings_interned() -> None:
    a = kept({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a"},
              "status": {"parents": [{"parentRef": {"name": "g"}, "conditions": [dict(CONDITION)]},
                                     {"parentRef": {"name": "h"}, "conditions": [dict(CONDITION)]}]}})
    b = kept({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "s", "namespace": "a"},
              "status": {"parents": [{"parentRef": {"name": "g"}, "conditions": [dict(CONDITION, observedGeneration=True)]}]}})
    p, q = a["status"]["parents"]
    assert p["conditions"] is q["conditions"]
    assert b["status"]["parents"][0]["parentRef"] is p["parentRef"]
    assert b["status"]["parents"][0]["conditions"][0]["observedGeneration"] is True  # True is not 1
    assert b["status"]["parents"][0]["conditions"] is not p["conditions"]
    made = [kept({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "".join(["te", "am"])}})
            for _ in range(2)]
    assert made[0]["metadata"]["namespace"] is made[1]["metadata"]["namespace"] is sys.intern("team")


def test_a_full_table_of_shared_values_starts_again() -> None:
    limit = shared.limit
    shared.limit = 4
    try:
        kept_lists = [shared([str(i)]) for i in range(10)]
        assert len(shared.lists) <= 4
        assert shared(["9"]) is kept_lists[9]
    finally:
        shared.limit = limit


def test_the_informer_remembers_a_version_and_a_digest_not_the_object() -> None:
    o = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "a", "resourceVersion": "7"},
         "spec": {"ports": [{"port": 80}]}}
    rv, digest = seen(o)
    assert rv == "7"
    assert seen(copy.deepcopy(o)) == (rv, digest)
    changed = copy.deepcopy(o)
    changed["spec"]["ports"][0]["port"] = 81
    assert seen(changed) != (rv, digest)
    svc = Kind("", "v1", "Service", "services", True)
    assert tombstone(svc, ("a", "s"), "7") == {"apiVersion": "v1", "kind": "Service",
                                               "metadata": {"name": "s", "namespace": "a", "resourceVersion": "7"}}


def test_a_deletion_known_only_by_key_takes_the_object_out(monkeypatch) -> None:
    objs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
            {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "c"}, "spec": {"controllerName": "x/y"}}]
    m = ClusterModel(DEFAULT_CONTROLLER)
    for o in objs:
        m.event("ADDED", o)
    m.reconcile()
    m.event("DELETED", tombstone(Kind(GW, "v1", "GatewayClass", "gatewayclasses", False), ("", "c")))
    assert (GW, "GatewayClass", "", "c") not in m.objects
    m.reconcile()
    assert Ref(GW, "GatewayClass", None, "c") not in m.analysis.index.by_ref


def test_a_status_echo_shares_the_spec_the_analysis_holds() -> None:
    route = {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a", "resourceVersion": "1"},
             "spec": {"parentRefs": [{"name": "g"}], "rules": [{"matches": [{"path": {"value": "/"}}]}]}}
    m = ClusterModel(DEFAULT_CONTROLLER)
    m.event("ADDED", copy.deepcopy(route))
    m.reconcile()
    held = m.analysis.index.by_ref[Ref(GW, "HTTPRoute", "a", "r")].raw
    echo = copy.deepcopy(route)
    echo["metadata"]["resourceVersion"] = "2"
    echo["status"] = {"parents": []}
    m.event("MODIFIED", echo)
    now = m.objects[(GW, "HTTPRoute", "a", "r")]
    assert now["status"] == {"parents": []} and now["metadata"]["resourceVersion"] == "2"
    assert now["spec"] is held["spec"]
    assert not m.stale


def test_a_version_already_held_is_taken_as_it_is(monkeypatch) -> None:
    """The echo of our own write (its answer already taken) or a relist brings a resourceVersion the
    model holds: one version is one content, so it is neither kept again nor compared; a new
    version is kept and its status checked again (no new analysis while the spec stays); an object
    without a resourceVersion is always compared."""
    route = {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a", "resourceVersion": "7"},
             "spec": {"parentRefs": [{"name": "g"}], "rules": [{"matches": [{"path": {"value": "/"}}]}]}}
    m = ClusterModel(DEFAULT_CONTROLLER)
    m.event("ADDED", copy.deepcopy(route))
    m.reconcile()
    held = m.objects[(GW, "HTTPRoute", "a", "r")]
    calls: list[Any] = []
    real = model_module.kept
    monkeypatch.setattr(model_module, "kept", lambda raw: calls.append(raw) or real(raw))
    m.event("MODIFIED", copy.deepcopy(route))  # the same version again
    assert calls == [] and m.objects[(GW, "HTTPRoute", "a", "r")] is held and not m.touched and not m.stale
    again = copy.deepcopy(route)
    again["metadata"]["resourceVersion"] = "8"  # an update that changed nothing but the version
    m.event("MODIFIED", again)
    assert len(calls) == 1 and m.touched == {Ref(GW, "HTTPRoute", "a", "r")} and not m.stale
    assert m.objects[(GW, "HTTPRoute", "a", "r")]["metadata"]["resourceVersion"] == "8"
    m.reconcile()
    echo = copy.deepcopy(again)
    echo["metadata"]["resourceVersion"] = "9"
    echo["status"] = {"parents": []}
    m.event("MODIFIED", echo)
    assert m.objects[(GW, "HTTPRoute", "a", "r")]["status"] == {"parents": []}
    assert m.touched == {Ref(GW, "HTTPRoute", "a", "r")} and not m.stale
    unversioned = copy.deepcopy(echo)
    del unversioned["metadata"]["resourceVersion"]
    unversioned["spec"]["parentRefs"] = [{"name": "other"}]
    m.event("MODIFIED", unversioned)
    assert m.objects[(GW, "HTTPRoute", "a", "r")]["spec"]["parentRefs"] == [{"name": "other"}]
    assert len(calls) == 3
