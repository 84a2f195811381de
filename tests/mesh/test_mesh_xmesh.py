"""The mesh exists once an XMesh of gwpolicy.io/mesh-controller does: without one, `gwpolicy mesh`
forwards each Service's cluster IP to its endpoints (as kube-proxy does) and applies no mesh route
and no policy; the XMesh created (its CRD too, after the proxy started), the routes apply; deleted,
they stop applying."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import netns
from gateway_proc import wait_until
from gwpolicy.engine.mesh import MESH_CONTROLLER
from gwpolicy.mesh.proxy import mesh_view
from gwpolicy.mesh.render import mesh_on
from mesh_harness import XMESH, XMESH_CRD, Mesh

A, S = "mesh-xa", "mesh-xs"
HTTPROUTE = "gateway.networking.k8s.io/v1"
NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": S}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": S},
           "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]}}
SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s-1", "namespace": S,
         "labels": {"kubernetes.io/service-name": "s"}}, "addressType": "IPv4", "endpoints": []}
ROUTE = {"apiVersion": HTTPROUTE, "kind": "HTTPRoute", "metadata": {"name": "producer", "namespace": S},
         "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s"}],
                  "rules": [{"filters": [{"type": "ResponseHeaderModifier",
                                          "responseHeaderModifier": {"set": [{"name": "X-Route", "value": "producer"}]}}],
                             "backendRefs": [{"name": "s", "port": 80}]}]}}
POLICY = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "t", "namespace": S},
          "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s"}, "default": {"readTimeout": "1s"}}}
PLAIN = [NAMESPACE, SERVICE, SLICE]


def _mesh(controller: str, api_version: str = XMESH["apiVersion"], kind: str = "XMesh") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "m"}, "spec": {"controllerName": controller}}


@given(st.permutations([*PLAIN, ROUTE, POLICY]),
       st.sampled_from([None, _mesh("example.net/mesh"), _mesh(MESH_CONTROLLER),
                        _mesh(MESH_CONTROLLER, "gateway.networking.k8s.io/v1", "Mesh")]))
def test_the_proxy_serves_routes_and_policies_only_with_a_mesh_of_ours(objects: list[dict[str, Any]],
                                                                        mesh: dict[str, Any] | None) -> None:
    given_objects = objects + ([mesh] if mesh is not None else [])
    view = mesh_view(given_objects)
    ours = mesh is not None and mesh["spec"]["controllerName"] == MESH_CONTROLLER
    assert mesh_on(given_objects) == ours
    if ours:
        assert view == given_objects
    else:  # Services forwarded to their endpoints, nothing more
        assert sorted(o["kind"] for o in view) == ["EndpointSlice", "Namespace", "Service"]


WHY = netns.unavailable()


@pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")
def test_without_an_xmesh_the_proxy_forwards_and_with_one_it_applies_the_routes(server_kind: str, tmp_path: Any) -> None:
    m = Mesh(server_kind, tmp_path, [A], xmesh=None)  # no XMesh, and no CRD of it yet
    try:
        m.apply([{**NAMESPACE, "metadata": {"name": A}}, NAMESPACE, {**SERVICE, "spec": {"ports": SERVICE["spec"]["ports"]}}])
        echo = m.backend(S, "s-v1")
        m.publish(S, "s", [echo], {"http": echo.port})
        m.apply([ROUTE])
        m.start_proxies()
        ip = m.cluster_ip(S, "s")
        m.wait_serving(A, ip, 80)

        def route_header() -> set[str]:
            status, headers, body = m.send(A, ip, 80, "/", host="s")
            assert status == 200 and json.loads(body)["pod"].startswith("s-v1-"), (status, body[:200])
            return {v for k, v in headers if k.lower() == "x-route"}

        assert route_header() == set()  # plain forwarding: the route is not applied
        m.server.kubectl("apply", "--server-side", "-f", str(XMESH_CRD))
        m.server.kubectl("wait", "--for=condition=Established", "crd/xmeshes.gateway.networking.x-k8s.io", "--timeout=30s")
        m.apply([XMESH])
        wait_until(lambda: route_header() == {"producer"}, 30, what=f"the route applied\n{m.log(A)}")
        m.server.kubectl("delete", "xmesh", XMESH["metadata"]["name"])
        wait_until(lambda: route_header() == set(), 30, what="the route not applied once the XMesh is deleted")
    finally:
        m.close()
