"""The translated mesh conformance cases (tests/data/mesh-conformance, its README) against `gwpolicy
mesh`: one proxy per client namespace in a network namespace of its own, the suite's echo client
replaced by requests made from inside that network namespace, with the gateway cases' comparison
(tests/gwconformance.py), and each case's `status` entries (its routes' `status.parents[]` for
their Service parents, as the leader of the proxies writes them) with the gateway cases' status
check. The proxies run as deploy/'s ServiceAccount gwpolicy-mesh and share the Lease gwpolicy-mesh;
against kube-apiserver, nothing they ask is refused."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import gwconformance as gc
import meshconformance as mc
import netns
from gwpolicy.engine.meshstatus import MESH_FEATURES
from mesh_harness import Mesh

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

BASE = mc.load_base()
CONSISTENCY = 30.0  # the suite's time to consistency, with 3 good answers in a row
#: cases that do not pass, and why (docs/mesh.md "Conformance")
GAPS: dict[str, str] = {}


class MeshSuite:
    def __init__(self, kind: str, tmp: Any) -> None:
        clients = [c["namespace"] for c in BASE["clients"]]
        xmesh = next(o for o in BASE["manifests"] if o["kind"] == "XMesh")
        self.mesh = m = Mesh(kind, tmp, clients, xmesh=xmesh)
        try:
            m.server.install_deploy("80-mesh.yaml")
            m.apply([o for o in BASE["manifests"] if o["kind"] != "XMesh"])
            self.pod_ips: dict[tuple[str, str], list[str]] = {}
            for b in BASE["backends"]:
                echo = m.backend(b["namespace"], b["podNamePrefix"], port=8080)
                self.pod_ips[(b["namespace"], b["podNamePrefix"])] = [echo.address]
                for svc in b["services"]:
                    m.publish(b["namespace"], svc, [echo], {"http": 8080, "http-alt": 8080}, name=f"{svc}-{b['deployment']}")
            self.cluster_ips = {(o["metadata"]["namespace"], o["metadata"]["name"]): m.cluster_ip(o["metadata"]["namespace"],
                                                                                                o["metadata"]["name"])
                                for o in BASE["manifests"] if o["kind"] == "Service"}
            m.start_proxies("--lease-namespace", "gwpolicy-system", kubeconfig=m.server.identity("gwpolicy-mesh"))
            for client in clients:
                for (ns, name), ip in self.cluster_ips.items():
                    m.wait_serving(client, ip, 80, timeout=120)
        except BaseException:
            m.close()
            raise

    def send(self, entry: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes, dict[str, Any]]:
        t = mc.target(entry, self.cluster_ips, self.pod_ips)
        exp = mc.with_host(entry, t.host)
        req = entry["request"]
        status, headers, body = self.mesh.send(t.client_namespace, t.address, t.port, req["path"],
                                               method=req.get("method", "GET"), host=t.host,
                                               headers=dict(req.get("headers") or {}))
        return status, headers, body, exp

    def eventually(self, entry: dict[str, Any], timeout: float = CONSISTENCY) -> str | None:
        end = time.monotonic() + timeout
        ok, last = 0, "no request made"
        while time.monotonic() < end:
            try:
                status, headers, body, exp = self.send(entry)
            except OSError as exc:
                ok, last = 0, f"transport error: {exc}"
                time.sleep(0.1)
                continue
            why = gc.compare(exp, status, headers, body)
            if why is None:
                ok += 1
                if ok >= 3:
                    return None
            else:
                ok, last = 0, why
                time.sleep(0.1)
        return last

    def status(self, entries: list[dict[str, Any]], timeout: float = CONSISTENCY) -> str | None:
        """None once every entry's status holds (tests/gwconformance.py `check_status`), else why not."""
        end = time.monotonic() + timeout
        while True:
            why = next((w for w in (gc.check_status(e, self.mesh.get_object) for e in entries) if w), None)
            if why is None or time.monotonic() > end:
                return why
            time.sleep(0.1)

    def weights(self, w: dict[str, Any]) -> str | None:
        entry = dict(w, backend="")
        last = None
        for _ in range(w.get("maxRetries", 10)):
            counts: dict[str, int] = {}
            errors = []
            for _i in range(w["totalRequests"]):
                status, headers, body, exp = self.send(entry)
                why = gc.compare(exp, status, headers, body)
                if why:
                    errors.append(why)
                else:
                    b = gc.pod_backend(json.loads(body)["pod"])
                    counts[b] = counts.get(b, 0) + 1
            want = w["expectedWeights"]
            if errors:
                last = f"{len(errors)} requests failed, e.g. {errors[0]}"
            elif set(counts) - set(want) or len(counts) != sum(1 for v in want.values() if v > 0):
                last = f"backends seen {counts}, want {want}"
            elif any(abs(counts.get(b, 0) / w["totalRequests"] - v) > w["tolerance"] for b, v in want.items()):
                last = f"distribution {counts} out of tolerance for {want}"
            else:
                return None
        return last


@pytest.fixture(scope="module")
def suite(tmp_path_factory, module_server_kind):
    s = MeshSuite(module_server_kind, tmp_path_factory.mktemp(f"mesh-{module_server_kind}"))
    try:
        yield s
    finally:
        s.mesh.close()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=GAPS[n], strict=True)) if n in GAPS else n
                                  for n in mc.case_names()])
def test_mesh_conformance_case(suite, name):
    case = mc.load_case(name)
    if case["manifests"]:
        suite.mesh.apply(case["manifests"])
    try:
        why = suite.status(case.get("status") or [])
        assert why is None, f"status: {why}\n{suite.mesh.log(BASE['clients'][0]['namespace'])}"
        for entry in case["requests"]:
            why = suite.eventually(entry)
            assert why is None, f"{entry.get('name') or entry['request']['path']} from {entry['from']}: {why}"
        if case.get("weights"):
            why = suite.weights(case["weights"])
            assert why is None, f"weights: {why}"
    finally:
        if case["manifests"]:
            suite.mesh.delete(case["manifests"])


def test_the_xmesh_is_accepted_and_the_mesh_was_refused_nothing(suite):
    """After every case: the XMesh of the base is Accepted by the mesh's leader, with the mesh
    features it supports (which the upstream suite reads from there), and the proxies, as
    deploy/'s ServiceAccount under deploy/'s RBAC, were refused nothing they asked kube-apiserver
    for (a 403 is a defect of deploy/; the sandbox authorizes every request)."""
    xmesh = BASE["mesh"]["name"]
    why = suite.status([{"object": {"kind": "XMesh", "name": xmesh}}])
    assert why is None
    got = suite.mesh.get_object("XMesh", None, xmesh) or {}
    conds = {c["type"]: (c["status"], c["reason"]) for c in (got.get("status") or {}).get("conditions") or []}
    assert conds["Accepted"] == ("True", "Accepted")
    assert got["status"]["supportedFeatures"] == [{"name": f} for f in sorted(MESH_FEATURES)]
    assert suite.mesh.server.refused("gwpolicy-mesh") == []
