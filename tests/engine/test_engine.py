"""Engine rules the shared scenarios touch lightly or not at all, each with the rule it checks."""

from __future__ import annotations

from build import GW, gateway, gatewayclass, meta, namespace, parent, policy, policykind, route, service, target
from gwpolicy.analysis import analyse
from gwpolicy.refs import Ref
from gwpolicy.topology import hostnames_intersect

NOW = "2026-01-01T00:00:00Z"


def effective(objs, target_text: str, kind: str) -> list[dict]:
    a = analyse(objs, now=NOW)
    return [(ep.path, ep.result.spec, {s["field"]: (s["stanza"], s["policy"] and s["policy"]["name"]) for s in ep.result.sources})
            for ep in a.effective if str(ep.target) == target_text and ep.kind.kind == kind]


def outcome(objs, policy_name: str) -> list[tuple[str, str]]:
    a = analyse(objs, now=NOW)
    for ref, outs in a.outcomes.items():
        if ref.name == policy_name:
            return [(o.reason, o.message) for o in outs]
    raise AssertionError(f"no policy {policy_name}")


def test_hostname_intersection_follows_gateway_api():
    assert hostnames_intersect(None, ["a.example.com"])
    assert hostnames_intersect("*.example.com", [])
    assert hostnames_intersect("*.example.com", ["a.example.com"])
    assert hostnames_intersect("*.example.com", ["a.b.example.com"])
    assert not hostnames_intersect("*.example.com", ["example.com"])
    assert hostnames_intersect("a.example.com", ["*.example.com"])
    assert not hostnames_intersect("a.example.com", ["b.example.com"])
    assert hostnames_intersect("*.example.com", ["*.a.example.com"])


def test_path_places_each_namespace_above_its_highest_object():
    # S4.2: the contract's own example
    objs = [gatewayclass("c"), gateway("g", "a", {"name": "l", "port": 80, "protocol": "HTTP",
                                                   "allowedRoutes": {"namespaces": {"from": "All"}}}, cls="c"),
            route("r", "b", [parent("g", "a")], [{"backendRefs": [{"name": "s", "port": 80}]}]),
            service("s", "b", ("http", 80)),
            policy("RetryPolicy", "p", "b", target("Service", "s"), defaults={"x": 1})]
    (path, spec, _), = effective(objs, "Service/b/s", "RetryPolicy")
    assert " > ".join(map(str, path)) == ("GatewayClass/c > Namespace/a > Gateway/a/g > Gateway/a/g#l > "
                                          "Namespace/b > HTTPRoute/b/r > Service/b/s")
    ports = effective(objs, "Service/b/s#http", "RetryPolicy")
    assert [str(p[0][-1]) for p in ports] == ["Service/b/s#http"]
    assert spec == {"x": 1}


def test_allowed_routes_selector_and_kinds_and_hostnames():
    listeners = [
        {"name": "sel", "port": 80, "protocol": "HTTP",
         "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchExpressions": [
             {"key": "team", "operator": "In", "values": ["blue"]}]}}}},
        {"name": "grpc-only", "port": 81, "protocol": "HTTP",
         "allowedRoutes": {"namespaces": {"from": "All"}, "kinds": [{"kind": "GRPCRoute"}]}},
        {"name": "tls", "port": 443, "protocol": "TLS", "allowedRoutes": {"namespaces": {"from": "All"}}},
        {"name": "host", "port": 82, "protocol": "HTTP", "hostname": "*.example.com",
         "allowedRoutes": {"namespaces": {"from": "All"}}},
    ]
    objs = [gatewayclass(), namespace("blue", team="blue"), namespace("red", team="red"),
            gateway("gw", "infra", *listeners),
            route("b", "blue", [parent("gw", "infra")], hostnames=["b.example.com"]),
            route("r", "red", [parent("gw", "infra")], hostnames=["r.other.org"]),
            policy("RetryPolicy", "p", "infra", target("Gateway", "gw"), defaults={"x": 1})]
    blue = {str(p[0][3]) for p in effective(objs, "HTTPRoute/blue/b", "RetryPolicy")}
    red = {str(p[0][3]) for p in effective(objs, "HTTPRoute/red/r", "RetryPolicy")}
    assert blue == {"Gateway/infra/gw#sel", "Gateway/infra/gw#host"}
    assert red == set()  # not selected, wrong kind, TLS takes no HTTPRoute, hostname does not intersect


def test_parentref_section_and_port_select_listeners():
    objs = [gatewayclass(), gateway("gw", "ns", {"name": "a", "port": 80, "protocol": "HTTP"},
                                    {"name": "b", "port": 81, "protocol": "HTTP"}),
            route("by-section", "ns", [parent("gw", sectionName="b")]),
            route("by-port", "ns", [parent("gw", port=80)]),
            policy("RetryPolicy", "p", "ns", target("Gateway", "gw"), defaults={"x": 1})]
    assert [str(p[0][3]) for p in effective(objs, "HTTPRoute/ns/by-section", "RetryPolicy")] == ["Gateway/ns/gw#b"]
    assert [str(p[0][3]) for p in effective(objs, "HTTPRoute/ns/by-port", "RetryPolicy")] == ["Gateway/ns/gw#a"]


def test_cross_namespace_backend_needs_a_reference_grant():
    base = [gatewayclass(), gateway("gw", "app"),
            route("r", "app", [parent("gw")], [{"backendRefs": [{"name": "db", "namespace": "data", "port": 5432}]}]),
            service("db", "data", ("pg", 5432)),
            policy("RetryPolicy", "p", "app", target("Gateway", "gw"), overrides={"x": 1})]
    assert [str(p[0][0]) for p in effective(base, "Service/data/db", "RetryPolicy")] == []
    grant = {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta("g", "data"),
             "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": "app"}], "to": [{"group": "", "kind": "Service"}]}}
    (path, spec, _), = effective(base + [grant], "Service/data/db", "RetryPolicy")
    assert spec == {"x": 1} and str(path[2]) == "Gateway/app/gw"


def test_overlapping_leaves_follow_precedence_not_last_writer():
    # S5.1: a leaf is skipped only when a higher-ranked leaf overlaps it
    objs = [gatewayclass(), gateway("gw", "ns"), route("r", "ns", [parent("gw")]),
            policy("XPolicy", "route", "ns", target("HTTPRoute", "r"), defaults={"a": {"b": 1}}),
            policy("XPolicy", "gw", "ns", target("Gateway", "gw"), defaults={"a": 5}),
            policy("XPolicy", "ns", "ns", target("Namespace", "ns"), defaults={"a": {"c": 2}})]
    (_, spec, sources), = effective(objs, "HTTPRoute/ns/r", "XPolicy")
    assert spec == {"a": {"b": 1, "c": 2}}
    assert sources == {"a.b": ("defaults", "route"), "a.c": ("defaults", "ns")}


def test_overlapping_leaves_on_one_target_conflict():
    objs = [gatewayclass(), gateway("gw", "ns"),
            policy("XPolicy", "old", "ns", target("Gateway", "gw"), ts="2024-01-01T00:00:01Z", defaults={"w": {"size": 1}}),
            policy("XPolicy", "new", "ns", target("Gateway", "gw"), ts="2024-01-01T00:00:02Z", defaults={"w": 3})]
    assert outcome(objs, "new")[0][0] == "Conflicted"
    assert "XPolicy ns/old" in outcome(objs, "new")[0][1]
    assert outcome(objs, "old")[0][0] == "Accepted"


def test_a_rejected_policy_rejects_nobody():
    # S5.4: oldest first; c is checked only against the accepted a, not against the rejected b
    objs = [gatewayclass(), gateway("gw", "ns"),
            policy("XPolicy", "a", "ns", target("Gateway", "gw"), ts="2024-01-01T00:00:01Z", defaults={"x": 1}),
            policy("XPolicy", "b", "ns", target("Gateway", "gw"), ts="2024-01-01T00:00:02Z", defaults={"x": 2, "y": 2}),
            policy("XPolicy", "c", "ns", target("Gateway", "gw"), ts="2024-01-01T00:00:03Z", defaults={"y": 3})]
    assert [outcome(objs, n)[0][0] for n in "abc"] == ["Accepted", "Conflicted", "Accepted"]
    (_, spec, _), = effective(objs, "Gateway/ns/gw", "XPolicy")
    assert spec == {"x": 1, "y": 3}


def test_list_map_from_crd_schema_merges_item_by_item():
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "headerpolicies.example.io"},
           "spec": {"group": "example.io", "scope": "Namespaced",
                    "names": {"kind": "HeaderPolicy", "plural": "headerpolicies"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "defaults": {"type": "object", "properties": {"headers": {
                                "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                "items": {"type": "object"}}}}}}}}}}]}}
    objs = [crd, gatewayclass(), gateway("gw", "ns"), route("r", "ns", [parent("gw")]),
            policy("HeaderPolicy", "gw", "ns", target("Gateway", "gw"),
                   defaults={"headers": [{"name": "z", "value": "1"}, {"name": "a", "value": "gw"}]}),
            policy("HeaderPolicy", "r", "ns", target("HTTPRoute", "r"), defaults={"headers": [{"name": "a", "value": "route"}]})]
    (_, spec, sources), = effective(objs, "HTTPRoute/ns/r", "HeaderPolicy")
    assert spec == {"headers": [{"name": "a", "value": "route"}, {"name": "z", "value": "1"}]}
    assert sources == {"headers[name=a]": ("defaults", "r"), "headers[name=z]": ("defaults", "gw")}


def test_patch_null_travels_down_the_chain():
    # S6.0: a challenger's null deletes a key the most established policy set, even across a level
    objs = [policykind("ColorPolicy", mergeStrategy="Patch"), gatewayclass(), gateway("gw", "ns"),
            route("r", "ns", [parent("gw")]),
            policy("ColorPolicy", "ns", "ns", target("Namespace", "ns"), defaults={"walls": "green", "trim": {"a": 1}}),
            policy("ColorPolicy", "gw", "ns", target("Gateway", "gw"), defaults={"roof": "red"}),
            policy("ColorPolicy", "r", "ns", target("HTTPRoute", "r"), defaults={"walls": None, "trim": {"a": None}})]
    (_, spec, sources), = effective(objs, "HTTPRoute/ns/r", "ColorPolicy")
    assert spec == {"roof": "red", "trim": {}}
    assert sources == {"roof": ("defaults", "gw")}


def test_policy_with_both_stanzas_is_invalid_under_atomic():
    objs = [policykind("ColorPolicy", mergeStrategy="Atomic"), gatewayclass(), gateway("gw", "ns"),
            policy("ColorPolicy", "both", "ns", target("Gateway", "gw"), defaults={"a": 1}, overrides={"b": 1})]
    (reason, message), = outcome(objs, "both")
    assert reason == "Invalid" and "allows one stanza" in message


def test_direct_kind_with_a_stanza_is_invalid_and_stanza_spelled_twice_is_invalid():
    objs = [policykind("DPolicy", attachment="Direct"), gatewayclass(), gateway("gw", "ns"),
            policy("DPolicy", "d", "ns", target("Gateway", "gw"), defaults={"a": 1}),
            policy("RetryPolicy", "twice", "ns", target("Gateway", "gw"), default={"a": 1}, defaults={"a": 2})]
    assert outcome(objs, "d")[0][0] == "Invalid"
    assert outcome(objs, "twice")[0][0] == "Invalid"


def test_scope_is_checked_before_existence():
    # S3.7: a policy in another namespace learns nothing about whether the target exists
    objs = [gatewayclass(), gateway("gw", "app"),
            policy("RetryPolicy", "probe", "other", target("Gateway", "nothing-here", "app"), defaults={"a": 1}),
            policy("RetryPolicy", "ns", "other", target("Namespace", "app"), defaults={"a": 1}),
            policy("RetryPolicy", "cluster", None, target("Gateway", "gw"), defaults={"a": 1})]
    assert outcome(objs, "probe")[0][0] == "Invalid"
    assert "may target only its own Namespace" in outcome(objs, "ns")[0][1]
    assert "must name its namespace" in outcome(objs, "cluster")[0][1]


def test_target_kinds_restrict_targets():
    objs = [policykind("SvcPolicy", targetKinds=[{"group": "", "kind": "Service"}]), gatewayclass(), gateway("gw", "ns"),
            policy("SvcPolicy", "p", "ns", target("Gateway", "gw"), defaults={"a": 1})]
    (reason, message), = outcome(objs, "p")
    assert reason == "Invalid" and "cannot target Gateway" in message


def test_virtual_backend_kind_resolves_through_a_backend_ref():
    objs = [gatewayclass(), gateway("gw", "ns"),
            route("r", "ns", [parent("gw")], [{"backendRefs": [{"group": "x.io", "kind": "ExternalService", "name": "ext"}]}]),
            policy("RetryPolicy", "p", "ns", {"group": "x.io", "kind": "ExternalService", "name": "ext"}, defaults={"a": 1}),
            policy("RetryPolicy", "missing", "ns", target("Service", "ext"), defaults={"a": 1})]
    assert outcome(objs, "p")[0][0] == "Accepted"
    assert outcome(objs, "missing")[0][0] == "TargetNotFound"
    a = analyse(objs, now=NOW)
    assert not any(ch.object.kind == "ExternalService" for ch in a.status_changes())  # no breadcrumbs on virtual objects


def test_status_keeps_other_controllers_and_transition_time():
    other = {"ancestorRef": {"group": GW, "kind": "Gateway", "namespace": "ns", "name": "gw"},
             "controllerName": "someone.else/controller",
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "theirs",
                             "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    ours = {"ancestorRef": {"group": GW, "kind": "Gateway", "namespace": "ns", "name": "gw"},
            "controllerName": "gwpolicy.io/policy-controller",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "old words",
                            "lastTransitionTime": "2021-01-01T00:00:00Z"}]}
    p = policy("RetryPolicy", "p", "ns", target("Gateway", "gw"), defaults={"a": 1})
    p["status"] = {"ancestors": [other, ours]}
    a = analyse([gatewayclass(), gateway("gw", "ns"), p], now=NOW)
    change = next(ch for ch in a.status_changes() if ch.object.name == "p")
    assert change.status["ancestors"][0] == other
    cond = change.status["ancestors"][1]["conditions"][0]
    assert cond["lastTransitionTime"] == "2021-01-01T00:00:00Z"  # same status: time kept
    p["spec"]["targetRef"]["name"] = "gone"
    a = analyse([gatewayclass(), gateway("gw", "ns"), p], now=NOW)
    change = next(ch for ch in a.status_changes() if ch.object.name == "p")
    assert [e["ancestorRef"]["name"] for e in change.status["ancestors"]] == ["gw", "gone"]  # our stale entry is gone
    assert change.status["ancestors"][1]["conditions"][0]["lastTransitionTime"] == NOW


def test_at_most_16_ancestors_ours_cut_first():
    others = [{"ancestorRef": {"group": GW, "kind": "Gateway", "namespace": "ns", "name": f"o{i}"},
               "controllerName": "else/c", "conditions": []} for i in range(10)]
    objs = [gatewayclass()] + [gateway(f"g{i:02}", "ns") for i in range(16)]
    p = policy("RetryPolicy", "p", "ns", [target("Gateway", f"g{i:02}") for i in range(16)], defaults={"a": 1})
    p["status"] = {"ancestors": others}
    a = analyse(objs + [p], now=NOW)
    anc = next(ch for ch in a.status_changes() if ch.object.name == "p").status["ancestors"]
    assert len(anc) == 16 and anc[:10] == others
    assert [e["ancestorRef"]["name"] for e in anc[10:]] == [f"g{i:02}" for i in range(6)]


def test_breadcrumb_is_removed_when_an_object_stops_being_affected():
    svc = service("s", "ns", ("http", 80))
    svc["metadata"]["annotations"] = {"gwpolicy.io/PolicyAffected": "true", "keep": "me"}
    gw = gateway("gw", "ns")
    gw["status"] = {"conditions": [{"type": "gwpolicy.io/RetryPolicyAffected", "status": "True"},
                                   {"type": "Programmed", "status": "True"}]}
    a = analyse([gatewayclass(), gw, svc], now=NOW)
    changes = {ch.object.name: ch for ch in a.status_changes()}
    assert changes["s"].annotations == {"keep": "me"}
    assert changes["gw"].status["conditions"] == [{"type": "Programmed", "status": "True"}]


def test_no_target_reports_on_own_namespace():
    p = policy("RetryPolicy", "p", "ns", [], defaults={"a": 1})
    a = analyse([p], now=NOW)
    (ch,) = [c for c in a.status_changes() if c.object.name == "p"]
    assert ch.status["ancestors"][0]["ancestorRef"] == {"group": "", "kind": "Namespace", "name": "ns"}
    assert ch.status["ancestors"][0]["conditions"][0]["reason"] == "Invalid"


def test_fieldmapping_object_value_sits_between_overrides_and_defaults():
    pk = policykind("TPolicy", fieldMappings=[{"setting": "request", "targetKind": {"group": GW, "kind": "HTTPRoute"},
                                              "field": "spec.timeouts.request"}])
    r = route("r", "ns", [parent("gw")], [{"name": "api"}], timeouts={"request": "9s"})
    objs = [pk, gatewayclass(), gateway("gw", "ns"), r,
            policy("TPolicy", "d", "ns", target("Gateway", "gw"), defaults={"request": "1s", "idle": "2s"})]
    (_, spec, sources), = effective(objs, "HTTPRoute/ns/r", "TPolicy")
    assert spec == {"request": "9s", "idle": "2s"} and sources["request"] == ("object", None)
    (_, spec, _), = effective(objs, "HTTPRoute/ns/r#api", "TPolicy")  # a section: its owner's value
    assert spec["request"] == "9s"
    objs.append(policy("TPolicy", "o", "ns", target("Gateway", "gw"), overrides={"request": "3s"}))
    (_, spec, _), = effective(objs, "HTTPRoute/ns/r", "TPolicy")
    assert spec["request"] == "3s"


def test_ref_printing():
    assert str(Ref(GW, "Gateway", "ns", "gw", "http")) == "Gateway/ns/gw#http"
    assert str(Ref("", "Namespace", None, "ns")) == "Namespace/ns"
