"""The GRPCRoute conformance cases (tests/data/grpc-conformance) against `gwpolicy gateway` (real
processes, real NGINX), once against `gwpolicy sandbox` and once against a real kube-apiserver, as
tests/gateway/test_gateway_conformance.py runs the HTTP cases: the same base, generated certificates,
EndpointSlices and status checks, with the base's gRPC echo backends (`grpc-infra-backend-v1/v2/v3`,
two replicas each) running as well. Each case's calls are compared as the suite's
`compareResponse` does (tests/grpc_conformance.py), GRPCRouteRequestHeaderModifier's
expectedMetadata too, and GRPCRouteWeight's distribution is checked.

grpc-infra-backend-v1's replicas also serve gRPC over TLS on port 8443 (the generated
tls-checks-certificate), for BackendTLSPolicyGRPCRoute's calls (`requires: [backendTLS]`).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import pytest

import grpc_conformance as grpcc
from gwpolicy.gateway.grpcecho import GrpcEchoServer
from test_gateway_conformance import STATUS_TIMEOUT, Suite, cleanup, started_suite

#: what this harness can check beyond plain gRPC (README `requires`)
CAPABILITIES = {"backendTLS"}
#: the README's backend TLS set-up: grpc-infra-backend-v1's replicas also serve gRPC over TLS on the
#: port published for 8443, with the generated tls-checks-certificate
TLS_BACKEND, TLS_PORT, TLS_SECRET = "grpc-infra-backend-v1", 8443, "tls-checks-certificate"


class GrpcSuite(Suite):
    """The HTTP harness, with the base's gRPC backends started too (on the addresses after the HTTP ones)."""

    def _start_backends(self, pems: dict[tuple[str, str], tuple[bytes, bytes]]) -> None:
        super()._start_backends(pems)
        n = sum(len(b["instances"]) for b in self.backends)
        certdir = Path(tempfile.mkdtemp(dir=self.tmp))
        specs: list[dict[str, Any]] = []
        for b in self.base["backends"]:
            if b.get("mode") != "grpc":
                continue
            instances = []
            for _ in range(b["replicas"]):
                n += 1
                address = self.host.address(n) if self.host else f"127.0.{self.net}.{n}"
                pod = f"{b['podNamePrefix']}-{random.randrange(16**8):08x}-{random.randrange(16**5):05x}"
                ports = [listen["port"] for listen in b["listens"] if listen["protocol"] == "grpc"]
                specs += [{"pod": pod, "namespace": b["namespace"], "address": address, "port": p, "grpc": True} for p in ports]
                if b["podNamePrefix"] == TLS_BACKEND:  # gRPC over TLS too, with the generated certificate
                    crt, key = pems[(b["namespace"], TLS_SECRET)]
                    cf, kf = certdir / f"{pod}.crt", certdir / f"{pod}.key"
                    cf.write_bytes(crt)
                    kf.write_bytes(key)
                    specs.append({"pod": pod, "namespace": b["namespace"], "address": address, "port": TLS_PORT, "grpc": True,
                                  "cert": str(cf), "key": str(kf)})
                    ports.append(TLS_PORT)
                instances.append({"address": address, "ports": sorted(ports)})
            self.backends.append(dict(b, instances=instances))
        if self.host:
            self.host.serve(specs)
        else:
            self.grpc_echoes = [GrpcEchoServer(s["pod"], s["namespace"], address=s["address"], port=s["port"],
                                               cert=s.get("cert"), key=s.get("key")).start() for s in specs]

    def stop(self) -> None:
        try:
            for e in getattr(self, "grpc_echoes", []):
                e.stop()
        finally:
            super().stop()

    def target(self, gw: dict[str, Any]) -> str:
        return f"{self.address(gw)}:{gw.get('port') or 80}"


@pytest.fixture(scope="module")
def suite(tmp_path_factory, module_server_kind):
    yield from started_suite(lambda: GrpcSuite(tmp_path_factory.mktemp("grpc-conformance"), module_server_kind),
                             module_server_kind)


def run_grpc_case(suite: GrpcSuite, case: dict[str, Any]) -> list[str]:
    """One case: its manifests, status, calls (and metadata), weights; returns the calls not made."""
    skipped: list[str] = []
    manifests = case.get("manifests") or []
    try:
        suite.apply(manifests)
        if case.get("namespacesReady"):
            why = suite.wait_ready(case["namespacesReady"], STATUS_TIMEOUT)
            assert why is None, f"namespacesReady: {why}"
        why = suite.wait_status(case.get("status") or [], STATUS_TIMEOUT)
        assert why is None, f"status: {why}"
        for entry in case.get("rpcs") or []:
            missing = set(entry.get("requires") or []) - CAPABILITIES
            label = entry.get("name") or f"{entry['request']['method']} {entry['request'].get('metadata') or ''}"
            if missing:
                skipped.append(f"{label}: needs {', '.join(sorted(missing))}")
                continue
            target = suite.target(entry["gateway"])
            if entry.get("expect") == "failure":
                def check(entry: dict[str, Any] = entry, target: str = target) -> tuple[bool, str]:
                    ok, why, answer = grpcc.check_rpc(entry, target)
                    assert answer is None or answer.code.name != "OK", f"{label}: answered OK, expected a failure"
                    return not ok, why
                why = grpcc.eventually(check)
            else:
                def check(entry: dict[str, Any] = entry, target: str = target) -> tuple[bool, str]:
                    ok, why, answer = grpcc.check_rpc(entry, target)
                    if ok and answer is not None and (entry.get("expectedMetadata") or entry.get("absentMetadata")):
                        problems = grpcc.metadata_problems(entry, answer)
                        return not problems, f"metadata: {problems}"
                    return ok, why
                why = grpcc.eventually(check)
            assert not why, f"call {label} to {target}: {why}"
        w = case.get("weights")
        if w:
            target = suite.target(w["gateway"])
            whys = []
            for _ in range(w.get("maxRetries", 10)):
                why = grpcc.weights_pass(w, target)
                if not why:
                    break
                whys.append(why)
            else:
                raise AssertionError(f"weights: {whys}")
    finally:
        cleanup(suite, manifests)
    return skipped


@pytest.mark.parametrize("name", grpcc.case_names())
def test_grpc_conformance_case(suite, name):
    skipped = run_grpc_case(suite, grpcc.load_case(name))
    if skipped:
        pytest.skip(f"{name}: status and every other call passed; not made: " + "; ".join(skipped))
