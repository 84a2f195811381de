"""The translated GRPCRoute conformance cases (tests/data/grpc-conformance) run through NGINX before
the data plane renders GRPCRoutes: each case's routes are written by hand as NGINX configuration,
in the shape the design gives them (a plaintext port behind the njs preface check, so HTTP/1.1 and
h2c share it; methods as exact locations on /service/method; header matches as a map in rule
precedence; request header filters as grpc_set_header, an add through a map so that an absent
header gets no leading comma; weights as split_clients; hostnames as server_name), with the gRPC
echo backends of the base (two replicas each). Each case's calls, and the weight check, must pass
as the suite compares them; GRPCRouteRequestHeaderModifier's expectedMetadata too. What this shows:
the data, the echo and the NGINX shapes agree, so the renderer has a target to meet.

Addresses: 127.0.94.0/24.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from grpc_conformance import case_names, check_rpc, eventually, load_case, metadata_problems, weights_pass
from gwpolicy.gateway import grpcecho
from raw_nginx import MODULES, RawNginx
from test_proto_http2 import PREFACE_JS

pytestmark = pytest.mark.skipif(not (Path("/usr/sbin/nginx").exists() and (MODULES / "ngx_stream_js_module.so").exists()),
                                reason="needs Debian's nginx and libnginx-mod-stream-js")

ADDR = "127.0.94.1"
NS = "gateway-conformance-infra"
SVC = grpcecho.SERVICE
HAND_WRITTEN = ("GRPCExactMethodMatching", "GRPCRouteHeaderMatching", "GRPCRouteListenerHostnameMatching",
                "GRPCRouteNamedRule", "GRPCRouteRequestHeaderModifier", "GRPCRouteWeight")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


def _servers(case: str) -> str:
    """The hand-written server blocks of one case (listening on the preface check's two sockets)."""
    listen = "listen unix:@sockets@/h1.sock proxy_protocol {d}; listen unix:@sockets@/h2.sock http2 proxy_protocol {d};"
    fallback = "location / { return 404; }"
    if case in ("GRPCExactMethodMatching", "GRPCRouteNamedRule"):
        body = (f"location = /{SVC}/Echo {{ grpc_pass grpc://v1; }}\n location = /{SVC}/EchoTwo {{ grpc_pass grpc://v2; }}\n"
                + fallback)
        return f"server {{ {listen.format(d='default_server')}\n {body} }}"
    if case == "GRPCRouteHeaderMatching":
        # rule precedence: most header matches first, then rule order
        return ("map \"$http_version:$http_color\" $gw_hm { \"~^two:orange$\" v1; \"~^one:\" v1; \"~^two:\" v2;\n"
                " \"~:(blue|green)$\" v1; \"~:(red|yellow)$\" v2; default \"\"; }\n"
                f"server {{ {listen.format(d='default_server')}\n location / {{ if ($gw_hm = \"\") {{ return 404; }}"
                " grpc_pass grpc://$gw_hm; } }")
    if case == "GRPCRouteListenerHostnameMatching":
        out = [f"server {{ {listen.format(d='default_server')} {fallback} }}"]
        for names, up in (("bar.com", "v1"), ("foo.bar.com", "v2"), ("*.bar.com *.foo.com", "v3")):
            out.append(f"server {{ {listen.format(d='')} server_name {names}; location / {{ grpc_pass grpc://{up}; }} }}")
        return "\n".join(out)
    if case == "GRPCRouteRequestHeaderModifier":
        return ("map $http_x_header_add_1 $gw_add1 { \"\" \"header-add-1\"; default \"$http_x_header_add_1,header-add-1\"; }\n"
                "map $http_x_header_add_2 $gw_add2 { \"\" \"header-add-2\"; default \"$http_x_header_add_2,header-add-2\"; }\n"
                f"server {{ {listen.format(d='default_server')}\n"
                f" location = /{SVC}/Echo {{ grpc_set_header x-header-set set-overwrites-values; grpc_pass grpc://v1; }}\n"
                f" location = /{SVC}/EchoTwo {{ grpc_set_header x-header-set-1 header-set-1; grpc_set_header x-header-set-2 header-set-2;\n"
                "  grpc_set_header x-header-add-1 $gw_add1; grpc_set_header x-header-add-2 $gw_add2;\n"
                "  grpc_set_header x-header-remove-1 \"\"; grpc_set_header x-header-remove-2 \"\"; grpc_pass grpc://v2; }\n"
                f" {fallback} }}")
    if case == "GRPCRouteWeight":
        return ("split_clients \"$request_id\" $gw_w { 70% v1; * v2; }\n"
                f"server {{ {listen.format(d='default_server')} location / {{ grpc_pass grpc://$gw_w; }} }}")
    raise KeyError(case)


@pytest.fixture(scope="module")
def echoes():
    servers = [grpcecho.GrpcEchoServer(f"grpc-infra-backend-{v}-{h}-x{i}", NS, address=ADDR)
               for v in ("v1", "v2", "v3") for i, h in enumerate(("6b7f", "9c2d"))]
    for s in servers:
        s.start()
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def plane(tmp_path_factory, echoes):
    tmp = tmp_path_factory.mktemp("grpc-conformance")
    (tmp / "preface.js").write_text(PREFACE_JS)
    port = _free_port()
    ups = "".join(f"upstream {v} {{ " + " ".join(f"server {ADDR}:{s.port};" for s in echoes if f"-{v}-" in s.pod) + " }\n"
                  for v in ("v1", "v2", "v3"))
    stream = (f"js_import preface from {tmp / 'preface.js'};\njs_var $gw_h2 0;\n"
              "map $gw_h2 $gw_plain { 1 unix:@sockets@/h2.sock; default unix:@sockets@/h1.sock; }\n"
              f"server {{ listen {ADDR}:{port}; js_preread preface.detect; proxy_pass $gw_plain; proxy_protocol on; }}")
    nginx = RawNginx(tmp, http=ups + "server { listen unix:@sockets@/idle.sock; }", stream=stream,
                     modules=("ngx_stream_module.so", "ngx_stream_js_module.so"))
    with nginx:
        yield {"nginx": nginx, "ups": ups, "stream": stream, "target": f"{ADDR}:{port}"}


def test_every_grpcroute_case_is_translated_and_run_here_or_needs_backend_tls():
    assert set(case_names()) == set(HAND_WRITTEN) | {"BackendTLSPolicyGRPCRoute"}
    assert all(set(e.get("requires") or []) == {"backendTLS"} for e in load_case("BackendTLSPolicyGRPCRoute")["rpcs"])


@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_the_cases_calls_pass_through_nginx(plane, name):
    case = load_case(name)
    plane["nginx"].reload(http=plane["ups"] + _servers(name), stream=plane["stream"])
    failures = []
    for entry in case["rpcs"]:
        why = eventually(lambda: check_rpc(entry, plane["target"])[:2])
        if why:
            failures.append(f"{entry['request']} -> {why}")
        elif entry.get("expectedMetadata") or entry.get("absentMetadata"):
            _, _, answer = check_rpc(entry, plane["target"])
            problems = metadata_problems(entry, answer)
            if problems:
                failures.append(f"{entry['request']} -> {problems}")
    assert not failures, "\n".join(failures)
    if case.get("weights"):
        w = case["weights"]
        assert any(not weights_pass(w, plane["target"]) for _ in range(w["maxRetries"]))


def test_a_wrong_backend_fails_the_comparison(plane):
    """The comparison is not vacuous: with the two methods swapped the exact-method case fails."""
    plane["nginx"].reload(http=plane["ups"] + _servers("GRPCExactMethodMatching").replace("grpc://v1", "grpc://vX")
                          .replace("grpc://v2", "grpc://v1").replace("grpc://vX", "grpc://v2"), stream=plane["stream"])
    echo = load_case("GRPCExactMethodMatching")["rpcs"][0]
    ok, why, _ = check_rpc(echo, plane["target"])
    assert not ok and "grpc-infra-backend-v2" in why
