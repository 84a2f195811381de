"""The pure data plane and its NGINX rendering: golden files, `nginx -t`, and the routing rules as
properties (hostname intersection, match precedence) checked without a running NGINX.

The golden files of the rendering (tests/golden/render/, one case per feature and per policy kind)
are compared in test_gateway_golden.py.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS, nginx_choice
from gwpolicy.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, MatchRule, VirtualHost, build_dataplane, intersect_hostname
from gwpolicy.gateway.dataplane.order import place_locations, segment_prefix
from gwpolicy.gateway.render import render
from gwpolicy.refs import GATEWAY_GROUP, Ref
from gwpolicy.topology import hostnames_intersect

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "render"
BASIC = GOLDEN / "features" / "basic" / "input.yaml"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def rendered(objects: list[dict[str, Any]], **config: Any) -> dict[str, bytes]:
    a = analyse(objects, kind_checks=policyconf.kind_checks())
    return render(build_dataplane(a, DataPlaneConfig(**{**TEST_ENDPOINTS, **config})))


def nginx_t(tmp: Path, files: dict[str, bytes]) -> subprocess.CompletedProcess[str]:
    gen = tmp / "gen"
    for rel, data in files.items():
        (gen / rel).parent.mkdir(parents=True, exist_ok=True)
        (gen / rel).write_bytes(data)
    for d in ("run", "logs"):
        (tmp / d).mkdir(exist_ok=True)
    return subprocess.run(["nginx", "-t", "-p", f"{gen}/", "-c", str(gen / "nginx.conf"), "-e", str(tmp / "logs" / "t.log")],
                          capture_output=True, text=True, timeout=120)


def test_rendering_is_deterministic_whatever_the_input_order() -> None:
    objects = load(BASIC)
    first = rendered(objects)
    for seed in range(3):
        shuffled = objects[:]
        random.Random(seed).shuffle(shuffled)
        assert rendered(shuffled) == first


@pytest.mark.skipif(shutil.which("nginx") is None, reason="NGINX is not installed (./dev test installs it)")
def test_nginx_accepts_every_golden_tree(tmp_path: Path) -> None:
    from test_gateway_golden import CASES, case_files

    for case in CASES:
        out = nginx_t(tmp_path / case.parent.name / case.name, {rel: text.encode() for rel, text in case_files(case).items()})
        assert out.returncode == 0, out.stderr
        assert "[warn]" not in out.stderr, out.stderr


@pytest.mark.skipif(shutil.which("nginx") is None, reason="NGINX is not installed (./dev test installs it)")
def test_nginx_accepts_the_synthetic_cluster(tmp_path: Path) -> None:
    from gwpolicy.bench.gateway import gateway_cluster

    files = rendered(list(gateway_cluster(200)), controller_name=None)
    out = nginx_t(tmp_path, files)
    assert out.returncode == 0, out.stderr
    assert "[warn]" not in out.stderr, out.stderr


def test_gwpolicy_render_prints_every_file_but_no_private_key(tmp_path: Path) -> None:
    from gateway_kit import self_signed, tls_secret
    from helpers import run_cli, write_manifests

    objects = load(BASIC)
    cert, key = self_signed(tmp_path, "c", ["secure.test"])
    objects[1]["spec"]["listeners"].append({"name": "https", "port": 18443, "protocol": "HTTPS",
                                            "tls": {"certificateRefs": [{"name": "cert"}]}})
    objects.append(tls_secret("cert", "infra", cert.read_bytes(), key.read_bytes()))
    run = run_cli("render", "-f", str(write_manifests(tmp_path, objects)))
    assert run.code == 0, run.err
    for name in ("nginx.conf", "servers.conf", "upstreams.conf", "maps.conf", "secrets/infra_cert.pem"):
        assert f"# ==== {name} ====" in run.out
    assert "PRIVATE KEY" not in run.out and "BEGIN CERTIFICATE" not in run.out
    assert "listen 127.0.10.1:18443 default_server ssl;" in run.out
    bad = run_cli("render", "-f", str(tmp_path / "nowhere"))
    assert bad.code == 1 and "nowhere" in bad.err and "Traceback" not in bad.err


# ---------------------------------------------------------------------------------------------
# facts for the status layer


def test_facts_name_what_was_not_programmed_and_why() -> None:
    objects = load(BASIC)
    objects[1]["spec"]["listeners"].append({"name": "tls", "port": 18443, "protocol": "HTTPS",
                                            "tls": {"certificateRefs": [{"name": "absent"}]}})
    objects[1]["spec"]["listeners"].append({"name": "udp", "port": 18444, "protocol": "UDP"})
    dp = build_dataplane(analyse(objects), DataPlaneConfig(**TEST_ENDPOINTS))
    gw = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")
    facts = {l.section: (f.programmed, f.reason) for l, f in dp.listeners.items()}
    assert facts == {"http": (True, ""), "wild": (True, ""), "tls": (False, "InvalidCertificateRef"),
                     "udp": (False, "UnsupportedProtocol")}
    assert dp.addresses == {gw: "127.0.10.1"}
    filters = dp.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "filters")]
    assert sorted(l.section for l in filters.listeners) == ["http", "wild"]
    assert sorted((rule, reason) for rule, _, reason, _ in filters.unresolved) == [(2, "BackendNotFound"), (3, "RefNotPermitted")]


def test_gateways_of_other_controllers_are_not_rendered() -> None:
    objects = load(BASIC)
    objects[0]["spec"]["controllerName"] = "example.io/other"
    dp = build_dataplane(analyse(objects), DataPlaneConfig(**TEST_ENDPOINTS))
    assert dp.servers == [] and dp.addresses == {}


def test_addresses_come_from_the_pool_and_stay_with_the_status() -> None:
    objects = load(BASIC)
    del objects[1]["spec"]["addresses"]
    second = yaml.safe_load(yaml.safe_dump(objects[1]))
    second["metadata"]["name"] = "gw2"
    objects.append(second)
    dp = build_dataplane(analyse(objects), DataPlaneConfig(**TEST_ENDPOINTS, address_pool="127.0.11.0/24"))
    assert sorted(dp.addresses.values()) == ["127.0.11.1", "127.0.11.2"]
    objects[1]["status"] = {"addresses": [{"type": "IPAddress", "value": "127.0.11.7"}]}
    dp = build_dataplane(analyse(objects), DataPlaneConfig(**TEST_ENDPOINTS, address_pool="127.0.11.0/24"))
    assert dp.addresses[Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")] == "127.0.11.7"


# ---------------------------------------------------------------------------------------------
# hostnames: the data plane agrees with the engine's attachment rule

LABELS = st.sampled_from(["a", "b", "example", "com"])
HOST = st.builds(lambda wild, labels: ("*." if wild else "") + ".".join(labels), st.booleans(),
                 st.lists(LABELS, min_size=1, max_size=3))


def _matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return pattern == host


@settings(max_examples=300, deadline=None)
@given(HOST, HOST, st.lists(LABELS, min_size=1, max_size=4))
def test_hostname_intersection_serves_exactly_the_hosts_both_match(listener: str, route: str, labels: list[str]) -> None:
    got = intersect_hostname(listener, route)
    assert (got is not None) == hostnames_intersect(listener, [route])
    request_host = ".".join(labels)
    if got is not None:
        served = _matches(listener, request_host) if got == "" else _matches(got, request_host)
        assert served == (_matches(listener, request_host) and _matches(route, request_host))


# ---------------------------------------------------------------------------------------------
# precedence: locations + candidate lists choose what the spec's ordering over all rules chooses

SEGMENTS = st.sampled_from(["a", "b", "ab"])
PATHS = st.lists(SEGMENTS, min_size=0, max_size=3).map(lambda s: "/" + "/".join(s))


@st.composite
def rules(draw: Any) -> list[MatchRule]:
    from gwpolicy.gateway.dataplane import Action

    out = []
    for i in range(draw(st.integers(1, 8))):
        ptype = draw(st.sampled_from(["Exact", "PathPrefix"]))
        value = draw(PATHS)
        action = Action(f"r{i}", Ref(GATEWAY_GROUP, "HTTPRoute", "ns", f"route{i % 3}"), i, 0,
                        Ref(GATEWAY_GROUP, "Gateway", "ns", "gw", "l"), "http", 80, ptype, value, (), [], {}, ())
        headers = tuple(("Exact", n, "1") for n in draw(st.lists(st.sampled_from(["x", "y"]), unique=True, max_size=2)))
        method = draw(st.sampled_from([None, None, "POST"]))
        out.append(MatchRule(action, method, headers, (), f"2024-01-0{1 + i % 3}", f"ns/route{i % 3}"))
    return out


def _spec_choice(rules_: list[MatchRule], path: str, method: str, headers: set[str]) -> MatchRule | None:
    """The Gateway API rule, straight from the spec text: every matching rule, ordered by precedence."""
    def matches(r: MatchRule) -> bool:
        a = r.action
        path_ok = a.path_value == path if a.path_type == "Exact" else segment_prefix(a.path_value, path)
        return path_ok and (r.method is None or r.method == method) and all(h[1] in headers for h in r.headers)
    hits = sorted((r for r in rules_ if matches(r)), key=MatchRule.precedence)
    return hits[0] if hits else None


@settings(max_examples=400, deadline=None)
@given(rules(), PATHS, st.booleans(), st.sets(st.sampled_from(["x", "y"])), st.booleans())
def test_the_rule_nginx_picks_is_the_one_the_spec_ranks_first(rules_: list[MatchRule], path: str, post: bool,
                                                               headers: set[str], slash: bool) -> None:
    if slash and path != "/":
        path += "/"
    for r in rules_:
        if r.action.path_type == "PathPrefix" and len(r.action.path_value) > 1:
            r.action.path_value = r.action.path_value.rstrip("/")
    vh = VirtualHost("0", "")
    place_locations(vh, rules_)
    method = "POST" if post else "GET"
    want = _spec_choice(rules_, path, method, headers)
    got = nginx_choice(vh, path, method, headers)
    assert (got.action.id if got else None) == (want.action.id if want else None)


@pytest.mark.skipif(shutil.which("nginx") is None, reason="NGINX is not installed (./dev test installs it)")
def test_values_from_manifests_cannot_break_or_smuggle_into_the_configuration(tmp_path: Path) -> None:
    objects = load(BASIC)
    hostile = "X-A; return 200 pwned; #"
    objects.append({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": {"name": "hostile", "namespace": "infra"},
                    "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}],
                             "hostnames": ["ok.example.com", "bad;host { }"],
                             "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/a;b {"}}],
                                        "backendRefs": [{"name": "v1", "port": 8080}]},
                                       {"matches": [{"path": {"type": "PathPrefix", "value": "/h"}, "headers": [{"name": hostile, "value": "1"}]}],
                                        "backendRefs": [{"name": "v1", "port": 8080}]},
                                       {"matches": [{"path": {"type": "PathPrefix", "value": "/s"}}],
                                        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                                            "set": [{"name": hostile, "value": "x"}, {"name": "X-Ok", "value": "$secret"}]}}],
                                        "backendRefs": [{"name": "v1", "port": 8080}]}]}})
    files = rendered(objects)
    text = "\n".join(l for l in b"".join(files.values()).decode().splitlines() if not l.strip().startswith("#"))
    assert "pwned" not in text and "bad;host" not in text and "$secret" not in text
    assert 'location "/_v' in text  # the path with ';' and '{' is quoted, not parsed
    out = nginx_t(tmp_path, files)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------------------------
# whatever a server hands us (objects without defaults, values the CRD schema would refuse): a data
# plane, never a traceback (the shapes the engine itself walks are load.py's to validate)

JUNK = st.one_of(st.none(), st.integers(-3, 70000), st.booleans(), st.text(max_size=6), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _maybe(strategy: Any) -> Any:
    return st.one_of(strategy, JUNK)


MATCH = st.fixed_dictionaries({}, optional={
    "path": _maybe(st.fixed_dictionaries({"type": _maybe(st.sampled_from(["Exact", "PathPrefix", "RegularExpression"])),
                                          "value": _maybe(st.sampled_from(["/", "/a", "/a/", "a", "/a b", '/"x'])) })),
    "headers": _maybe(st.lists(st.fixed_dictionaries({"name": _maybe(st.sampled_from(["x", "X-Y", "bad name"])),
                                                      "value": _maybe(st.text(max_size=4))}), max_size=2)),
    "queryParams": _maybe(st.lists(st.fixed_dictionaries({"name": _maybe(st.sampled_from(["q", "a-b", "x y"])),
                                                          "value": JUNK}), max_size=2)),
    "method": _maybe(st.sampled_from(["GET", "POST"])),
})
FILTER = st.fixed_dictionaries({"type": _maybe(st.sampled_from(list(("RequestHeaderModifier", "ResponseHeaderModifier",
                                                                     "RequestRedirect", "URLRewrite", "CORS", "RequestMirror"))))},
                               optional={"requestHeaderModifier": _maybe(st.fixed_dictionaries({}, optional={
                                             "set": _maybe(st.lists(st.fixed_dictionaries({"name": JUNK, "value": JUNK}), max_size=2)),
                                             "remove": _maybe(st.lists(JUNK, max_size=2))})),
                                         "requestRedirect": _maybe(st.fixed_dictionaries({}, optional={
                                             "statusCode": JUNK, "port": JUNK, "scheme": JUNK, "hostname": JUNK,
                                             "path": _maybe(st.fixed_dictionaries({"type": _maybe(st.sampled_from(["ReplaceFullPath", "ReplacePrefixMatch"]))}))})),
                                         "urlRewrite": _maybe(st.fixed_dictionaries({}, optional={"hostname": JUNK, "path": JUNK})),
                                         "requestMirror": _maybe(st.fixed_dictionaries({}, optional={
                                             "backendRef": _maybe(st.fixed_dictionaries({"name": st.sampled_from(["v1", "nosuch"])},
                                                                                        optional={"port": _maybe(st.just(8080))})),
                                             "percent": JUNK, "fraction": _maybe(st.fixed_dictionaries({}, optional={
                                                 "numerator": JUNK, "denominator": JUNK}))})),
                                         "cors": _maybe(st.fixed_dictionaries({}, optional={"allowOrigins": _maybe(st.lists(JUNK, max_size=2)),
                                                                                            "allowMethods": _maybe(st.lists(JUNK, max_size=2)),
                                                                                            "maxAge": JUNK}))})
RULE = st.fixed_dictionaries({}, optional={
    "matches": _maybe(st.lists(MATCH, max_size=2)),
    "filters": _maybe(st.lists(FILTER, max_size=2)),
    # the engine walks backendRefs itself (and load.py validates them): only their values vary here
    "backendRefs": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["v1", "v2", "nosuch"])},
                                                  optional={"port": _maybe(st.just(8080)), "weight": JUNK,
                                                            "kind": st.sampled_from(["Service", "Thing"]),
                                                            "namespace": st.sampled_from(["infra", "elsewhere"]),
                                                            "filters": _maybe(st.lists(FILTER, max_size=1))}),
                            max_size=3),
})


@settings(max_examples=150, deadline=None)
@given(st.lists(RULE, max_size=3), _maybe(st.lists(_maybe(st.sampled_from(["a.example.com", "*.example.com", "x;y"])), max_size=2)))
def test_any_route_a_server_might_hold_gives_a_data_plane_and_files(rules_: list[Any], hostnames: Any) -> None:
    objects = load(BASIC)
    objects.append({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "fuzz", "namespace": "infra"},
                    "spec": {"parentRefs": [{"name": "gw"}], "hostnames": hostnames, "rules": rules_}})
    files = rendered(objects)
    assert "servers.conf" in files
    text = files["servers.conf"].decode()
    assert text.count("{") == text.count("}")  # every block closed: nothing from the route broke the syntax


@pytest.mark.skipif(shutil.which("nginx") is None, reason="NGINX is not installed (./dev test installs it)")
def test_two_gateways_on_one_address_and_port_do_not_break_the_configuration(tmp_path: Path) -> None:
    objects = load(BASIC)
    second = yaml.safe_load(yaml.safe_dump(objects[1]))
    second["metadata"].update(name="gw2", creationTimestamp="2025-01-01T00:00:00Z")
    objects[1]["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
    objects.append(second)  # same spec.addresses and ports
    dp = build_dataplane(analyse(objects), DataPlaneConfig(**TEST_ENDPOINTS))
    facts = {(l.name, l.section): (f.programmed, f.reason) for l, f in dp.listeners.items()}
    assert facts[("gw", "http")] == (True, "") and facts[("gw2", "http")] == (False, "PortUnavailable")
    out = nginx_t(tmp_path, render(dp))
    assert out.returncode == 0, out.stderr
