"""The translated mesh conformance cases (tests/data/mesh-conformance) hold together: every name
they use resolves, every expectation is one the gateway cases' comparison can pass (and fails when
the wrong backend answers), and the README's coverage table is the files' own.

The cases run against `gwpolicy mesh` in network namespaces in tests/mesh/test_mesh_conformance.py;
these tests keep the data honest.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import gwconformance
import meshconformance as mc
from gwpolicy.gateway.echo import canonical

BASE = mc.load_base()
NAMES = mc.case_names()
CASES = {n: mc.load_case(n) for n in NAMES}
CLIENTS = {c["namespace"] for c in BASE["clients"]}
SERVICES = {(m["metadata"]["namespace"], m["metadata"]["name"]): m for m in BASE["manifests"] if m["kind"] == "Service"}
BACKENDS = {(b["namespace"], b["podNamePrefix"]): b for b in BASE["backends"]}
MESH_CONTROLLER = BASE["mesh"]["controllerName"]
REDIRECTS = (301, 302, 303, 307, 308)


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _port(svc: dict[str, Any], number: int) -> dict[str, Any] | None:
    return next((p for p in svc["spec"]["ports"] if p["port"] == number), None)


def test_every_mesh_http_test_is_here() -> None:
    assert len(NAMES) == 21, NAMES
    for name, case in CASES.items():
        assert case["name"] == name
        assert case["source"].startswith("conformance/tests/mesh/") and case["source"].endswith(".go")
        assert "Mesh" in case["features"] and "HTTPRoute" in case["features"] or name == "MeshBasic"


def test_the_base_has_an_xmesh_of_ours_and_backends_behind_every_service() -> None:
    xmesh = BASE["manifests"][0]
    assert (xmesh["kind"], xmesh["metadata"]["name"], xmesh["spec"]["controllerName"]) == \
        ("XMesh", BASE["mesh"]["name"], MESH_CONTROLLER)
    for (ns, name), svc in SERVICES.items():
        selected = [b for b in BASE["backends"] if b["namespace"] == ns and _labels_match(svc["spec"]["selector"], b["labels"])]
        assert selected, f"Service {ns}/{name} selects no backend"
        for b in selected:
            assert name in b["services"], (name, b["deployment"])
            listens = {l["port"] for l in b["listens"]}
            for p in svc["spec"]["ports"]:
                assert p.get("targetPort", p["port"]) in listens, (name, p)
    assert CLIENTS == set(BASE["readiness"]["namespaces"])


@pytest.mark.parametrize("name", NAMES)
def test_every_request_resolves(name: str) -> None:
    case = CASES[name]
    services = dict(SERVICES)
    for m in case["manifests"]:
        assert m["kind"] == "HTTPRoute", f"{name}: only routes are added by a mesh case, not {m['kind']}"
    for entry in mc.all_requests(case):
        where = f"{name} {entry.get('name') or entry['request']['path']}"
        assert entry["from"] in CLIENTS, where
        to = entry["to"]
        if "service" in to:
            svc = services.get((to["namespace"], to["service"]))
            assert svc is not None, f"{where}: no Service {to}"
            assert _port(svc, to["port"]) is not None, f"{where}: Service {to['service']} has no port {to['port']}"
            # the Host header is what DNS would have been asked, unless the test sets it by hand
            host = entry["request"]["host"]
            if not entry.get("notes", "").startswith("Connects to"):
                hostname, _, port = host.partition(":")
                short, _, ns = hostname.partition(".")
                assert (short, ns or entry["from"], int(port or 80)) == (to["service"], to["namespace"], to["port"]), where
        else:
            assert (to["namespace"], to["endpointOf"]) in BACKENDS, where
            assert to["port"] in {l["port"] for l in BACKENDS[(to["namespace"], to["endpointOf"])]["listens"]}, where
        if entry.get("backend"):
            assert any(p.startswith(entry["backend"]) for _, p in BACKENDS), where
        code = (entry.get("response") or {}).get("statusCode")
        if code in REDIRECTS:
            assert entry["request"].get("unfollowRedirect") is True and "redirect" in entry, where
        if code == 200:
            assert entry["namespace"] == "gateway-conformance-mesh", where


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n]["manifests"]])
def test_routes_attach_to_services_of_the_base_and_have_status(name: str) -> None:
    case = CASES[name]
    routes = {(m["metadata"]["namespace"], m["metadata"]["name"]): m for m in case["manifests"]}
    expected = {(s["object"]["namespace"], s["object"]["name"]): s for s in case["status"]}
    assert set(expected) == set(routes), name
    for key, route in routes.items():
        parents = expected[key]["parents"]
        assert len(parents) == len(route["spec"]["parentRefs"])
        for ref, exp in zip(route["spec"]["parentRefs"], parents):
            ns = ref.get("namespace", key[0])
            assert (ref.get("group"), ref.get("kind")) == ("", "Service")
            assert (ns, ref["name"]) in SERVICES
            if "port" in ref:
                assert _port(SERVICES[(ns, ref["name"])], ref["port"]) is not None
            assert exp["parentRef"] == {"group": "", "kind": "Service", "namespace": ns, "name": ref["name"]}
            assert exp["controllerName"] == MESH_CONTROLLER and exp["namespaceRequired"] == (ns != key[0])
        for rule in route["spec"]["rules"]:
            for b in rule.get("backendRefs") or []:
                svc = SERVICES.get((b.get("namespace", key[0]), b["name"]))
                assert svc is not None and _port(svc, b["port"]) is not None, (name, b)


def _answer(entry: dict[str, Any], pod: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """What a correct mesh would return for the entry: the echo JSON of what the backend should see."""
    status = entry["response"].get("statusCode", 200)
    headers: list[tuple[str, str]] = []
    for name, value in (entry["response"].get("headers") or {}).items():
        headers.append((name, value))
    if status in REDIRECTS:
        red, req = entry["redirect"], entry["request"]
        scheme = red.get("scheme", "http")
        host = red.get("host", req["host"])
        port = f":{red['port']}" if red.get("port") else ""
        headers.append(("Location", f"{scheme}://{host}{port}{red.get('path', req['path'].split('?')[0])}"))
        return status, headers, b""
    if status != 200:
        return status, headers, b"not found"
    want = entry.get("expectedRequest") or entry["request"]
    seen = {canonical(k): [v] for k, v in (want.get("headers") or {}).items()}
    body = {"path": want["path"], "host": entry["request"]["host"], "method": want["method"], "headers": seen,
            "namespace": entry["namespace"], "pod": pod}
    headers.append(("Content-Type", "application/json"))
    return status, headers, json.dumps(body).encode()


@pytest.mark.parametrize("name", NAMES)
def test_every_expectation_can_pass_and_fails_for_the_wrong_backend(name: str) -> None:
    for entry in CASES[name]["requests"]:
        where = f"{name} {entry.get('name') or entry['request']['path']}"
        host = mc.substitute(entry["request"]["host"], {("gateway-conformance-mesh", "echo-v2"): ["198.18.0.9"]})
        entry = mc.with_host(entry, host)
        backend = entry.get("backend") or "echo-v1"
        status, headers, body = _answer(entry, f"{backend}-6d9f7c5b8-x4k2p")
        assert gwconformance.compare(entry, status, headers, body) is None, where
        if entry.get("backend"):
            other = "echo-v2" if backend == "echo-v1" else "echo-v1"
            status, headers, body = _answer(entry, f"{other}-6d9f7c5b8-x4k2p")
            assert gwconformance.compare(entry, status, headers, body) is not None, f"{where}: passes with {other}"
        if status == 200 and entry["response"].get("absentHeaders"):
            leaked = headers + [(h, "x") for h in entry["response"]["absentHeaders"]]
            assert gwconformance.compare(entry, status, leaked, body) is not None, where


def test_targets_resolve_to_cluster_ips_and_pod_ips() -> None:
    cluster_ips = {key: f"198.19.0.{i + 10}" for i, key in enumerate(sorted(SERVICES))}
    pod_ips = {("gateway-conformance-mesh", "echo-v2"): ["198.18.0.21"], ("gateway-conformance-mesh", "echo-v1"): ["198.18.0.20"]}
    frontend = CASES["MeshFrontend"]["requests"]
    to_service = mc.target(frontend[0], cluster_ips, pod_ips)
    assert to_service == mc.Target("gateway-conformance-mesh", cluster_ips[("gateway-conformance-mesh", "echo-v2")], 80, "echo-v2")
    assert mc.target(frontend[1], cluster_ips, pod_ips) == mc.Target("gateway-conformance-mesh", "198.18.0.21", 8080, "198.18.0.21:8080")
    consumer = mc.target(CASES["MeshConsumerRoute"]["requests"][0], cluster_ips, pod_ips)
    assert (consumer.client_namespace, consumer.port, consumer.host) == \
        ("gateway-conformance-mesh-consumer", 80, "echo-v1.gateway-conformance-mesh")
    with pytest.raises(KeyError, match="no instance"):
        mc.substitute("${podIP:gateway-conformance-mesh/nope}", pod_ips)


def test_the_readme_table_is_the_files() -> None:
    readme = (mc.CASES_DIR / "README.md").read_text()
    rows = re.findall(r"^\| \[(\w+)\]\(\1\.yaml\) \| ([^|]+) \| (\d+) \|", readme, re.M)
    assert sorted(r[0] for r in rows) == NAMES
    for name, profile, count in rows:
        case = CASES[name]
        want = case["profile"].removeprefix("MESH-HTTP ") + (", provisional" if case.get("provisional") else "")
        assert profile.strip() == want, name
        assert int(count) == len(case["requests"]), name
    total = sum(len(c["requests"]) for c in CASES.values())
    assert f"{len(NAMES)} cases, {total} request expectations" in readme


def test_the_xmesh_claims_the_mesh_features_of_the_cases_and_no_others() -> None:
    """The XMesh's status.supportedFeatures (engine/meshstatus.py) names every mesh feature a
    translated case needs, and nothing that no case exercises (every case passes:
    tests/mesh/test_mesh_conformance.py has no gaps); Gateway features are never named there (the
    suite drops them with a warning)."""
    from gwpolicy.engine.meshstatus import MESH_FEATURES

    needed = {f for name in mc.case_names() for f in mc.load_case(name)["features"] if f.startswith("Mesh")}
    assert set(MESH_FEATURES) == needed and len(MESH_FEATURES) == len(needed)
