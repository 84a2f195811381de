"""No text of a GRPCRoute becomes NGINX syntax, as a property (docs/security.md).

Random GRPCRoutes (service and method matches, Exact and RegularExpression; header matches;
request and response header filters; hostnames; backends) are rendered with NGINX's
metacharacters and pieces of configuration in every string field, as tests/gateway/test_gateway_render_syntax.py
does for HTTPRoutes, on a plaintext and an HTTPS listener (so the preface stream server and the
`http2` listens are rendered too): NGINX's parser loads the files, no directive is named after
the payloads' marker, and the tree of directives is the same when each payload's metacharacters
are swapped for ones gwpolicy treats alike. Exact service and method names that are not gRPC
names are refused (status says which field), never rendered.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nginx_conf
from gateway_kit import (
    GW,
    backend,
    endpoints,
    gateway,
    gatewayclass,
    have_nginx,
    key_pair,
    listener,
    meta,
    service,
    tls_secret,
)
from gwpolicy.gateway import grpcroute
from gwpolicy.gateway.dataplane.model import SOCKET_DIR
from gwpolicy.gateway.facts import GATEWAY_GROUP, Ref, gateway_facts
from gwpolicy.gateway.state import build_index
from test_gateway_render_syntax import MARKED, Strings, _header_filter, _nginx_t, _render, _swapped

CERT, KEY = key_pair("grpc.example")


@st.composite
def worlds(draw: Any) -> list[dict[str, Any]]:
    s = Strings(draw)
    objs: list[dict[str, Any]] = [
        gatewayclass(),
        gateway("gw", "infra", listener("http", 8080),
                listener("https", 8443, "HTTPS", tls={"mode": "Terminate", "certificateRefs": [{"name": "c"}]})),
        tls_secret("c", "infra", CERT, KEY), service("grpc", "tenant-a"), *endpoints("grpc", "tenant-a", [("127.0.73.2", 9)])]
    for r in range(draw(st.integers(1, 2))):
        rules = []
        for _ in range(draw(st.integers(1, 3))):
            mtype = draw(st.sampled_from(["Exact", "RegularExpression"]))
            kind = "regex" if mtype == "RegularExpression" else "any"
            method: dict[str, Any] = {"type": mtype}
            for field in draw(st.sampled_from([["service"], ["method"], ["service", "method"]])):
                method[field] = s("svc" if field == "service" else "M", kind) if draw(st.booleans()) else \
                    ("pkg.Svc" if field == "service" else "Echo")
            match: dict[str, Any] = {"method": method}
            if draw(st.booleans()):
                match["headers"] = [{"name": s("x-h"), "value": s("v")},
                                    {"type": "RegularExpression", "name": "x-r", "value": s("v", "regex")}]
            rule: dict[str, Any] = {"matches": [match],
                                    "backendRefs": [backend("grpc", ns="tenant-a"), backend(s("grpc"), ns="tenant-a")][
                                        :draw(st.integers(1, 2))]}
            kinds = draw(st.lists(st.sampled_from(["RequestHeaderModifier", "ResponseHeaderModifier"]), max_size=2, unique=True))
            if kinds:
                rule["filters"] = [_header_filter(s, k) for k in kinds]
            rules.append(rule)
        spec: dict[str, Any] = {"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": rules}
        if draw(st.booleans()):
            spec["hostnames"] = [s("grpc.example"), "grpc.example"]
        objs.append({"apiVersion": f"{GW}/v1", "kind": "GRPCRoute", "metadata": meta(f"g{r}", "tenant-a"), "spec": spec})
    return objs


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(worlds())
def test_grpcroute_strings_never_change_the_directives(tmp_path: Path, objs: list[dict[str, Any]]) -> None:
    files = _render(objs)
    sockets = tempfile.mkdtemp(prefix="gwg", dir="/tmp")  # unix socket paths are short
    try:
        run = _nginx_t(tmp_path / "t", {k: v.replace(SOCKET_DIR.encode(), sockets.encode()) for k, v in files.items()})
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-2000:]
    tree = nginx_conf.parse_files(files)
    for path, d in (x for top in tree for x in top.walk()):
        assert not any(MARKED.search(w) for w in nginx_conf.unquoted_words(d)), (path, d)
    twin = nginx_conf.parse_files(_render(_swapped(objs)))
    got, want = nginx_conf.shape(tree), nginx_conf.shape(twin)
    assert got == want, ([x for x in got if x not in want], [x for x in want if x not in got])


@pytest.mark.parametrize("method", [
    {"service": "pkg.Svc;}", "method": "Echo"},
    {"service": "pkg.Svc", "method": "Echo\n return 200 x;"},
    {"type": "RegularExpression", "service": "a/b", "method": "Echo"},
    {"type": "RegularExpression", "method": "(?<x>a)"},
    {"type": "Exact"},
])
def test_a_method_match_that_is_no_grpc_name_is_refused_and_never_rendered(method: dict[str, Any]) -> None:
    route = {"apiVersion": f"{GW}/v1", "kind": "GRPCRoute", "metadata": meta("g", "tenant-a"),
             "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                      "rules": [{"matches": [{"method": method}], "backendRefs": [backend("grpc", ns="tenant-a")]}]}}
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), service("grpc", "tenant-a"),
            *endpoints("grpc", "tenant-a", [("127.0.73.2", 9)]), route]
    assert grpcroute.problem(route["spec"]) is not None
    facts = gateway_facts(build_index(objs))
    verdict = facts.routes[Ref(GATEWAY_GROUP, "GRPCRoute", "tenant-a", "g")].parents[0].accepted
    assert (verdict.status, verdict.reason) == (False, "UnsupportedValue") and "spec.rules[0].matches[0].method" in verdict.message
    assert b"grpc_pass" not in _render(objs)["servers.conf"]
