"""bench/requestpath.py: the lists a request makes NGINX walk, read from a rendered configuration.

The check that per-request work does not grow with the number of routes: render a small and a
large cluster and compare what a request walks. It is held here to configurations of both shapes
(tests/data/requestpath: variable-upstream-N, the rendering of N routes each with a method, header
and query match, whose proxy_pass names the upstream by a variable and whose rules are named
locations; static-upstream-N, the same edited so that every lookup is a hash or NGINX's location
tree: static proxy_pass, URI internal locations), to NGINX's behaviour where the edited shape
differs (the request URI the backend gets, the method after an internal redirect), and to the
renderer itself. Traffic on loopback 127.0.97.0/24.
"""

from __future__ import annotations

import http.client
import shutil
import socket
from pathlib import Path

import pytest

from gwpolicy.bench import dataplane, requestpath

DATA = Path(__file__).resolve().parents[1] / "data" / "requestpath"
NET = "127.0.97"
needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (Debian: nginx)")


def fixture(name: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (DATA / name).iterdir()}


def fallback(location: str) -> bool:
    """The edited shape's one proxy_pass with variables: the location only request URIs a static
    proxy_pass cannot send exactly reach (`$gw_send_path` empty)."""
    return location.startswith(("/_gwx-", "/_gmx-", "/_gw_x_"))


def test_the_check_finds_lists_that_grow_with_the_routes_in_the_rendered_shape() -> None:
    small, large = requestpath.walks(fixture("variable-upstream-3")), requestpath.walks(fixture("variable-upstream-12"))
    found = requestpath.growth(small, large)
    assert "upstreams walked by a variable proxy_pass: 6 -> 24" in found
    assert "named locations walked by a jump: 8 -> 26" in found
    assert any("proxy_pass http://$gw_up$request_uri" in f for f in found)


def test_the_check_passes_the_shape_whose_lookups_are_hashes_and_the_location_tree() -> None:
    small = requestpath.walks(fixture("static-upstream-3"), exempt=fallback)
    large = requestpath.walks(fixture("static-upstream-12"), exempt=fallback)
    assert requestpath.growth(small, large) == []
    assert large.lists()["named locations walked by a jump"] == 0
    assert large.lists()["upstreams walked by a variable proxy_pass"] == 0
    # without the exemption the fallback is reported: the check does see it
    assert requestpath.growth(requestpath.walks(fixture("static-upstream-3")), requestpath.walks(fixture("static-upstream-12")))


def test_what_a_request_walks_in_the_renderer_s_configuration_does_not_grow_with_the_routes() -> None:
    def rendering(n: int) -> dict[str, bytes]:
        return dataplane.render_gwpolicy(dataplane.cluster(n, "127.0.97.1", ("127.0.97.2", 18080), "matches",
                                                           tuple(range(0, n, 2))), 18000)
    assert requestpath.growth(requestpath.walks(rendering(10), exempt=fallback), requestpath.walks(rendering(40), exempt=fallback)) == []


def _conf(servers: str, http: str = "") -> dict[str, bytes]:
    return {"nginx.conf": f"events {{}}\nhttp {{\n{http}\n{servers}\n}}\n".encode()}


@pytest.mark.parametrize("kind, make", [
    ("regex locations tried", lambda n: _conf("server { listen 1.2.3.4:80; "
                                              + "".join(f"location ~ ^/r{i}$ {{ return 200; }} " for i in range(n)) + "}")),
    ("regex server names tried", lambda n: _conf("".join(f"server {{ listen 1.2.3.4:80; server_name ~^h{i}\\.; "
                                                         "location / { return 200; } } " for i in range(n)))),
    ("regex keys of one map tried", lambda n: _conf("server { listen 1.2.3.4:80; location / { return 200 $m; } }",
                                                    "map $uri $m { " + "".join(f"~^/r{i}$ {i}; " for i in range(n)) + "}")),
    ("named locations walked by a jump", lambda n: _conf(
        "server { listen 1.2.3.4:80; location / { error_page 418 = @n0; return 418; } "
        + "".join(f"location @n{i} {{ return 200; }} " for i in range(n)) + "}")),
    ("upstreams walked by a variable proxy_pass", lambda n: _conf(
        "server { listen 1.2.3.4:80; location / { proxy_pass http://$host; } }",
        "".join(f"upstream u{i} {{ server 127.0.0.1:{1000 + i}; }} " for i in range(n)))),
])
def test_each_kind_of_list_is_measured(kind: str, make: object) -> None:
    assert callable(make)
    small, large = requestpath.walks(make(2)), requestpath.walks(make(9))
    assert small.lists()[kind] == 2 and large.lists()[kind] == 9
    assert any(f.startswith(f"{kind}: 2 -> 9") for f in requestpath.growth(small, large))


def test_jumps_on_errors_nginx_raises_itself_are_not_on_the_request_path() -> None:
    conf = _conf("server { listen 1.2.3.4:80; location / { return 200; } error_page 495 496 = @refused; "
                 + "".join(f"location @n{i} {{ return 444; }} " for i in range(5)) + "location @refused { return 444; } }")
    assert requestpath.walks(conf).lists()["named locations walked by a jump"] == 0


def test_a_configuration_that_does_not_parse_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        requestpath.walks({"nginx.conf": b"http { server { location / { return 200; }\n"})


# -- the edited shape under real traffic ----------------------------------------------------------

def _raw(address: str, port: int, request: bytes) -> tuple[int, str]:
    """A request sent byte for byte (http.client would normalise the URI); status and body."""
    with socket.create_connection((address, port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("latin-1")


#: request URIs and what a static proxy_pass would have made of them without the edited shape's care
URIS = ["/api/x", "/api/x?y=1&z=%2F", "/a%2Fb", "/a%20b", "/caf%C3%A9", "/caf%c3%a9", "/a//b", "/a/../b",
        "/a/%2E%2E/b", "/p?", "/x%41y", "/%25", "/q%3Fx?y", "/a+b%2B", "/caf\xc3\xa9"]


@needs_nginx
@pytest.mark.parametrize("matched", [False, True], ids=["default-rule", "header-query-method-rule"])
def test_the_edited_shape_sends_the_backend_the_request_uri_exactly(tmp_path: Path, matched: bool) -> None:
    backend_port = dataplane.free_port(f"{NET}.2")
    conf = dataplane.BACKEND_CONF.format(address=f"{NET}.2", port=backend_port, status_port=dataplane.free_port(f"{NET}.2"))
    backend = dataplane.Nginx("backend", tmp_path / "backend", f"{NET}.2", backend_port).start({"nginx.conf": conf.encode()}, 30)
    port = dataplane.free_port(f"{NET}.1")
    files = {k: v.replace(b"127.0.94.60:18080", f"{NET}.1:{port}".encode())
             .replace(b"127.0.95.1:18080", f"{NET}.2:{backend_port}".encode()) for k, v in fixture("static-upstream-3").items()}
    try:
        gw = dataplane.Nginx("gw", tmp_path / "gw", f"{NET}.1", port).start(files, 30)
    except RuntimeError:
        backend.stop()
        raise
    try:
        extra = b"x-env: canary\r\nx-user: u7\r\n" if matched else b""
        for uri in URIS:
            target = uri.encode("latin-1")
            if matched:  # the rule also wants ?v=1 (and GET)
                target += b"&v=1" if b"?" in target and not target.endswith(b"?") else b"v=1" if target.endswith(b"?") else b"?v=1"
            status, body = _raw(f"{NET}.1", port, b"GET " + target + b" HTTP/1.1\r\nHost: h-00001.example\r\n" + extra
                                + b"Connection: close\r\n\r\n")
            assert status == 200, (uri, body)
            assert body.split(" ")[1] == target.decode("latin-1"), (uri, body)
        # a POST through the internal redirect stays a POST (an error_page to a URI would make it a GET)
        c = http.client.HTTPConnection(f"{NET}.1", port, timeout=10)
        c.request("POST", "/api/x?v=1", body=b"hello", headers={"Host": "h-00001.example", "x-env": "canary", "x-user": "u7"})
        r = c.getresponse()
        assert (r.status, r.read().decode().split(" ")[2]) == (200, "POST")
        c.close()
    finally:
        gw.stop()
        backend.stop()
