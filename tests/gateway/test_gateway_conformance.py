"""Every case of ../shared/gateway-conformance against `gwpolicy gateway` (real processes, real NGINX)
with echo backends, as the README there says: base manifests, generated certificates, EndpointSlices
for every Service whose selector matches a backend, status checks, eventually-consistent requests,
weights, steps, cleanup; once against `gwpolicy sandbox` and once against a real kube-apiserver
(conftest.py), where the gateway runs as deploy/'s ServiceAccount under deploy/'s RBAC. Each run takes
one free network of 127.0.23.0/24-127.0.29.0/24: Gateways on .128-.254, echo backends on .1-.127
against the sandbox; against kube-apiserver, which takes no loopback address in an EndpointSlice, on
addresses of a test host (tests/backend_hosts.py, on tests/netns.py).

A case this gateway does not pass is listed in GAPS with the reason (and in docs/gateway.md,
"Conformance"): it runs, and is reported as an expected failure with that reason, never skipped
silently. A request a case marks `requires: [...]` runs when the capability is there (see
CAPABILITIES); otherwise the case says so.
"""

from __future__ import annotations

import copy
import json
import random
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import backend_hosts
import gwconformance as gc
import live_server
from gateway_proc import GatewayProcess, request, wait_until
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.facts import SUPPORTED_FEATURES

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "gateway-api" / "experimental"


def _free_net() -> tuple[int, Any]:
    """The first of the CP range's networks 127.0.23-29.0/24 nobody serves on (another run of this
    harness, e.g. by another engineer of the shared worktree, may hold one), and a socket bound on its
    .1:3000 that holds it until the backends (or, when they are elsewhere, the end of the run) do:
    the echo backends get .1-.127 of it, Gateways .128-.254."""
    import socket

    for n in range(23, 30):
        s = socket.socket()
        try:
            s.bind((f"127.0.{n}.1", 3000))
            return n, s
        except OSError:
            s.close()
            continue
    raise RuntimeError("127.0.23.0/24-127.0.29.0/24 are all in use")
CONSISTENCY = 30.0  # the suite's MaxTimeToConsistency
STATUS_TIMEOUT = 30.0  # the suite allows 60-180 s; our gateway converges in well under a second
GAP_TIMEOUT = 8.0  # a case listed in GAPS is given less time to fail

#: cases this gateway does not pass, and why (keep docs/gateway.md "Conformance" in step)
GAPS: dict[str, str] = {}

#: what the harness can check beyond plain HTTP (README `requires`)
CAPABILITIES = {"echoDelay", "frontendTLS", "backendTLS"}

KINDS = {  # kind -> (apiVersion, plural, namespaced)
    "Gateway": ("gateway.networking.k8s.io/v1", "gateways", True),
    "GatewayClass": ("gateway.networking.k8s.io/v1", "gatewayclasses", False),
    "HTTPRoute": ("gateway.networking.k8s.io/v1", "httproutes", True),
    "GRPCRoute": ("gateway.networking.k8s.io/v1", "grpcroutes", True),
    "ReferenceGrant": ("gateway.networking.k8s.io/v1", "referencegrants", True),
    "BackendTLSPolicy": ("gateway.networking.k8s.io/v1", "backendtlspolicies", True),
    "Service": ("v1", "services", True),
    "ConfigMap": ("v1", "configmaps", True),
    "Secret": ("v1", "secrets", True),
    "Namespace": ("v1", "namespaces", False),
    "EndpointSlice": ("discovery.k8s.io/v1", "endpointslices", True),
}


def _path(kind: str, ns: str | None, name: str | None = None) -> str:
    api, plural, namespaced = KINDS[kind]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    if namespaced:
        base += f"/namespaces/{ns}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


class Suite:
    """The API server (of `kind`), the gateway and the echo backends, started once for every case."""

    def __init__(self, tmp: Path, kind: str) -> None:
        self.tmp = tmp
        self.kind = kind
        self.base = gc.load_base()
        self.net, self._hold = _free_net()
        self.host: backend_hosts.BackendHost | None = None
        self.server = live_server.start(kind, tmp)
        self.echoes: list[EchoServer] = []
        self.backends: list[dict[str, Any]] = []  # base.yaml backends we run, with their instances
        self.gateway: GatewayProcess | None = None
        self.trust: dict[tuple[str, str], bytes] = {}
        self.slices: set[tuple[str, str]] = set()

    # ---------- set-up ----------
    def start(self) -> None:
        self.server.apply(live_server.gateway_api_crds(CRDS))
        # the gateway's ServiceAccount and RBAC, as deploy/ installs them
        self.server.install_deploy("70-gateway.yaml")
        if self.kind == "kube":
            self.host = backend_hosts.BackendHost()
        generated, pems = gc.generated_objects(self.base)
        self.trust = {k: v[0] for k, v in pems.items()}
        self._start_backends(pems)
        self.gateway = GatewayProcess(self.server.identity("gwpolicy-gateway"), self.tmp / "state",
                                      pool=f"127.0.{self.net}.128/25")
        self.server.apply(copy.deepcopy(self.base["manifests"][:1]))  # the GatewayClass, first
        try:
            wait_until(lambda: self.check([{"object": {"kind": "GatewayClass", "name": "gwpolicy"},
                                            "conditions": [{"type": "Accepted", "status": "True"}]}]) is None,
                       30, what="GatewayClass gwpolicy Accepted")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.gateway.tail()}\nrefused: {self.server.refused('gwpolicy-gateway')}") from None
        self.apply(self.base["manifests"][1:] + generated)
        why = self.wait_ready(["gateway-conformance-infra", "gateway-conformance-app-backend",
                               "gateway-conformance-web-backend"], 60)
        assert why is None, f"base not ready: {why}\n{self.gateway.tail()}"

    def _start_backends(self, pems: dict[tuple[str, str], tuple[bytes, bytes]]) -> None:
        """Each backend instance on an address of its own: on loopback beside the sandbox, on the test
        host against kube-apiserver."""
        n = 0
        certdir = Path(tempfile.mkdtemp(dir=self.tmp))
        specs: list[dict[str, Any]] = []
        for b in self.base["backends"]:
            needed = set(b.get("neededFor") or [])
            if not needed & {"plainHTTP", "backendTLS"}:
                continue
            instances = []
            for i in range(b["replicas"]):
                n += 1
                address = self.host.address(n) if self.host else f"127.0.{self.net}.{n}"
                pod = f"{b['podNamePrefix']}-{random.randrange(16**8):08x}-{random.randrange(16**5):05x}"
                ports = []
                for listen in b["listens"]:
                    spec = {"pod": pod, "namespace": b["namespace"], "address": address, "port": listen["port"]}
                    if listen["protocol"] == "https":
                        crt, key = pems[(b["namespace"], listen["certificateSecret"])]
                        cf, kf = certdir / f"{pod}.crt", certdir / f"{pod}.key"
                        cf.write_bytes(crt)
                        kf.write_bytes(key)
                        spec.update(cert=str(cf), key=str(kf))
                    elif listen["protocol"] != "http":
                        continue
                    specs.append(spec)
                    ports.append(listen["port"])
                instances.append({"address": address, "ports": sorted(ports)})
            self.backends.append(dict(b, instances=instances))
        if self.host:
            self.host.serve(specs)
        else:
            self._hold.close()  # the first backend holds the network from here on
            self.echoes += [EchoServer(s["pod"], s["namespace"], address=s["address"], port=s["port"], cert=s.get("cert"),
                                       key=s.get("key")).start() for s in specs]

    def stop(self) -> None:
        try:
            if self.gateway is not None:
                self.gateway.stop()
            for e in self.echoes:
                e.stop()
            if self.host is not None:
                self.host.stop()
        finally:
            self.server.close()
            self._hold.close()

    # ---------- API ----------
    def get(self, kind: str, ns: str | None, name: str) -> dict[str, Any] | None:
        r = self.server.http.get(_path(kind, ns, name))
        return r.json() if r.status_code == 200 else None

    def apply(self, objects: list[dict[str, Any]]) -> None:
        """Server-side apply each object as it is, in order (nothing made up around it: a Namespace
        applied again without its labels would lose them)."""
        objects = [self._resolve(copy.deepcopy(o)) for o in objects]
        for o in objects:
            self._ssa(o)
        self.publish_endpoints([o for o in objects if o["kind"] == "Service"])

    def _ssa(self, o: dict[str, Any]) -> None:
        ns = o["metadata"].get("namespace") or ("default" if KINDS[o["kind"]][2] else None)
        r = self.server.http.patch(_path(o["kind"], ns, o["metadata"]["name"]), params={"fieldManager": "conformance", "force": "true"},
                                    json=o, headers={"Content-Type": "application/apply-patch+yaml"})
        assert r.status_code < 300, f"apply {o['kind']} {ns}/{o['metadata']['name']}: {r.status_code} {r.text}"

    def _resolve(self, value: Any) -> Any:
        """`${configMap:<namespace>/<name>/<key>}`: the key's current value."""
        if isinstance(value, str):
            m = re.fullmatch(r"\$\{configMap:([^/]+)/([^/]+)/([^}]+)\}", value)
            if m:
                return ((self.get("ConfigMap", m.group(1), m.group(2)) or {}).get("data") or {}).get(m.group(3))
            return value
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        return value

    def publish_endpoints(self, services: list[dict[str, Any]]) -> None:
        """An EndpointSlice for each Service whose selector matches a running backend's labels."""
        slices = []
        for svc in services:
            sel = (svc.get("spec") or {}).get("selector") or {}
            ns = svc["metadata"].get("namespace", "default")
            for b in self.backends:
                if not sel or b["namespace"] != ns or any(b["labels"].get(k) != v for k, v in sel.items()):
                    continue
                ports = []
                for p in svc["spec"].get("ports") or []:
                    target = p.get("targetPort", p["port"])
                    if isinstance(target, int) and all(target in inst["ports"] for inst in b["instances"]):
                        ports.append({"name": p.get("name", ""), "port": target, "protocol": p.get("protocol", "TCP")})
                if not ports:
                    continue
                name = f"{svc['metadata']['name']}-harness"
                slices.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                               "metadata": {"name": name, "namespace": ns,
                                            "labels": {"kubernetes.io/service-name": svc["metadata"]["name"]}},
                               "addressType": "IPv4", "ports": ports,
                               "endpoints": [{"addresses": [i["address"]], "conditions": {"ready": True}}
                                             for i in b["instances"]]})
                self.slices.add((ns, name))
        for sl in slices:
            self._ssa(sl)

    def delete(self, kind: str, ns: str | None, name: str) -> None:
        self.server.http.delete(_path(kind, ns, name))

    def patch(self, kind: str, ns: str | None, name: str, patch: dict[str, Any]) -> None:
        r = self.server.http.patch(_path(kind, ns, name), json=self._resolve(patch),
                                    headers={"Content-Type": "application/merge-patch+json"})
        r.raise_for_status()

    # ---------- checks ----------
    def check(self, entries: list[dict[str, Any]]) -> str | None:
        for e in entries:
            why = gc.check_status(e, self.get)
            if why:
                return why
        return None

    def wait_status(self, entries: list[dict[str, Any]], timeout: float) -> str | None:
        end = time.monotonic() + timeout
        why = self.check(entries)
        while why and time.monotonic() < end:
            time.sleep(0.1)
            why = self.check(entries)
        return why

    def not_ready(self, namespaces: list[str]) -> str | None:
        for ns in namespaces:
            items = self.server.http.get(_path("Gateway", ns)).json().get("items") or []
            for g in items:
                if not gc.skip_readiness(g):
                    why = gc.gateway_ready(g)
                    if why:
                        return why
        return None

    def wait_ready(self, namespaces: list[str], timeout: float) -> str | None:
        end = time.monotonic() + timeout
        why = self.not_ready(namespaces)
        while why and time.monotonic() < end:
            time.sleep(0.1)
            why = self.not_ready(namespaces)
        return why

    def address(self, gw: dict[str, Any]) -> str:
        obj = self.get("Gateway", gw["namespace"], gw["name"]) or {}
        for a in (obj.get("status") or {}).get("addresses") or []:
            if a.get("type"):
                return a["value"]
        raise AssertionError(f"Gateway {gw['namespace']}/{gw['name']} has no address")

    def send(self, exp: dict[str, Any], extra: dict[str, str] | None = None) -> tuple[int, list, bytes, str]:
        req = exp["request"]
        address = self.address(exp["gateway"])
        port = exp["gateway"].get("port") or 80
        headers = dict(req.get("headers") or {})
        headers["X-Echo-Set-Header"] = ",".join(f"{k}:{v}" for k, v in (exp.get("backendSetResponseHeaders") or {}).items())
        headers.update(extra or {})
        tls = None
        scheme = "http"
        if exp.get("frontendTLS"):
            ft = exp["frontendTLS"]
            ns, name = ft["trustCertificateFromSecret"].split("/") if "/" in ft["trustCertificateFromSecret"] else (
                exp["gateway"]["namespace"], ft["trustCertificateFromSecret"])
            tls = ssl.create_default_context(cadata=self.trust[(ns, name)].decode())
            tls.check_hostname = False  # the generated certificates name hosts, not the loopback address
            scheme = "https"
        host = req.get("host")
        status, hdrs, body = request(address, port, req["path"], method=req.get("method", "GET"), host=host,
                                     headers=headers, tls=tls, sni=(exp.get("frontendTLS") or {}).get("serverName"))
        return status, hdrs, body, scheme

    def eventually(self, exp: dict[str, Any], timeout: float) -> str | None:
        """MakeRequestAndExpectEventuallyConsistentResponse (and the failure variants)."""
        end = time.monotonic() + timeout
        ok, last = 0, "no request made"
        mode = exp.get("expect")
        while time.monotonic() < end:
            try:
                status, hdrs, body, scheme = self.send(exp)
            except (OSError, ssl.SSLError) as exc:
                if mode == "transportFailure":
                    ok += 1
                    if ok >= 3:
                        return None
                    continue
                ok, last = 0, f"transport error: {exc}"
                time.sleep(0.1)
                continue
            if mode == "transportFailure":
                ok, last = 0, f"got HTTP {status}, want no response"
            elif mode == "failure":
                if status == 200:
                    return "got 200, want a failure"
                if status in (408, 504):
                    ok, last = 0, f"got {status}"
                else:
                    ok += 1
            else:
                why = gc.compare(exp, status, hdrs, body, scheme)
                if why is None:
                    ok += 1
                else:
                    ok, last = 0, why
            if ok >= 3:
                return None
            if ok == 0:
                time.sleep(0.1)
        return last

    def weights(self, w: dict[str, Any]) -> str | None:
        exp = {k: w[k] for k in ("gateway", "request", "response", "namespace")}
        exp["backend"] = ""
        last = None
        for _ in range(w.get("maxRetries", 10)):
            counts: dict[str, int] = {}
            errors = []
            lock = threading.Lock()

            def one(_i: int) -> None:
                extra = {"X-Jitter": str(random.randrange(10000))} if random.random() < 0.5 else None
                status, hdrs, body, scheme = self.send(exp, extra)
                why = gc.compare(exp, status, hdrs, body, scheme)
                with lock:
                    if why:
                        errors.append(why)
                    else:
                        b = gc.pod_backend(json.loads(body)["pod"])
                        counts[b] = counts.get(b, 0) + 1

            with ThreadPoolExecutor(w.get("concurrency", 10)) as pool:
                list(pool.map(one, range(w["totalRequests"])))
            want = w["expectedWeights"]
            if errors:
                last = f"{len(errors)} requests failed, e.g. {errors[0]}"
            elif set(counts) - set(want):
                last = f"unexpected backends {set(counts) - set(want)}"
            elif len(counts) != sum(1 for v in want.values() if v > 0):
                last = f"backends seen {counts}, want {want}"
            elif any(abs(counts.get(b, 0) / w["totalRequests"] - v) > w["tolerance"] for b, v in want.items()):
                last = f"distribution {counts} out of tolerance for {want}"
            else:
                return None
        return last

    def header_matches_pod(self, h: dict[str, Any]) -> str | None:
        exp = {k: h[k] for k in h if k in ("gateway", "request", "response", "namespace")}
        for _ in range(h.get("count", 100)):
            status, hdrs, body, _ = self.send(exp)
            if status != 200:
                return f"status {status}"
            echoed = json.loads(body)
            values = (echoed.get("headers") or {}).get("Backend") or []
            if len(values) != 1 or not echoed["pod"].startswith(values[0]):
                return f"Backend header {values} for pod {echoed['pod']}"
        return None


def started_suite(make: Callable[[], Suite], server_kind: str) -> Iterator[Suite]:
    """The suite `make` gives, started against `server_kind` and stopped after (the fixture of this
    module and of the GRPCRoute cases'); against kube-apiserver, skipped where its backend hosts
    cannot be made."""
    if server_kind == "kube":
        why = backend_hosts.missing()
        if why:
            pytest.skip(why)
    s = make()
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def suite(tmp_path_factory, module_server_kind):
    yield from started_suite(lambda: Suite(tmp_path_factory.mktemp("conformance"), module_server_kind), module_server_kind)


def _requests(case: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    run, skipped = [], []
    for r in rows:
        missing = set(r.get("requires") or []) - CAPABILITIES
        if missing:
            skipped.append(f"{r.get('name') or r['request']['path']}: needs {', '.join(sorted(missing))}")
        else:
            run.append(r)
    return run, skipped


#: the case format's keys (README "Case file format"); anything else would go unchecked, so it fails
KNOWN_KEYS = {"name", "description", "source", "manifestSource", "features", "profile", "provisional", "manifests",
              "namespacesReady", "status", "requests", "weights", "headerMatchesPod", "steps", "notes"}


def run_case(suite: Suite, case: dict[str, Any], timeout: float) -> list[str]:
    """Run one case; returns what it could not check (requests needing a missing capability)."""
    unknown = set(case) - KNOWN_KEYS
    assert not unknown, f"{case['name']}: the harness does not run {sorted(unknown)} (e.g. `harness:`): extend it"
    applied: list[dict[str, Any]] = []
    skipped: list[str] = []
    try:
        applied += case.get("manifests") or []
        suite.apply(case.get("manifests") or [])
        phases = [dict(case, actions=[])] + list(case.get("steps") or [])
        for i, phase in enumerate(phases):
            where = "" if i == 0 else f"step {i - 1} ({phase.get('description', '')}): "
            before = {}
            for g in phase.get("generationChanged") or []:
                before[(g["kind"], g["name"])] = suite.get(g["kind"], g.get("namespace"), g["name"])["metadata"]["generation"]
            for action in phase.get("actions") or []:
                if "patch" in action:
                    o = action["patch"]["object"]
                    suite.patch(o["kind"], o.get("namespace"), o["name"], action["patch"]["mergePatch"])
                if "delete" in action:
                    d = action["delete"]
                    suite.delete(d["kind"], d.get("namespace"), d["name"])
                if action.get("apply"):
                    applied += action["apply"]
                    suite.apply(action["apply"])
            if phase.get("namespacesReady"):
                why = suite.wait_ready(phase["namespacesReady"], timeout)
                assert why is None, f"{where}namespacesReady: {why}"
            why = suite.wait_status(phase.get("status") or [], timeout)
            assert why is None, f"{where}status: {why}"
            run, skip = _requests(case, phase.get("requests") or [])
            skipped += [where + s for s in skip]
            for r in run:
                why = suite.eventually(r, min(timeout, CONSISTENCY))
                assert why is None, f"{where}request {r.get('name') or r['request']['method'] + ' ' + r['request']['path']}" \
                                    f" (host {r['request'].get('host')}): {why}"
            if i == 0 and case.get("weights"):
                why = suite.weights(case["weights"])
                assert why is None, f"weights: {why}"
            if i == 0 and case.get("headerMatchesPod"):
                why = suite.header_matches_pod(case["headerMatchesPod"])
                assert why is None, f"headerMatchesPod: {why}"
            for g in phase.get("generationChanged") or []:
                now = suite.get(g["kind"], g.get("namespace"), g["name"])["metadata"]["generation"]
                assert now != before[(g["kind"], g["name"])], f"{where}generation of {g['kind']} {g['name']} did not change"
    finally:
        cleanup(suite, applied)
    return skipped


def cleanup(suite: Suite, objects: list[dict[str, Any]]) -> None:
    """Delete what the case created (its manifests, what its steps applied, the EndpointSlices of its
    Services) and wait until it is gone, as the suite's CleanupTestResources does."""
    base = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in suite.base["manifests"]}
    gone = []
    for o in reversed(objects):
        key = (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        if key in base or o["kind"] not in KINDS:
            continue
        ns = o["metadata"].get("namespace") or ("default" if KINDS[o["kind"]][2] else None)
        suite.delete(o["kind"], ns, o["metadata"]["name"])
        gone.append((o["kind"], ns, o["metadata"]["name"]))
        if o["kind"] == "Service" and (ns, f"{o['metadata']['name']}-harness") in suite.slices:
            suite.delete("EndpointSlice", ns, f"{o['metadata']['name']}-harness")
            suite.slices.discard((ns, f"{o['metadata']['name']}-harness"))
    wait_until(lambda: all(suite.get(*g) is None for g in gone), 30, what="cleanup")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=GAPS[n], strict=False)) if n in GAPS else n
                                  for n in gc.case_names()])
def test_conformance_case(suite, name):
    case = gc.load_case(name)
    skipped = run_case(suite, case, GAP_TIMEOUT if name in GAPS else STATUS_TIMEOUT)
    if skipped:
        pytest.skip(f"{name}: status and every other request passed; not checked: " + "; ".join(skipped))


CORE = {"Gateway", "HTTPRoute", "ReferenceGrant"}


def _attributed(case: dict[str, Any]) -> set[str]:
    """The features a case tests: its extended ones, or the core ones when it has none."""
    features = set(case.get("features") or [])
    return (features - CORE) or features


def test_supported_features_are_only_what_passes():
    """GatewayClass.status.supportedFeatures claims no feature a known gap tests, and every claimed
    feature is tested by some case here (each case not in GAPS passes in test_conformance_case) or
    among the GRPCRoute cases."""
    claimed = set(SUPPORTED_FEATURES)
    tested: set[str] = set()
    for name in gc.case_names():
        features = _attributed(gc.load_case(name))
        tested |= features
        if name in GAPS:
            assert not features & claimed, f"{name} is a gap ({GAPS[name]}) but {sorted(features & claimed)} is claimed"
    import grpc_conformance  # the GRPCRoute cases (tests/gateway/test_gateway_grpc_conformance.py runs them)

    for name in grpc_conformance.case_names():
        tested |= _attributed(grpc_conformance.load_case(name))
    assert claimed <= tested, f"claimed without a case: {sorted(claimed - tested)}"


def test_the_gateway_was_refused_nothing(suite):
    """After every case: the gateway, as deploy/'s ServiceAccount under deploy/'s RBAC, was refused
    nothing it asked kube-apiserver for (a 403 is a defect of deploy/)."""
    if suite.kind == "sandbox":
        pytest.skip("the sandbox authorizes every request")
    assert suite.server.refused("gwpolicy-gateway") == []
