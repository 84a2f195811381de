"""`gwpolicy render -f` serves what the live gateway serves of Gateways whose GatewayClass is not
ours or not accepted: nothing, and it says why on stderr (kubectl-style `Warning:` lines). Before,
render served the Gateways of a GatewayClass of ours that status calls not Accepted (a
`parametersRef`, which this gateway does not take), and was silent about every Gateway it left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS
from gwpolicy.engine.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, dataplane_objects, gateway_facts
from gwpolicy.gateway.render import render
from helpers import run_cli, write_manifests

GW = "gateway.networking.k8s.io/v1"
CLASSES = {
    "ours": {"controllerName": GATEWAY_CONTROLLER},
    "params": {"controllerName": GATEWAY_CONTROLLER, "parametersRef": {"group": "example.com", "kind": "Params", "name": "p"}},
    "theirs": {"controllerName": "example.com/other-controller"},
}


def _gateway(name: str, class_name: str, port: int) -> dict[str, Any]:
    return {"apiVersion": GW, "kind": "Gateway", "metadata": {"name": name, "namespace": "infra", "generation": 1},
            "spec": {"gatewayClassName": class_name, "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}}


def _route(name: str, gateway: str) -> dict[str, Any]:
    return {"apiVersion": GW, "kind": "HTTPRoute", "metadata": {"name": name, "namespace": "infra", "generation": 1},
            "spec": {"parentRefs": [{"name": gateway}], "rules": [{"backendRefs": [{"name": "svc", "port": 80}]}]}}


def _objects(gateways: list[tuple[str, str]], classes: list[str]) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        {"apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": c}, "spec": CLASSES[c]} for c in classes]
    objs += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "infra"}},
             {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": "infra"},
              "spec": {"ports": [{"port": 80}]}}]
    for i, (name, class_name) in enumerate(gateways):
        objs += [_gateway(name, class_name, 18080 + i), _route(f"r-{name}", name)]
    return objs


def _rendered(objs: list[dict[str, Any]]) -> dict[str, bytes]:
    return render(build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS)))


def _live(objs: list[dict[str, Any]]) -> dict[str, bytes]:
    """What the live gateway builds: the data plane from status' view of the objects
    (`status.dataplane_objects`, gateway/state.py), so that it serves what status accepts."""
    facts = gateway_facts(analyse(objs, kind_checks=policyconf.kind_checks()).index)
    return _rendered(dataplane_objects(objs, facts))


def test_render_serves_nothing_of_a_gateway_whose_class_is_not_accepted(tmp_path: Path) -> None:
    objs = _objects([("web", "params"), ("fine", "ours")], ["params", "ours"])
    run = run_cli("render", "-f", str(write_manifests(tmp_path, objs)), "--file", "servers.conf")
    assert run.code == 0, run.err
    assert "# Gateway infra/fine listener http" in run.out
    assert "# Gateway infra/web listener" not in run.out and ":18080" not in run.out
    assert ("Warning: Gateway infra/web is not served: it is not accepted (Pending): GatewayClass params is not "
            "accepted: spec.parametersRef example.com/Params default/p: this gateway takes parameters of kind "
            "NginxProxy.gateway.nginx.org only") in run.err
    assert "infra/fine" not in run.err and "Traceback" not in run.err


def test_render_says_why_a_gateway_of_another_controller_or_no_class_is_left_out(tmp_path: Path) -> None:
    objs = _objects([("other", "theirs"), ("orphan", "nowhere")], ["theirs"])
    run = run_cli("render", "-f", str(write_manifests(tmp_path, objs)), "--file", "servers.conf")
    assert run.code == 0, run.err
    assert "# Gateway infra/" not in run.out
    assert ("Warning: Gateway infra/other is not served: GatewayClass theirs belongs to controller "
            "'example.com/other-controller', not 'gwpolicy.io/gateway-controller' "
            "(--controller-name '*' renders every GatewayClass)") in run.err
    assert "Warning: Gateway infra/orphan is not served: GatewayClass 'nowhere' does not exist" in run.err
    everything = run_cli("render", "-f", str(tmp_path), "--file", "servers.conf", "--controller-name", "*")
    assert "# Gateway infra/other listener http" in everything.out and "infra/other" not in everything.err


def test_render_names_each_listener_it_does_not_serve(tmp_path: Path) -> None:
    objs = _objects([("web", "ours")], ["ours"])
    objs[3]["spec"]["listeners"].append({"name": "tls", "port": 18443, "protocol": "HTTPS",
                                         "tls": {"certificateRefs": [{"name": "absent"}]}})
    run = run_cli("render", "-f", str(write_manifests(tmp_path, objs)), "--file", "servers.conf")
    assert run.code == 0, run.err
    assert "# Gateway infra/web listener http" in run.out and "listener tls" not in run.out
    assert ("Warning: Gateway infra/web listener tls is not served (InvalidCertificateRef): "
            "tls.certificateRefs[0]: Secret infra/absent does not exist.") in run.err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["ours", "params", "theirs", "nowhere"]), min_size=1, max_size=4),
       st.sets(st.sampled_from(sorted(CLASSES))))
def test_render_builds_what_the_live_gateway_builds(class_of: list[str], classes: set[str]) -> None:
    """For every mix of Gateways of ours, of a class of ours that is not accepted, of another
    controller's class and of a class that does not exist: byte-identical files."""
    objs = _objects([(f"g{i}", c) for i, c in enumerate(class_of)], sorted(classes))
    assert _rendered(objs) == _live(objs)
