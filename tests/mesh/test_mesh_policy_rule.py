"""What a client namespace's proxy configuration holds of the gwpolicy.io kinds is exactly what the
engine says applies to that namespace's requests (docs/semantics.md M3-M8), for every set of
policies, targets, stanzas and mesh routes: each policy's value is one no other policy has, so a
directive names the policy it came from."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.merge.leaves import field_name
from gwpolicy.engine.mesh import effective_from
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policyconf
from gwpolicy.mesh.render import IMPLIED_MESH, build
from helpers import set_dotted

NAMESPACES = ("a", "b", "c")
SERVICE = Ref("", "Service", "b", "s")
PORT = SERVICE.with_section("http")
#: kind -> (the field each policy sets, its value for the policy numbered n, the directive that shows it)
FIELDS = {
    "TimeoutPolicy": ("readTimeout", lambda n: f"{7001 + n}ms", r"proxy_read_timeout (\d+)ms;"),
    "RetryPolicy": ("attempts", lambda n: 2 + n, r"proxy_next_upstream_tries (\d+);"),
    "ClientSettingsPolicy": ("body.maxSize", lambda n: f"{101 + n}k", r"client_max_body_size (\d+)k;"),
    "RateLimitPolicy": ("requests", lambda n: 1001 + n, r"rate=(\d+)r/s;"),
    "UpstreamSettingsPolicy": ("keepAlive.connections", lambda n: 21 + n, r"keepalive (\d+);"),
}
DIRECT = ("UpstreamSettingsPolicy",)


def _shown(kind: str, text: str) -> set[str]:
    """The values of `kind` the configuration holds, as the policies wrote them."""
    field, value, pattern = FIELDS[kind]
    got = set(re.findall(pattern, text)) - ({"16"} if kind == "UpstreamSettingsPolicy" else set())  # the default pool
    unit = {"TimeoutPolicy": "ms", "ClientSettingsPolicy": "k"}.get(kind, "")
    return {f"{g}{unit}" for g in got}


@st.composite
def policy(draw, n: int) -> dict:
    kind = draw(st.sampled_from(sorted(FIELDS)))
    ns = draw(st.sampled_from(NAMESPACES))
    field, value, _ = FIELDS[kind]
    target = draw(st.sampled_from(["service", "port", "namespace"]))
    if target == "namespace":
        ref = {"group": "", "kind": "Namespace", "name": ns}
    else:
        ref = {"group": "", "kind": "Service", "name": "s"} | ({"namespace": "b"} if ns != "b" else {}) \
            | ({"sectionName": "http"} if target == "port" else {})
    settings_ = set_dotted({}, field, value(n))
    if kind in DIRECT:
        spec = {"targetRef": ref, **settings_}
    else:
        spec = {"targetRef": ref, draw(st.sampled_from(["default", "override"])): settings_}
        if kind == "RetryPolicy" and draw(st.booleans()):  # a field NGINX cannot honour: Invalid, programs nothing
            spec["default" if "default" in spec else "override"]["backoff"] = "1s"
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind,
            "metadata": {"name": f"p{n}", "namespace": ns, "creationTimestamp": f"2026-01-01T00:00:{n:02d}Z"},
            "spec": spec}


def _route(ns: str) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": f"r-{ns}", "namespace": ns},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s", "namespace": "b", "port": 80}],
                     "rules": [{"backendRefs": [{"name": "s", "namespace": "b", "port": 80}]}]}}


BASE = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in NAMESPACES] + [
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "b"},
     "spec": {"clusterIP": "198.19.0.5", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
    {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
     "metadata": {"name": "s-1", "namespace": "b",
                  "labels": {"kubernetes.io/service-name": "s",
                             "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
     "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": True}}],
     "ports": [{"name": "http", "port": 8080}]}]


def _engine_says(objects: list[dict], client: str) -> dict[str, set[str]]:
    """Kind -> the values that win on the mesh path of `client`'s requests to s's port (the one
    path such a request takes: one rule, one backend)."""
    a = analyse(objects + [IMPLIED_MESH], kind_checks=policyconf.kind_checks())
    out: dict[str, set[str]] = {k: set() for k in FIELDS}
    for ep in effective_from(a, client, PORT):
        if ep.kind.group == "gwpolicy.io" and ep.kind.kind in FIELDS:
            for leaf, (value, _, _) in ep.result.leaves.items():
                if field_name(leaf) == FIELDS[ep.kind.kind][0]:
                    out[ep.kind.kind].add(str(value))
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 6).flatmap(lambda n: st.tuples(*[policy(i) for i in range(n)])),
       st.booleans(), st.booleans())
def test_a_namespaces_proxy_holds_exactly_the_policy_values_the_engine_gives_its_requests(policies, producer, consumer):
    objects = [dict(o) for o in BASE] + list(policies)
    objects += ([_route("b")] if producer else []) + ([_route("a")] if consumer else [])
    for client in NAMESPACES:
        _, files = build(objects, client)
        text = "\n".join(f.decode() for f in files.values())
        expected = _engine_says(objects, client)
        for kind in FIELDS:
            assert _shown(kind, text) == expected[kind], (client, kind)
        # the namespace's one upstream of s lists the endpoint once per attempt (NGINX retries on another peer)
        tries = int(next(iter(expected["RetryPolicy"]), 1))
        assert files["upstreams.conf"].decode().count("server 10.1.0.1:8080") == tries, client


# -- what `describe` and status say of each field on mesh paths (mesh/policies.py)

XMESH = dict(IMPLIED_MESH)
HEADER_LIMIT = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "RateLimitPolicy", "metadata": {"name": "rl", "namespace": "b"},
                "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s"},
                         "default": {"requests": 5, "key": {"type": "Header", "header": "X-User"}}}}
NGF_UPSTREAM = {"apiVersion": "gateway.nginx.org/v1alpha1", "kind": "UpstreamSettingsPolicy",
                "metadata": {"name": "ngf", "namespace": "b"},
                "spec": {"targetRefs": [{"group": "core", "kind": "Service", "name": "s"}],
                         "loadBalancingMethod": "least_conn"}}
OURS_UPSTREAM = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "UpstreamSettingsPolicy",
                 "metadata": {"name": "u", "namespace": "b"},
                 "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s"}, "keepAlive": {"connections": 4}}}


def _nginx_column(text: str) -> dict[str, str]:
    """FIELD -> the NGINX column of `describe`'s tables (the last cell of each row)."""
    out = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 7 and cells[0] != "FIELD":
            out[cells[0]] = cells[-1]
    return out


def test_describe_says_what_the_mesh_proxy_does_with_each_field_on_mesh_paths(tmp_path):
    from helpers import NOW, run_cli, write_manifests

    objects = BASE + [HEADER_LIMIT, NGF_UPSTREAM, OURS_UPSTREAM]
    north_south = run_cli("describe", "service/s", "-n", "b", "-f", str(write_manifests(tmp_path, objects, "ns.yaml")),
                          "--now", NOW)
    mesh = run_cli("describe", "service/s", "-n", "b", "-f", str(write_manifests(tmp_path, objects + [XMESH], "m.yaml")),
                   "--now", NOW)
    assert north_south.code == 0 and mesh.code == 0, north_south.err + mesh.err
    ns_col, mesh_col = _nginx_column(north_south.out), _nginx_column(mesh.out)
    # a header-keyed limit: one bucket per gateway instance north-south, one per client namespace's proxy on the mesh
    assert ns_col["key.type"] == "enforced" and mesh_col["key.type"] == "approximated"
    assert ns_col["requests"] == mesh_col["requests"] == "enforced"
    assert ns_col["keepAlive.connections"] == mesh_col["keepAlive.connections"] == "enforced"
    assert ns_col["loadBalancingMethod"] == "enforced"
    assert mesh_col["loadBalancingMethod"] == "not applied on mesh paths"
    # the table of which group NGINX programs is the gateway's: not shown for mesh paths
    assert "together" in north_south.out and "together" not in mesh.out


def test_docs_mesh_table_lists_every_field_as_the_mesh_proxy_treats_it():
    from pathlib import Path

    from gwpolicy.mesh.policies import enforcement

    docs = (Path(__file__).resolve().parents[2] / "docs" / "mesh.md").read_text()
    section = docs[docs.index("### Policies on mesh paths"):docs.index("### In a cluster")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| kind")]
    assert len(rows) == sum(len(f) for f in policyconf.FIELDS.values())
    for kind, fields in policyconf.FIELDS.items():
        for fname in fields:
            assert any(r.startswith(f"| {kind} | `{fname}` | {enforcement('gwpolicy.io', kind, fname)} | ") for r in rows), (kind, fname)
