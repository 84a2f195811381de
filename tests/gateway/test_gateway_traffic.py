"""Real HTTP through real NGINX on loopback (127.0.10.0/24): routing as the Gateway API spec says.

Manifests -> analysis -> data plane -> render -> NGINX, with conformance-style echo backends; no
sandbox and no mocked proxy. NGINX starts once for the module; each request uses a fresh
connection.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway_kit import (
    Echoes,
    Served,
    backend,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    reference_grant,
    request,
    route,
    self_signed,
    service,
    tls_secret,
)

pytestmark = pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")

ADDR = "127.0.10.1"
BACKENDS = "127.0.10.2"


def rule(*matches, backends=None, filters=None):
    r = {"backendRefs": backends if backends is not None else [backend("v1")]}
    if matches:
        r["matches"] = list(matches)
    if filters:
        r["filters"] = filters
    return r


def path(value, type="PathPrefix", **extra):
    return {"path": {"type": type, "value": value}, **extra}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gw")
    echoes = Echoes(BACKENDS).start("v1", "v2", "v3").start("web", namespace="web")
    http_port, https_port = free_port(ADDR), free_port(ADDR)
    cert, key = self_signed(tmp, "cert", ["*.secure.test", "secure.test"])
    other_cert, other_key = self_signed(tmp, "other", ["other.secure.test"])
    objects = [gatewayclass(), *echoes.objects(),
               gateway("gw", "infra",
                       listener("http", http_port),
                       listener("wild", http_port, hostname="*.wild.test"),
                       listener("https", https_port, "HTTPS", hostname="*.secure.test",
                                tls={"certificateRefs": [{"name": "cert"}]}),
                       listener("https-other", https_port, "HTTPS", hostname="other.secure.test",
                                tls={"certificateRefs": [{"name": "other", "namespace": "certs"}]})),
               tls_secret("cert", "infra", cert.read_bytes(), key.read_bytes()),
               tls_secret("other", "certs", other_cert.read_bytes(), other_key.read_bytes()),
               reference_grant("gw-to-certs", "certs", "infra", to_kind="Secret", from_kind="Gateway"),
               service("empty", "infra"),
               # paths
               route("paths", "infra", [rule(path("/one", "Exact")), rule(path("/pre"), backends=[backend("v2")]),
                                        rule(path("/pre/deeper"), backends=[backend("v3")])], hostnames=["paths.test"]),
               # precedence across routes: the older route wins a tie; conditions fall back to shorter prefixes
               route("older", "infra", [rule(path("/"), backends=[backend("v1")]),
                                        rule(path("/p", headers=[{"name": "version", "value": "two"}]), backends=[backend("v2")])],
                     hostnames=["prec.test"], ts="2024-01-01T00:00:00Z"),
               route("newer", "infra", [rule(path("/p", headers=[{"name": "version", "value": "two"}]), backends=[backend("v3")]),
                                        rule(path("/p", method="POST"), backends=[backend("v3")]),
                                        rule(path("/p", headers=[{"name": "version", "value": "two"}, {"name": "color", "value": "red"}]),
                                             backends=[backend("v3")]),
                                        rule({"path": {"type": "PathPrefix", "value": "/q"}, "queryParams": [{"name": "animal", "value": "whale"}]},
                                             backends=[backend("v2")])],
                     hostnames=["prec.test"], ts="2024-06-01T00:00:00Z"),
               # hostnames: exact beats wildcard; listener hostname intersection
               route("exact-host", "infra", [rule(backends=[backend("v1")])], hostnames=["a.hosts.test"]),
               route("wild-host", "infra", [rule(backends=[backend("v2")])], hostnames=["*.hosts.test"]),
               route("on-wild", "infra", [rule(backends=[backend("v3")])], hostnames=["x.wild.test", "nope.other.test"],
                     sectionName="wild"),
               # errors: 500 for every backend that cannot be reached
               route("errors", "infra", [rule(path("/missing"), backends=[backend("nosuch")]),
                                         rule(path("/forbidden"), backends=[backend("v1", ns="elsewhere")]),
                                         rule(path("/empty"), backends=[backend("empty")]),
                                         rule(path("/kind"), backends=[{"group": "example.io", "kind": "Thing", "name": "v1"}]),
                                         rule(path("/none"), backends=[])], hostnames=["errors.test"]),
               route("granted", "infra", [rule(backends=[backend("web", ns="web")])], hostnames=["granted.test"]),
               reference_grant("infra-to-web", "web", "infra", to_name="web"),
               route("forbidden-elsewhere", "other", [rule(backends=[backend("web", ns="web")])], hostnames=["ungranted.test"]),
               # filters
               route("filters", "infra", [
                   rule(path("/headers"), filters=[{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                       "set": [{"name": "X-Header-Set", "value": "set-overwrites-values"}],
                       "add": [{"name": "X-Header-Add", "value": "add-appends-values"}],
                       "remove": ["X-Header-Remove"]}},
                       {"type": "ResponseHeaderModifier", "responseHeaderModifier": {
                           "set": [{"name": "X-Resp-Set", "value": "set"}], "add": [{"name": "X-Resp-Add", "value": "added"}],
                           "remove": ["X-Resp-Remove"]}}]),
                   rule(path("/redirect"), filters=[{"type": "RequestRedirect", "requestRedirect": {"hostname": "example.org", "statusCode": 301}}]),
                   rule(path("/to-https"), filters=[{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}]),
                   rule(path("/port"), filters=[{"type": "RequestRedirect", "requestRedirect": {"port": 8083}}]),
                   rule(path("/redirect-prefix"), filters=[{"type": "RequestRedirect", "requestRedirect": {
                       "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/replacement"}}}]),
                   rule(path("/prefix/one"), filters=[{"type": "URLRewrite", "urlRewrite": {
                       "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/one"}}}]),
                   rule(path("/full"), filters=[{"type": "URLRewrite", "urlRewrite": {
                       "hostname": "rewritten.test", "path": {"type": "ReplaceFullPath", "replaceFullPath": "/replaced"}}}]),
               ], hostnames=["filters.test"]),
               # weights
               route("weights", "infra", [rule(backends=[backend("v1", weight=70), backend("v2", weight=30), backend("v3", weight=0)])],
                     hostnames=["weights.test"]),
               route("per-backend", "infra", [rule(backends=[
                   backend("v1", weight=1, filters=[{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Which", "value": "one"}]}}]),
                   backend("v2", weight=1)])], hostnames=["per-backend.test"]),
               route("half-broken", "infra", [rule(backends=[backend("v1", weight=50), backend("nosuch", weight=50)])],
                     hostnames=["half.test"]),
               # TLS
               route("secure", "infra", [rule(backends=[backend("v1")])], hostnames=["app.secure.test"], sectionName="https"),
               route("secure-other", "infra", [rule(backends=[backend("v2")])], sectionName="https-other"),
               ]
    served = Served(tmp / "nginx", ADDR)
    served.apply(objects)
    yield {"served": served, "http": http_port, "https": https_port, "echoes": echoes, "objects": objects}
    served.stop()
    echoes.stop()


def get(world, path="/", host="example.com", **kw):
    return request(ADDR, world["http"], path, host, **kw)


def test_exact_and_prefix_paths_match_by_path_segment(world):
    assert get(world, "/one", "paths.test").pod.startswith("v1-")
    assert get(world, "/one/", "paths.test").status == 404
    assert get(world, "/one/x", "paths.test").status == 404
    for p in ("/pre", "/pre/", "/pre/x", "/pre/deeperx"):
        assert get(world, p, "paths.test").pod.startswith("v2-"), p
    assert get(world, "/prex", "paths.test").status == 404
    assert get(world, "/pre/deeper/x", "paths.test").pod.startswith("v3-")
    assert get(world, "/", "paths.test").status == 404


def test_the_backend_sees_the_original_path_query_and_host(world):
    e = get(world, "/pre/a%20b?x=1&y=%2F", "paths.test:1234").echo
    assert e["path"] == "/pre/a%20b?x=1&y=%2F"
    assert e["host"] == "paths.test:1234"
    assert e["proto"] == "HTTP/1.1"  # NGINX 1.22 defaults to HTTP/1.0 towards backends


def test_precedence_across_routes(world):
    # same match in two routes: the older route wins
    assert get(world, "/p", "prec.test", headers={"version": "two"}).pod.startswith("v2-")
    # more header matches beat fewer, method beats headers
    assert get(world, "/p/x", "prec.test", headers={"version": "two", "color": "red"}).pod.startswith("v3-")
    assert get(world, "/p", "prec.test", method="POST", headers={"version": "two"}).pod.startswith("v3-")
    # the /p rules' conditions fail: the request falls back to the "/" rule, not 404
    assert get(world, "/p", "prec.test").pod.startswith("v1-")
    assert get(world, "/px", "prec.test", headers={"version": "two"}).pod.startswith("v1-")
    # query parameter match
    assert get(world, "/q?animal=whale", "prec.test").pod.startswith("v2-")
    assert get(world, "/q?animal=dolphin", "prec.test").pod.startswith("v1-")


def test_hostnames_exact_before_wildcard_and_listener_intersection(world):
    assert get(world, "/", "a.hosts.test").pod.startswith("v1-")
    assert get(world, "/", "b.hosts.test").pod.startswith("v2-")
    assert get(world, "/", "deep.b.hosts.test").pod.startswith("v2-")
    assert get(world, "/", "hosts.test").status == 404
    assert get(world, "/", "x.wild.test").pod.startswith("v3-")
    assert get(world, "/", "y.wild.test").status == 404  # the route serves only x.wild.test there
    assert get(world, "/", "nope.other.test").status == 404  # outside the listener's *.wild.test
    assert get(world, "/", "unknown.test").status == 404


def test_unreachable_backends_get_500(world):
    for p in ("/missing", "/forbidden", "/empty", "/kind", "/none"):
        assert get(world, p, "errors.test").status == 500, p
    assert get(world, "/", "granted.test").echo["namespace"] == "web"
    assert get(world, "/", "ungranted.test").status == 500
    facts = world["served"].dataplane.routes
    reasons = sorted(r for _, _, r, _ in facts[next(k for k in facts if k.name == "errors")].unresolved)
    assert reasons == ["BackendNotFound", "InvalidKind", "RefNotPermitted"]


def test_request_and_response_header_modifiers(world):
    a = get(world, "/headers", "filters.test", headers={"X-Header-Set": "old", "X-Header-Add": "some-other-value",
                                                        "X-Header-Remove": "gone", "X-Echo-Set-Header": "X-Resp-Remove:bye,X-Resp-Set:old"})
    h = a.echo["headers"]
    assert h["X-Header-Set"] == ["set-overwrites-values"]
    assert h["X-Header-Add"] == ["some-other-value,add-appends-values"]
    assert "X-Header-Remove" not in h
    assert a.headers["x-resp-set"] == "set" and a.headers["x-resp-add"] == "added"
    assert "x-resp-remove" not in a.headers
    assert get(world, "/headers", "filters.test").echo["headers"]["X-Header-Add"] == ["add-appends-values"]


def test_redirects(world):
    a = get(world, "/redirect/x?q=1", "filters.test")
    assert (a.status, a.headers["location"]) == (301, "http://example.org:%d/redirect/x?q=1" % world["http"])
    a = get(world, "/to-https", "filters.test")
    assert (a.status, a.headers["location"]) == (302, "https://filters.test/to-https")
    assert get(world, "/port", "filters.test").headers["location"] == "http://filters.test:8083/port"
    assert get(world, "/redirect-prefix/x", "filters.test").headers["location"].endswith(":%d/replacement/x" % world["http"])


def test_url_rewrites(world):
    assert get(world, "/prefix/one/two?z=1", "filters.test").echo["path"] == "/one/two?z=1"
    assert get(world, "/prefix/one", "filters.test").echo["path"] == "/one"
    e = get(world, "/full/anything", "filters.test").echo
    assert (e["path"], e["host"]) == ("/replaced", "rewritten.test")


def sample_size(share: float, tolerance: float, sigmas: float = 5.0) -> int:
    """Requests needed for `tolerance` to be `sigmas` binomial standard deviations of the observed
    share: a split that is exactly right then fails the check with probability below 1e-6.

    The upstream suite sends 500 requests and allows ±5%, which for a 70/30 split is only 2.4
    standard deviations (a correct split fails 1.3% of the time), so it tries up to 10 times; one
    larger sample keeps the suite's ±5% without the retries, which would also let a skewed split
    pass."""
    return math.ceil(sigmas ** 2 * share * (1 - share) / tolerance ** 2)


def test_weights_within_the_suites_tolerance(world):
    n = sample_size(0.7, 0.05)  # 2,100
    with ThreadPoolExecutor(10) as pool:
        pods = Counter(a.pod.split("-")[0] for a in pool.map(lambda _: get(world, "/", "weights.test"), range(n)))
    assert set(pods) == {"v1", "v2"}  # weight 0 gets nothing
    assert abs(pods["v1"] / n - 0.7) <= 0.05 and abs(pods["v2"] / n - 0.3) <= 0.05, pods
    n = sample_size(0.5, 0.1)  # 625
    with ThreadPoolExecutor(10) as pool:
        codes = Counter(a.status for a in pool.map(lambda _: get(world, "/", "half.test"), range(n)))
    assert set(codes) == {200, 500} and abs(codes[500] / n - 0.5) <= 0.1, codes


def test_https_listeners_terminate_tls_with_the_listeners_certificate(world):
    a = request(ADDR, world["https"], "/", "app.secure.test", tls=True)
    assert a.pod.startswith("v1-") and a.echo["headers"]["X-Forwarded-Proto"] == ["https"]
    assert request(ADDR, world["https"], "/", "other.secure.test", tls=True).pod.startswith("v2-")
    assert request(ADDR, world["https"], "/", "nothing.secure.test", tls=True).status == 404
    import socket
    import ssl
    for sni, cn in (("app.secure.test", "*.secure.test"), ("other.secure.test", "other.secure.test")):
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection((ADDR, world["https"]), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=sni) as s:
            der = s.getpeercert(binary_form=True)
        assert cn.encode() in der, sni
    with pytest.raises(ssl.SSLError):  # no listener for this name: the handshake is refused
        request(ADDR, world["https"], "/", "elsewhere.test", tls=True)


def test_cross_namespace_certificate_needs_a_reference_grant(world, tmp_path):
    objects = [o for o in world["objects"] if o["metadata"]["name"] != "gw-to-certs"]
    dp_files = world["served"].files(objects)
    facts = world["served"].dataplane.listeners
    bad = next(f for l, f in facts.items() if l.section == "https-other")
    assert (bad.programmed, bad.reason) == (False, "RefNotPermitted")
    assert "secrets/certs_other.pem" not in dp_files
    world["served"].files(world["objects"])  # leave the module's data plane as it was


# ---------------------------------------------------------------------------------------------
# the echo backend itself (what the conformance suite reads from echo-basic)


def test_echo_answers_like_echo_basic(tmp_path):
    import json as _json
    import subprocess
    import sys
    import time

    from gwpolicy.gateway.echo import EchoServer

    with EchoServer("infra-backend-v1-abc-xyz", "infra", address=BACKENDS) as e:
        a = request(BACKENDS, e.port, "/p?q=1", "h.test:81", headers={"X-Echo-Set-Header": "X-One:1,x-two:2,X-One:3", "X-Multi": "a"})
        assert a.headers["content-type"] == "application/json"
        body = a.echo
        assert {k: body[k] for k in ("path", "host", "method", "proto", "namespace", "pod", "ingress", "service")} == {
            "path": "/p?q=1", "host": "h.test:81", "method": "GET", "proto": "HTTP/1.1", "namespace": "infra",
            "pod": "infra-backend-v1-abc-xyz", "ingress": "", "service": ""}
        assert body["headers"]["X-Multi"] == ["a"] and body["httpPort"] == str(e.port)
        assert a.headers["x-one"] == "1,3" and a.headers["x-two"] == "2"
        t0 = time.monotonic()
        assert request(BACKENDS, e.port, "/?delay=300ms").status == 200 and time.monotonic() - t0 >= 0.3
    cert, key = self_signed(tmp_path, "echo", ["backend.test"])
    with EchoServer("tls-backend-a-b", "infra", address=BACKENDS, cert=str(cert), key=str(key)) as e:
        tls = request(BACKENDS, e.port, "/", "backend.test", tls=True, sni="backend.test").echo["tls"]
        assert tls["serverName"] == "backend.test" and tls["version"].startswith("TLS")
    port = free_port(BACKENDS)
    proc = subprocess.Popen([sys.executable, "-m", "gwpolicy.cli.main", "echo", "--port", str(port), "--address", BACKENDS,
                             "--pod", "web-backend-a-b", "--namespace", "web"], stdout=subprocess.PIPE, text=True)
    try:
        assert "web/web-backend-a-b" in proc.stdout.readline()
        assert _json.loads(request(BACKENDS, port, "/").body)["namespace"] == "web"
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    bad = subprocess.run([sys.executable, "-m", "gwpolicy.cli.main", "echo", "--port", str(port), "--pod", "p", "--namespace", "n",
                          "--cert", str(cert)], capture_output=True, text=True)
    assert bad.returncode != 0 and "--cert and --key go together" in bad.stderr and "Traceback" not in bad.stderr


def test_cors_preflight_answered_by_the_gateway_and_simple_requests_get_the_headers(world):
    cors = {"type": "CORS", "cors": {"allowOrigins": ["https://www.foo.com", "https://*.bar.com"], "allowMethods": ["GET", "OPTIONS"],
                                     "allowHeaders": ["x-header-1", "x-header-2"], "exposeHeaders": ["x-header-3"],
                                     "allowCredentials": True, "maxAge": 3600}}
    wild = {"type": "CORS", "cors": {"allowOrigins": ["*"], "allowMethods": ["*"], "allowHeaders": ["*"]}}
    objects = world["objects"] + [route("cors", "infra", [rule(path("/cors-1"), filters=[cors]), rule(path("/cors-2"), filters=[wild])],
                                        hostnames=["cors.test"])]
    world["served"].apply(objects)
    try:
        pre = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-header-1"}
        a = get(world, "/cors-1", "cors.test", method="OPTIONS", headers={"Origin": "https://xpto.www.bar.com", **pre})
        assert a.status == 204 and a.echo == {}  # answered by the gateway, not the backend
        assert a.headers["access-control-allow-origin"] == "https://xpto.www.bar.com"
        assert a.headers["access-control-allow-methods"] == "GET, OPTIONS"
        assert a.headers["access-control-allow-headers"] == "x-header-1, x-header-2"
        assert (a.headers["access-control-max-age"], a.headers["access-control-allow-credentials"]) == ("3600", "true")
        a = get(world, "/cors-1", "cors.test", method="OPTIONS", headers={"Origin": "https://foobar.com", **pre})
        assert a.status == 204 and not any(h.startswith("access-control-") for h in a.headers)
        a = get(world, "/cors-1", "cors.test", headers={"Origin": "https://www.foo.com"})
        assert a.pod.startswith("v1-") and a.headers["access-control-allow-origin"] == "https://www.foo.com"
        assert a.headers["access-control-expose-headers"] == "x-header-3"
        assert "access-control-allow-origin" not in get(world, "/cors-1", "cors.test", headers={"Origin": "https://foobar.com"}).headers
        a = get(world, "/cors-2", "cors.test", method="OPTIONS",
                headers={"Origin": "https://foobar.com:12345", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-a"})
        assert (a.headers["access-control-allow-origin"], a.headers["access-control-allow-methods"]) == ("https://foobar.com:12345", "POST")
        assert a.headers["access-control-allow-headers"] == "x-a" and "access-control-allow-credentials" not in a.headers
        assert get(world, "/cors-2", "cors.test", method="OPTIONS").pod.startswith("v1-")  # not a preflight: proxied
    finally:
        world["served"].apply(world["objects"])


def test_backend_level_filters_apply_only_to_their_backend(world):
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: get(world, "/", "per-backend.test"), range(200)))
    seen = Counter((a.pod.split("-")[0], tuple(a.echo["headers"].get("X-Which", []))) for a in answers)
    assert set(seen) == {("v1", ("one",)), ("v2", ())}, seen
    assert abs(seen[("v1", ("one",))] / 200 - 0.5) <= 0.12, seen


def test_backend_level_redirect_and_rewrite(world):
    redirect = {"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/redirected-prefix"}}}
    rewrite = {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/rewritten"}}}
    objects = world["objects"] + [route("backend-filters", "infra", [
        rule(path("/prefix"), backends=[backend("v1", filters=[redirect])]),
        rule(path("/rw"), backends=[backend("v2", filters=[rewrite])])], hostnames=["backend-filters.test"])]
    world["served"].apply(objects)
    try:
        a = get(world, "/prefix/x?q=1", "backend-filters.test")
        assert (a.status, a.headers["location"]) == (302, "http://backend-filters.test:%d/redirected-prefix/x?q=1" % world["http"])
        e = get(world, "/rw/y", "backend-filters.test").echo
        assert (e["path"], e["pod"][:3]) == ("/rewritten", "v2-")
    finally:
        world["served"].apply(world["objects"])
