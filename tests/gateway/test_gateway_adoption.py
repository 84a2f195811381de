"""NGINX outlives `gwpolicy gateway`: real processes (sandbox, gateway, NGINX, an echo backend),
traffic on loopback (127.0.88.0/24 for Gateways, 127.0.89.1 for the backend)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from gateway_proc import GatewayProcess, alive, request, wait_until
from gwpolicy.gateway.echo import EchoServer
from sandbox_proc import GW_CRDS, SandboxProcess

NS = "adopt"
POOL = "127.0.88.0/24"
BACKEND_IP = "127.0.89.1"
CONTROLLER = "example.com/adopt"


def gateway_objects(port: int, ns: str, controller: str, backend_ip: str) -> list[dict]:
    """A GatewayClass named `ns` for `controller`, and in namespace `ns` a Gateway `gw` (HTTP on port
    80), a Service `echo` whose one endpoint is `backend_ip:port`, and a route for /steady."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": ns},
         "spec": {"controllerName": controller}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": ns},
         "spec": {"gatewayClassName": ns, "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": ns},
         "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "echo-1", "namespace": ns, "labels": {"kubernetes.io/service-name": "echo",
                                                                    "endpointslice.kubernetes.io/managed-by":
                                                                    "endpointslice-controller.k8s.io"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [backend_ip], "conditions": {"ready": True}}]},
        route("r", "/steady", ns),
    ]


def route(name: str, path: str, ns: str) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                                "backendRefs": [{"name": "echo", "port": 8080}]}]}}


@contextmanager
def gateway_env(tmp: Path, ns: str, controller: str, backend_ip: str) -> Iterator[tuple[SandboxProcess, EchoServer]]:
    """A sandbox holding `gateway_objects`, and the echo backend on `backend_ip`; both stopped after."""
    sb = SandboxProcess(tmp, "--keep-creation-timestamp")
    echo = EchoServer("echo-abc-def", ns, address=backend_ip).start()
    try:
        sb.kubectl("apply", "--server-side", *sum((["-f", str(GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml")]
                                                  for n in ("gatewayclasses", "gateways", "httproutes")), []))
        sb.kubectl("apply", "--server-side", "-f", "-",
                   input=yaml.safe_dump_all(gateway_objects(echo.port, ns, controller, backend_ip)))
        yield sb, echo
    finally:
        echo.stop()
        sb.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with gateway_env(tmp_path_factory.mktemp("adopt"), NS, CONTROLLER, BACKEND_IP) as pair:
        yield pair


def _gateway(sb: SandboxProcess, state_dir) -> GatewayProcess:
    return GatewayProcess(sb.kubeconfig, state_dir, "--controller-name", CONTROLLER, "--allow-loopback-endpoints",
                          "--allow-unmanaged-endpointslices", pool=POOL)


def programmed_address(sb: SandboxProcess, ns: str = NS) -> str:
    def programmed():
        o = json.loads(sb.kubectl("get", "gateway", "gw", "-n", ns, "-o", "json").stdout)
        st = o.get("status") or {}
        ok = any(c.get("type") == "Programmed" and c.get("status") == "True" for c in st.get("conditions") or [])
        return st["addresses"][0]["value"] if ok and st.get("addresses") else None

    return wait_until(programmed, 30, what="Gateway gw Programmed")


class RequestStream:
    """A steady request stream (a new connection per request) in a thread; counts failures."""

    def __init__(self, address: str, path: str) -> None:
        self.address, self.path = address, path
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, _, _ = request(self.address, 80, self.path, timeout=5)
                if status == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"HTTP {status}")
            except OSError as exc:
                self.failed.append(repr(exc))
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)


def test_sigkill_leaves_nginx_serving_and_the_next_gateway_adopts_it(env, tmp_path):
    """SIGKILL of the gateway under a steady request stream: no request fails; the next gateway on
    the same state directory adopts the running NGINX (same master pid, no restart) and applies an
    edit made while no gateway ran; SIGTERM of that one then stops NGINX."""
    sb, _ = env
    state = tmp_path / "state"
    first = _gateway(sb, state)
    second = None
    try:
        address = programmed_address(sb)
        wait_until(lambda: request(address, 80, "/steady")[0] == 200, 15, what="traffic")
        master = first.master_pid()
        assert master is not None and master in first.nginx_pids()
        stream = RequestStream(address, "/steady")
        try:
            time.sleep(0.5)
            first.stop(signal.SIGKILL, leave_nginx=True)
            time.sleep(1.0)  # no gateway runs: NGINX serves on
            assert alive(master)
            sb.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(route("edited", "/edited", NS)))
            assert request(address, 80, "/edited")[0] == 404  # nobody applied it yet
            second = _gateway(sb, state)
            wait_until(lambda: request(address, 80, "/edited")[0] == 200, 30,
                       what=f"the edit served by the adopted NGINX\n{second.tail()}")
            time.sleep(0.5)
        finally:
            stream.stop()
        assert stream.failed == [] and stream.ok > 50, (stream.ok, stream.failed[:5])
        assert second.master_pid() == master  # adopted, never restarted
        assert "adopted the running NGINX (master pid %d" % master in second.tail(200)
        second.stop(signal.SIGTERM, leave_nginx=True)
        wait_until(lambda: not alive(master), 15, what="NGINX stopped with the gateway's SIGTERM")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        sb.kubectl("delete", "httproute", "edited", "-n", NS, "--ignore-not-found")


def test_sigusr2_ends_the_gateway_and_leaves_nginx_to_the_next(env, tmp_path):
    """SIGUSR2 (a restart in place): the gateway exits 0, NGINX serves on and is adopted."""
    sb, _ = env
    state = tmp_path / "state"
    first = _gateway(sb, state)
    second = None
    try:
        address = programmed_address(sb)
        wait_until(lambda: request(address, 80, "/steady")[0] == 200, 15, what="traffic")
        master = first.master_pid()
        assert first.stop(signal.SIGUSR2, leave_nginx=True) == 0
        assert alive(master) and request(address, 80, "/steady")[0] == 200
        second = _gateway(sb, state)
        wait_until(lambda: "adopted the running NGINX" in second.tail(200), 15, what="adoption")
        assert second.master_pid() == master
    finally:
        first.stop()
        if second is not None:
            second.stop()
