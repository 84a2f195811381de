"""NginxProxy from a GatewayClass's parametersRef and a Gateway's infrastructure.parametersRef:
resolved, merged field by field (the Gateway's wins), checked; a reference that does not resolve
or an NginxProxy that cannot be read makes the GatewayClass or Gateway not accepted, reason
InvalidParameters, with a message naming the reference and the field."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.engine.model import Obj, build_index
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway import nginxproxy
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, gateway_facts

GW = "gateway.networking.k8s.io/v1"
NP = "gateway.nginx.org/v1alpha2"


def _np(name: str, spec: dict[str, Any], namespace: str = "infra") -> dict[str, Any]:
    return {"apiVersion": NP, "kind": "NginxProxy", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _world(class_ref: dict[str, Any] | None, gw_ref: dict[str, Any] | None, *proxies: dict[str, Any]) -> list[dict[str, Any]]:
    gc_spec: dict[str, Any] = {"controllerName": GATEWAY_CONTROLLER}
    if class_ref is not None:
        gc_spec["parametersRef"] = class_ref
    gw_spec: dict[str, Any] = {"gatewayClassName": "nginx", "listeners": [{"name": "http", "port": 18080, "protocol": "HTTP"}]}
    if gw_ref is not None:
        gw_spec["infrastructure"] = {"parametersRef": gw_ref}
    return [{"apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": "nginx"}, "spec": gc_spec},
            {"apiVersion": GW, "kind": "Gateway", "metadata": {"name": "cafe", "namespace": "infra"}, "spec": gw_spec},
            *proxies]


def _verdicts(objs: list[dict[str, Any]]) -> tuple[Any, Any]:
    facts = gateway_facts(build_index(objs))
    return (facts.classes[Ref(GATEWAY_GROUP, "GatewayClass", None, "nginx")],
            facts.gateways[Ref(GATEWAY_GROUP, "Gateway", "infra", "cafe")].accepted)


CLASS_REF = {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "proxy", "namespace": "infra"}
GW_REF = {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "own"}
EXPORTER = {"telemetry": {"exporter": {"endpoint": "otel-collector.tracing.svc:4317", "interval": "2s", "batchSize": 32},
                          "serviceName": "my-app", "spanAttributes": [{"key": "k", "value": "class"}]}}


def test_a_class_naming_an_nginxproxy_that_resolves_is_accepted_and_says_what_it_does_not_honour():
    gc, gw = _verdicts(_world(CLASS_REF, None, _np("proxy", {**EXPORTER, "workerConnections": 2048, "ipFamily": "ipv4"})))
    assert gc.status and gc.reason == "Accepted" and gw.status
    assert "NginxProxy in use" in gc.message and "workerConnections" in gc.message
    assert "ipFamily" not in gc.message  # honoured (test_gateway_ip_family.py)


def test_a_class_reference_without_a_namespace_names_the_nginxproxy_in_default():
    ref = {k: v for k, v in CLASS_REF.items() if k != "namespace"}
    gc, gw = _verdicts(_world(ref, None, _np("proxy", EXPORTER, namespace="default")))
    assert (gc.status, gc.reason) == (True, "Accepted") and "NginxProxy in use" in gc.message and gw.status


def test_a_gateways_exporter_without_an_endpoint_keeps_the_classes_endpoint():
    own = _np("own", {"telemetry": {"exporter": {"batchSize": 50, "batchCount": 5}, "serviceName": "my-app"}})
    objs = _world(CLASS_REF, GW_REF, _np("proxy", EXPORTER), own)
    gc, gw = _verdicts(objs)
    assert gc.status and gw.status, gw
    index = build_index(objs)
    cafe = index.get(Ref(GATEWAY_GROUP, "Gateway", "infra", "cafe"))
    exp = nginxproxy.exporter(nginxproxy.effective(cafe, index), cafe)
    assert exp is not None and exp.endpoint == "otel-collector.tracing.svc:4317"
    assert (exp.batch_size, exp.batch_count, exp.service_name) == (50, 5, "gwpolicy:infra:cafe:my-app")


def test_a_class_reference_that_does_not_resolve_is_invalid_parameters_and_its_gateways_pending():
    cases = {
        "not found": _world(CLASS_REF, None),
        "NginxProxy.gateway.nginx.org only": _world({**CLASS_REF, "kind": "ConfigMap", "group": ""}, None),
        # without a namespace the reference names one in `default`, not the one in `infra`
        "default/proxy: not found": _world({k: v for k, v in CLASS_REF.items() if k != "namespace"}, None,
                                           _np("proxy", {})),
        "spec.telemetry.exporter.endpoint": _world(CLASS_REF, None, _np("proxy", {"telemetry": {"exporter": {
            "endpoint": "collector:4317; return 200"}}})),
    }
    for why, objs in cases.items():
        gc, gw = _verdicts(objs)
        assert (gc.status, gc.reason) == (False, "InvalidParameters") and why in gc.message, (why, gc)
        assert "spec.parametersRef" in gc.message
        assert (gw.status, gw.reason) == (False, "Pending")


def test_a_gateway_reference_that_does_not_resolve_rejects_the_gateway_with_invalid_parameters():
    gc, gw = _verdicts(_world(CLASS_REF, GW_REF, _np("proxy", EXPORTER)))
    assert gc.status
    assert (gw.status, gw.reason) == (False, "InvalidParameters")
    assert "spec.infrastructure.parametersRef" in gw.message and "infra/own: not found" in gw.message
    gc, gw = _verdicts(_world(None, GW_REF, _np("own", {"logging": {"errorLevel": "loud"}})))
    assert (gw.status, gw.reason) == (False, "InvalidParameters") and "spec.logging.errorLevel" in gw.message


def test_the_gateways_nginxproxy_overrides_the_classes_field_by_field():
    objs = _world(CLASS_REF, GW_REF, _np("proxy", EXPORTER),
                  _np("own", {"telemetry": {"exporter": {"endpoint": "other:4317"}, "serviceName": "gw"}}))
    index = build_index(objs)
    gw = index.get(Ref(GATEWAY_GROUP, "Gateway", "infra", "cafe"))
    assert isinstance(gw, Obj)
    exp = nginxproxy.exporter(nginxproxy.effective(gw, index), gw)
    assert exp == nginxproxy.Exporter(endpoint="other:4317", interval_s=2.0, batch_size=32, batch_count=4,
                                      service_name="gwpolicy:infra:cafe:gw", attributes=(("k", "class"),))
    assert _verdicts(objs)[1].status


def test_without_an_endpoint_or_with_tracing_disabled_there_is_no_exporter():
    assert nginxproxy.exporter({}) is None
    assert nginxproxy.exporter({"telemetry": {"serviceName": "x"}}) is None
    assert nginxproxy.exporter({"telemetry": {**EXPORTER["telemetry"], "disabledFeatures": ["DisableTracing"]}}) is None


_leaf = st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2))
_tree = st.recursive(_leaf, lambda kids: st.dictionaries(st.sampled_from("abc"), kids, max_size=3), max_leaves=8)


def _leaves(d: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if not isinstance(d, dict) or not d:
        return {prefix: d}
    out: dict[tuple[str, ...], Any] = {}
    for k, v in d.items():
        out.update(_leaves(v, prefix + (k,)))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from("abc"), _tree, max_size=3), st.dictionaries(st.sampled_from("abc"), _tree, max_size=3))
def test_merge_keeps_every_leaf_of_the_gateway_and_the_classes_where_the_gateway_sets_nothing(base, over):
    merged = _leaves(nginxproxy.merge(base, over))
    for path, v in _leaves(over).items():
        if path and v != {}:  # an empty object sets nothing
            assert merged[path] == v
    for path, v in _leaves(base).items():
        # a class leaf stays unless the Gateway sets that field or one above or below it
        if path and not any(path[:i] in _leaves(over) or any(p[:len(path)] == path for p in _leaves(over))
                            for i in range(1, len(path) + 1)):
            assert merged[path] == v
