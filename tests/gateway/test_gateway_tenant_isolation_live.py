"""One tenant cannot freeze the gateway for the others, end to end: the sandbox (CRD validation on),
`gwpolicy gateway` with NGINX, echo backends for tenant-a and tenant-b. With the Gateway healthy and
serving tenant-b, tenant-a applies each object of tests/freezing.py in turn (a 4 KiB header value,
20-digit durations, zone sizes NGINX refuses, a keep-alive cache it cannot allocate, a CA bundle that
does not parse, a key that is not its certificate's; each kept while the next comes). Every time,
tenant-b's new route is served within 2 s and the bad object's status says why; after a restart of
the gateway on the same state, everything else is served. Also: a route whose endpoints are the
gateway's own health endpoint gets none of its answers. Loopback only: Gateways from 127.0.55.0/25,
backends on 127.0.55.200."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from freezing import Case, base_objects, freezing_objects, route
from gateway_kit import Echoes, free_port, have_nginx, key_pair, request
from gateway_proc import GatewayProcess, wait_until
from sandbox_proc import GW_CRDS, SandboxProcess

pytestmark = pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")

POOL = "127.0.55.0/25"
ADDRESS = "127.0.55.1"  # the pool's first address: the Gateway's
BACKENDS = "127.0.55.200"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
GW = "gateway.networking.k8s.io"
PLURALS = {"HTTPRoute": (f"/apis/{GW}/v1", "httproutes"), "Gateway": (f"/apis/{GW}/v1", "gateways"),
           "BackendTLSPolicy": (f"/apis/{GW}/v1", "backendtlspolicies")}


def apply(sb: SandboxProcess, *objs: dict[str, Any]) -> None:
    sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(list(objs)))


def condition(sb: SandboxProcess, case: Case) -> dict[str, Any] | None:
    if case.kind in PLURALS:
        base, plural = PLURALS[case.kind]
    else:
        base, plural = "/apis/gwpolicy.io/v1alpha1", case.kind.lower()[:-1] + "ies"  # TimeoutPolicy: timeoutpolicies
    o = sb.http.get(f"{base}/namespaces/{case.namespace}/{plural}/{case.object_name}").json()
    status = o.get("status") or {}
    if case.section is not None:
        entries = [l for l in status.get("listeners") or [] if l.get("name") == case.section]
    else:
        entries = [e for e in (status.get("parents") or status.get("ancestors") or [])
                   if e.get("controllerName") == "gwpolicy.io/gateway-controller"]
    for e in entries:
        for c in e.get("conditions") or []:
            if c.get("type") == case.condition and c.get("status") == "False":
                return c
    return None


def served(host: str, port: int, path: str = "/") -> int:
    try:
        return request(ADDRESS, port, path, host, timeout=2).status
    except OSError:
        return 0


def test_no_object_of_one_tenant_freezes_the_others_not_even_across_a_restart(tmp_path: Path) -> None:
    echoes = Echoes(BACKENDS).start("a", namespace="tenant-a").start("b", namespace="tenant-b")
    ends = {ns: (s.address, s.port) for ns, s in (("tenant-a", echoes.servers["a"]), ("tenant-b", echoes.servers["b"]))}
    http, https = free_port(ADDRESS), free_port(ADDRESS)
    a_cert = key_pair("a.example")
    sb = SandboxProcess(tmp_path)
    gw: GatewayProcess | None = None
    try:
        crds = [GW_CRDS / f"{GW}_{n}.yaml" for n in ("gatewayclasses", "gateways", "httproutes", "referencegrants",
                                                     "backendtlspolicies")]
        sb.kubectl("apply", "--server-side", *sum((["-f", str(f)] for f in crds), []))
        sb.kubectl("apply", "--server-side", *sum((["-f", str(f)] for f in [DEPLOY / "10-policykind-crd.yaml", *sorted(DEPLOY.glob("4[0-9]-*.yaml"))]), []))
        sb.kubectl("apply", "--server-side", "-k", str(DEPLOY / "policykinds"))
        apply(sb, *base_objects(http, https, a_cert, ends))
        gw = GatewayProcess(sb.kubeconfig, tmp_path / "state", pool=POOL)
        wait_until(lambda: served("b.example", http) == 200 and served("a.example", http) == 200, 30,
                   what=f"the healthy cluster served\n{gw.tail()}")
        slow: list[tuple[str, float]] = []
        cases = freezing_objects(key_pair("other.example"), a_cert)
        for i, case in enumerate(cases):
            apply(sb, *case.objects)  # tenant-a's object, then tenant-b's next change
            t0 = time.monotonic()
            apply(sb, route(f"b-new-{i}", "tenant-b", f"b-new-{i}.example"))
            while served(f"b-new-{i}.example", http) != 200 and time.monotonic() - t0 < 10:
                time.sleep(0.02)
            took = time.monotonic() - t0
            if took > 2.0:
                slow.append((case.name, round(took, 2)))
            got = wait_until(lambda c=case: condition(sb, c), 15, what=f"the status of {case.name}\n{gw.tail()}")
            assert got["reason"] == case.reason and case.says in got["message"], (case.name, got)
            assert served("b.example", http) == 200, case.name
        assert slow == [], f"tenant-b's new route took longer than 2 s after: {slow}\n{gw.tail()}"
        # the gateway's own health endpoint is no backend, whatever a tenant's EndpointSlice says
        own = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "web-2", "namespace": "tenant-a", "labels": {"kubernetes.io/service-name": "own"}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": gw.port, "protocol": "TCP"}],
               "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "own", "namespace": "tenant-a"},
               "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": gw.port}]}}
        ssrf = route("a-ssrf", "tenant-a", "ssrf.example", {"backendRefs": [{"name": "own", "port": 8080}]})
        apply(sb, svc, own, ssrf)
        wait_until(lambda: served("ssrf.example", http, "/statusz") == 500, 10, what=f"the SSRF route refused\n{gw.tail()}")
        gw.stop()
        gw = GatewayProcess(sb.kubeconfig, tmp_path / "state", pool=POOL)  # the same state, every bad object still there
        wanted = ["b.example"] + [f"b-new-{i}.example" for i in range(len(cases))]
        wait_until(lambda: all(served(h, http) == 200 for h in wanted), 30, what=f"everything else after the restart\n{gw.tail()}")
        # tenant-a's own route is served as its objects say: its Service's BackendTLSPolicy cannot be
        # programmed, so its requests fail closed (500), never in plain HTTP
        assert served("a.example", http) == 500
        statusz = json.loads(request("127.0.0.1", gw.port, "/statusz").body)
        assert statusz["nginxError"] is None, statusz
    finally:
        if gw is not None:
            gw.stop()
        sb.close()
        echoes.stop()
