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


def _nested(field: str, value: object) -> dict:
    out: dict = {}
    cur = out
    parts = field.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


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
    settings_ = _nested(field, value(n))
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
