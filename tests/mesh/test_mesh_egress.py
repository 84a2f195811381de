"""The egress port's configuration (mesh/egress.py): which ExternalService hosts get a server, with
which namespace's policies, and that a hostname reaches nginx.conf only when it is one (RFC 1123),
whatever a tenant writes (docs/security.md)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nginx_conf
from gwpolicy.engine import mesh as engine_mesh
from gwpolicy.mesh import egress
from gwpolicy.mesh.render import MeshConfig, build
from mesh_harness import namespace
from test_gateway_render import nginx_t

ADDRESS = "198.51.100.7"
LISTEN = ("127.0.0.1", 3128)
MARK = "gwinjected"


def _policy(kind: str, ns: str, host: str, spec: dict, name: str = "p") -> dict:
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"targetRef": {"group": "gwpolicy.io", "kind": "ExternalService", "name": host}, "default": spec}}


def _render(objs: list[dict], client: str, known: dict[str, tuple[str, ...]] | None = None,
            ports: tuple[int, ...] = (80,)) -> tuple[dict[str, bytes], egress.HostAddresses]:
    addresses = egress.HostAddresses(dict(known or {}))
    _, files = build([namespace("a"), namespace("b"), *objs], client,
                     MeshConfig(egress=egress.EgressConfig(LISTEN, ports, ("192.0.2.53",), addresses)))
    return files, addresses


def _servers(files: dict[str, bytes]) -> dict[str, Any]:
    """The egress port's servers by server_name ("" for the default one)."""
    out = {}
    for d in nginx_conf.parse_files(files):
        for _, s in d.walk():
            if s.name != "server" or not s.block:
                continue
            listens = [x.args for x in s.block if x.name == "listen"]
            if not any(a[0] == f"{LISTEN[0]}:{LISTEN[1]}" for a in listens):
                continue
            names = [x.args for x in s.block if x.name == "server_name"]
            out[names[0][0] if names else ""] = s
    return out


def _directives(server: Any) -> list[str]:
    return [f"{d.name} {' '.join(d.args)}" for _, d in server.walk()]


def test_a_namespaces_policy_on_an_external_service_reaches_only_its_own_proxy():
    objs = [_policy("TimeoutPolicy", "a", "api.example.com", {"readTimeout": "1s"}),
            _policy("RetryPolicy", "a", "api.example.com", {"attempts": 3, "codes": [503]})]
    known = {"api.example.com": (ADDRESS, "2001:db8::7")}
    a_files, asked = _render(objs, "a", known)
    b_files, _ = _render(objs, "b", known)
    assert asked.asked == ("api.example.com",)
    a, b = _servers(a_files)["api.example.com"], _servers(b_files)["api.example.com"]
    assert "proxy_read_timeout 1s" in _directives(a) and "proxy_next_upstream_tries 3" in _directives(a)
    assert not any(d.startswith(("proxy_read_timeout", "proxy_next_upstream")) for d in _directives(b))
    # each address listed once per try (NGINX tries each listed server once), on the egress port
    ups = {d.args[0]: d for top in nginx_conf.parse_files(a_files) for _, d in top.walk() if d.name == "upstream"}
    mine = ups[egress.upstream_name("api.example.com", 80)]
    assert sorted(x.args[0] for x in mine.block if x.name == "server") == \
        sorted([f"{ADDRESS}:80", "[2001:db8::7]:80"] * 3)
    # both proxies pass every other host through, with the nameservers they were given
    for files in (a_files, b_files):
        default = _servers(files)[""]
        assert "resolver 192.0.2.53 valid=30s" in _directives(default)
        assert "proxy_pass http://$egress_host:$egress_port$request_uri" in _directives(default)


def test_a_policy_in_another_namespace_targeting_an_external_service_is_that_namespaces():
    """A policy targets an ExternalService from its own namespace only: b's policy is b's, even when
    b's and a's name the same host (M9: each namespace is its own consumer)."""
    objs = [_policy("TimeoutPolicy", "a", "api.example.com", {"readTimeout": "1s"}),
            _policy("TimeoutPolicy", "b", "api.example.com", {"readTimeout": "7s"})]
    known = {"api.example.com": (ADDRESS,)}
    assert "proxy_read_timeout 1s" in _directives(_servers(_render(objs, "a", known)[0])["api.example.com"])
    assert "proxy_read_timeout 7s" in _directives(_servers(_render(objs, "b", known)[0])["api.example.com"])
    c = _directives(_servers(_render(objs, "c", known)[0])["api.example.com"])
    assert not any(d.startswith("proxy_read_timeout") for d in c)


def test_a_host_without_addresses_answers_502_and_other_ports_are_refused():
    objs = [_policy("TimeoutPolicy", "a", "api.example.com", {"readTimeout": "1s"}),
            _policy("TimeoutPolicy", "a", "nowhere.example.com", {"readTimeout": "1s"}, name="q")]
    files, addresses = _render(objs, "a", {"api.example.com": (ADDRESS,), "nowhere.example.com": ()}, ports=(80, 8080))
    assert addresses.missing() == []
    servers = _servers(files)
    assert "return 502 gwpolicy egress: nowhere.example.com does not resolve" in _directives(servers["nowhere.example.com"])
    assert not any(d.startswith("proxy_pass") for d in _directives(servers["nowhere.example.com"]))
    maps = files["maps.conf"].decode()
    assert f'"api.example.com:80" {egress.upstream_name("api.example.com", 80)};' in maps
    assert f'"api.example.com:8080" {egress.upstream_name("api.example.com", 8080)};' in maps
    assert "return 403 gwpolicy egress: not an egress port of this proxy" in _directives(servers["api.example.com"])
    # a host asked for the first time is not resolved yet: the proxy resolves what `missing` says
    _, fresh = _render(objs, "a")
    assert fresh.missing() == ["api.example.com", "nowhere.example.com"]


def test_without_an_egress_port_nothing_is_added():
    objs = [namespace("a"), _policy("TimeoutPolicy", "a", "api.example.com", {"readTimeout": "1s"})]
    _, files = build(objs, "a", MeshConfig())
    assert b"egress" not in b"".join(files.values())


# -- hostile names ----------------------------------------------------------------------------

PIECES = ["", "a", "-", ".", "..", "x" * 64, ";", "{", "}", "#", '"', "'", "$host", "\\", " ", "\n", "\r", "*", "~",
          f"\n return 200 {MARK};\n", "} server { listen 1; ", "A", "_", ":80", "/"]
names = st.lists(st.sampled_from(PIECES) | st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), min_size=1, max_size=6) \
    .map(lambda parts: "".join(parts) + MARK)


@pytest.mark.skipif(shutil.which("nginx") is None, reason="NGINX is not installed (./dev test installs it)")
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=names)
def test_a_hostname_reaches_nginx_conf_only_when_it_is_one(tmp_path, monkeypatch, name):
    """Even with the engine's check of ExternalService names switched off (every name gets mesh paths),
    the egress port serves only RFC 1123 hostnames, quoted; any other name is nowhere in the files,
    and NGINX loads them."""
    monkeypatch.setattr(engine_mesh, "is_subdomain", lambda _: True)
    _check(tmp_path, name)


def _check(tmp: Path, name: str) -> None:
    files, _ = _render([_policy("TimeoutPolicy", "a", name, {"readTimeout": "1s"})], "a", {name: (ADDRESS,)})
    run = nginx_t(tmp / "t", files)
    assert run.returncode == 0, run.stderr[-2000:]
    servers = _servers(files)
    valid = egress.is_hostname(name)
    assert sorted(servers) == sorted(["", name] if valid else [""])
    text = b"".join(files.values()).decode()
    if valid:
        assert [d.quoted for d in servers[name].block if d.name == "server_name"] == [[True]]
    else:
        assert MARK not in text
    # as a word of its own, the marker is nowhere (inside a generated name's characters it is no word)
    marked = re.compile(rf"(?<![A-Za-z0-9_.]){MARK}(?![A-Za-z0-9_])")
    for top in nginx_conf.parse_files(files):
        for path, d in top.walk():
            assert not any(marked.search(w) for w in nginx_conf.unquoted_words(d)), (path, d)


def test_the_property_sees_an_injection(tmp_path, monkeypatch):
    """The checks are not blind: with the hostname check off and the host written unquoted, a name
    carrying a directive fails them."""
    monkeypatch.setattr(engine_mesh, "is_subdomain", lambda _: True)
    monkeypatch.setattr(egress, "is_hostname", lambda _: True)
    monkeypatch.setattr(egress, "quote", lambda value: value)
    with pytest.raises((AssertionError, nginx_conf.ConfSyntaxError)):
        _check(tmp_path, f"x; return 200 {MARK}; #")


@pytest.mark.parametrize("name, ok", [
    ("api.example.com", True), ("a", True), ("a-b.c-d", True), ("x" * 63 + ".com", True),
    ("x" * 64 + ".com", False), ("Api.example.com", False), ("-a.com", False), ("a-.com", False), ("a..com", False),
    (".a.com", False), ("a.com.", False), ("a_b.com", False), ("*.example.com", False), ("a.com:80", False),
    ("", False), (".".join(["a" * 63] * 4), False), (".".join(["a" * 49] * 5), True),
])
def test_which_names_are_hostnames(name, ok):
    assert egress.is_hostname(name) is ok


def test_listen_addresses_and_ports_are_checked():
    assert egress.parse_listen("127.0.0.1:3128") == ("127.0.0.1", 3128)
    assert egress.parse_listen("[::1]:8888") == ("::1", 8888)
    assert egress.parse_listen("off") is None
    for bad in ("3128", "localhost:3128", "127.0.0.1:0", "127.0.0.1:70000", "::1:80", "1.2.3:4", "127.0.0.1:x"):
        with pytest.raises(ValueError, match="is not ADDRESS:PORT"):
            egress.parse_listen(bad)
    assert egress.parse_ports("80, 8080,80") == (80, 8080)
    for bad in ("", "0", "80,", "http", "65536"):
        with pytest.raises(ValueError, match="is not a port"):
            egress.parse_ports(bad)


def test_nameservers_and_addresses_are_read_as_the_system_gives_them(tmp_path):
    conf = tmp_path / "resolv.conf"
    conf.write_text("# a comment\nsearch svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\n"
                    "nameserver not-an-address\nnameserver 10.96.0.10\nnameserver 1.1.1.1\nnameserver 8.8.8.8\n")
    assert egress.nameservers(conf) == ("10.96.0.10", "fd00::a", "1.1.1.1")
    assert egress.nameservers(tmp_path / "missing") == ()
    assert "127.0.0.1" in egress.resolve("localhost")  # /etc/hosts


def test_addresses_the_gateway_would_never_connect_to_are_left_out():
    """Link-local (cloud metadata), multicast and unspecified addresses never, loopback only when the
    proxy allows loopback endpoints: as for a Service's endpoints (gateway/dataplane endpoint_problem)."""
    objs = [_policy("TimeoutPolicy", "a", "api.example.com", {"readTimeout": "1s"}),
            _policy("TimeoutPolicy", "a", "metadata.example.com", {"readTimeout": "1s"}, name="q")]
    known = {"api.example.com": ("127.0.0.1", ADDRESS, "224.0.0.1"), "metadata.example.com": ("169.254.169.254", "fe80::1")}

    def upstream_servers(files: dict[str, bytes]) -> list[str]:
        ups = {d.args[0]: d for top in nginx_conf.parse_files(files) for _, d in top.walk() if d.name == "upstream"}
        return sorted(x.args[0] for x in ups[egress.upstream_name("api.example.com", 80)].block if x.name == "server")

    files, _ = _render(objs, "a", known)
    assert upstream_servers(files) == [f"{ADDRESS}:80"]
    metadata = _directives(_servers(files)["metadata.example.com"])
    assert "return 502 gwpolicy egress: metadata.example.com has no address the proxy may use" in metadata
    assert not any(d.startswith("proxy_pass") for d in metadata)
    addresses = egress.HostAddresses(dict(known))
    _, allowed = build([namespace("a"), *objs], "a", MeshConfig(egress=egress.EgressConfig(LISTEN, (80,), (), addresses,
                                                                                      allow_loopback=True)))
    assert upstream_servers(allowed) == ["127.0.0.1:80", f"{ADDRESS}:80"]


def test_the_egress_flags_say_what_is_wrong(capsys):
    from gwpolicy.mesh.proxy import parse

    for argv, want in ((["--egress-listen", "localhost:3128"], "--egress-listen: 'localhost:3128' is not ADDRESS:PORT"),
                       (["--egress-ports", "80,x"], "--egress-ports: '80,x': 'x' is not a port"),
                       (["--egress-resolve-interval", "0"], "--egress-resolve-interval: 0 must be a positive number")):
        with pytest.raises(SystemExit) as exit_:
            parse(["-n", "a", *argv])
        assert exit_.value.code == 1 and want in capsys.readouterr().err
    opts = parse(["-n", "a"])
    assert (opts.egress_listen, opts.egress_ports, opts.egress_resolve_interval) == (("127.0.0.1", 3128), (80,), 30.0)
    opts = parse(["-n", "a", "--egress-listen", "off", "--egress-ports", "80,8080", "--egress-resolve-interval", "5"])
    assert (opts.egress_listen, opts.egress_ports, opts.egress_resolve_interval) == (None, (80, 8080), 5.0)
