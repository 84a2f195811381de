"""Which mesh routes apply to a client namespace's requests (mesh/routes.py `routes_for`), for every
set of routes, and what the proxy of a namespace renders from them (mesh/render.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.gateway.conftext import quote
from gwpolicy.mesh.render import MeshConfig, build
from gwpolicy.mesh.routes import ServicePort, http_port, routes_for, services

NAMESPACES = ["a", "b", "s"]
TARGETS = [ServicePort("s", "web", 80), ServicePort("s", "web", 8080), ServicePort("s", "api", 80)]


@st.composite
def route(draw, index: int) -> dict:
    ns = draw(st.sampled_from(NAMESPACES))
    parents = []
    for _ in range(draw(st.integers(1, 3))):
        ref = {"group": "", "kind": "Service", "name": draw(st.sampled_from(["web", "api"]))}
        if ns != "s" or draw(st.booleans()):
            ref["namespace"] = "s"
        if draw(st.booleans()):
            ref["port"] = draw(st.sampled_from([80, 8080]))
        parents.append(ref)
    if draw(st.booleans()):  # a Gateway parent does not make it a mesh route for other parents
        parents.append({"name": "gw"})
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": f"r{index}", "namespace": ns, "creationTimestamp": f"2026-01-01T00:00:{index:02d}Z"},
            "spec": {"parentRefs": parents, "rules": [{"backendRefs": [{"name": "web", "namespace": "s", "port": 80}]}]}}


routes_lists = st.integers(0, 8).flatmap(lambda n: st.tuples(*[route(i) for i in range(n)]))


def _attaches(r: dict, t: ServicePort) -> bool:
    ns = r["metadata"]["namespace"]
    return any(p.get("kind") == "Service" and p.get("namespace", ns) == t.namespace and p["name"] == t.service
               and p.get("port") in (None, t.port) for p in r["spec"]["parentRefs"])


@settings(max_examples=300, deadline=None)
@given(routes_lists, st.sampled_from(["a", "b"]), st.sampled_from(TARGETS))
def test_a_clients_consumer_routes_replace_the_producers_and_no_other_namespace_counts(routes, client, target):
    got = routes_for(client, target, routes)
    names = [r["metadata"]["name"] for r in got]
    assert len(names) == len(set(names))
    assert all(_attaches(r, target) for r in got)
    own = [r for r in routes if r["metadata"]["namespace"] == client and _attaches(r, target)]
    producers = [r for r in routes if r["metadata"]["namespace"] == target.namespace and _attaches(r, target)]
    assert sorted(names) == sorted(r["metadata"]["name"] for r in (own or producers))
    # another client namespace's routes never change what applies to this one
    other = "b" if client == "a" else "a"
    without_other = [r for r in routes if r["metadata"]["namespace"] != other]
    assert [r["metadata"]["name"] for r in routes_for(client, target, without_other)] == names
    # oldest first
    stamps = [r["metadata"]["creationTimestamp"] for r in got]
    assert stamps == sorted(stamps)


def test_which_service_ports_are_served_as_http():
    assert http_port({"name": "http", "port": 80})
    assert http_port({"port": 80}) and http_port({"name": "web", "port": 80}) and http_port({"name": "http-alt", "port": 8080})
    assert http_port({"name": "grpc", "port": 7070, "appProtocol": "http"})
    for p in ({"name": "https", "port": 443}, {"name": "tcp", "port": 9090}, {"name": "grpc", "port": 7070},
              {"name": "web", "port": 80, "appProtocol": "kubernetes.io/h2c"}, {"name": "dns", "port": 53, "protocol": "UDP"}):
        assert not http_port(p), p


def _svc(name: str, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "s"},
            "spec": {"ports": [{"name": "http", "port": 80}], **spec}}


def test_only_services_with_a_cluster_ip_are_served():
    got = services([_svc("web", clusterIP="198.19.0.5"), _svc("headless", clusterIP="None"), _svc("pending"),
                    _svc("ext", type="ExternalName", externalName="example.com"), _svc("v6", clusterIP="fd00::1")])
    assert [(s.name, s.cluster_ip, s.ports) for s in got] == [("web", "198.19.0.5", [80])]


SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-1", "namespace": "s", "labels": {"kubernetes.io/service-name": "web"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
         "endpoints": [{"addresses": ["198.18.0.7"], "conditions": {"ready": True}}]}


def test_tenant_values_reach_the_configuration_only_quoted():
    value = 'x"; return 200 "owned"; #\\'
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a"},
             "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web", "namespace": "s"}],
                      "rules": [{"filters": [{"type": "ResponseHeaderModifier",
                                              "responseHeaderModifier": {"set": [{"name": "X-T", "value": value}]}}],
                                 "backendRefs": [{"name": "web", "namespace": "s", "port": 80}]}]}}
    objects = [_svc("web", clusterIP="198.19.0.5"), route, SLICE]
    _, files = build(objects, "a", MeshConfig(allow_unmanaged_endpointslices=True))
    text = files["servers.conf"].decode()
    assert f"add_header X-T {quote(value)} always;" in text
    assert 'return 200 "owned"' not in text.replace(quote(value), "")
    # the other namespace's proxy does not carry a's route
    _, other = build(objects, "b", MeshConfig(allow_unmanaged_endpointslices=True))
    assert "X-T" not in other["servers.conf"].decode()
    assert "listen 198.19.0.5:80 default_server;" in other["servers.conf"].decode()


def _timeout_input(policy_ns: str, with_route: bool) -> list[dict]:
    objs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in ("a", "b", "c")]
    objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "b"},
                 "spec": {"clusterIP": "198.19.0.5", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    objs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "s-1", "namespace": "b",
                              "labels": {"kubernetes.io/service-name": "s",
                                         "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                 "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": True}}],
                 "ports": [{"name": "http", "port": 8080}]})
    objs.append({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "t", "namespace": policy_ns},
                 "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s", "namespace": "b"},
                          "default": {"readTimeout": "7s"}}})
    if with_route:
        objs.append({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "b"},
                     "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s", "port": 80}],
                              "rules": [{"backendRefs": [{"name": "s", "port": 80}]}]}})
    return objs


def _read_timeouts(objs: list[dict], client: str) -> set[str]:
    _, files = build(objs, client)
    return {line.strip() for text in files.values() for line in text.decode().splitlines()
            if line.strip().startswith("proxy_read_timeout")}


@given(st.booleans())
def test_a_policy_by_the_mesh_rule_reaches_only_its_namespaces_proxy(with_route: bool) -> None:
    objs = _timeout_input("a", with_route)
    assert _read_timeouts(objs, "a") == {"proxy_read_timeout 7s;"}
    assert "proxy_read_timeout 7s;" not in _read_timeouts(objs, "b") | _read_timeouts(objs, "c")
    # a policy in the Service's own namespace applies to every client namespace
    own = _timeout_input("b", with_route)
    for client in ("a", "b", "c"):
        assert _read_timeouts(own, client) == {"proxy_read_timeout 7s;"}
