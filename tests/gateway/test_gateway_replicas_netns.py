"""Every replica of `gwpolicy gateway` serves, across hosts: one replica per test host (a network
namespace of tests/netns.py), each running its own NGINX on its host's address (--pod-addresses),
an echo backend in the root namespace on the fabric, the sandbox reached from every host through a
relay on the host's loopback. A client spreads requests over the replicas' addresses."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time

import pytest
import yaml

import netns
from gateway_proc import GatewayProcess, request, wait_until
from gwpolicy.gateway.echo import EchoServer
from sandbox_proc import GW_CRDS, SandboxProcess

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

NS = "replicas"
CONTROLLER = "example.com/replicas"
LEASE_SECONDS = 3  # tests/gateway_proc.py's --lease-duration


def _route(name: str, path: str) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                                "backendRefs": [{"name": "echo", "port": 8080}]}]}}


def _objects(address: str, port: int) -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "replicas"},
         "spec": {"controllerName": CONTROLLER}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": NS},
         "spec": {"gatewayClassName": "replicas", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": NS},
         "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "echo-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "echo"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]},
        *[_route(f"r{i}", f"/r{i}") for i in range(5)],
    ]


class Cluster:
    """Three hosts, one gateway replica on each, leader election on a Lease."""

    def __init__(self, tmp) -> None:
        self.fabric = netns.Fabric(["r0", "r1", "r2"])
        self.closers = []
        self.sb = SandboxProcess(tmp)
        self.echo = None
        self.replicas: dict[str, GatewayProcess] = {}
        try:
            echo_address = self.fabric.add_root_address()
            self.echo = EchoServer("echo-abc-def", NS, address=echo_address).start()
            self.sb.kubectl("apply", "--server-side", *sum((["-f", str(GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml")]
                                                           for n in ("gatewayclasses", "gateways", "httproutes")), []))
            self.sb.kubectl("apply", "--server-side", "-f", "-",
                            input=yaml.safe_dump_all(_objects(echo_address, self.echo.port)))
            for name, host in self.fabric.hosts.items():
                self.closers.append(netns.forward_into(host, self.sb.port))
                self.replicas[name] = GatewayProcess(
                    self.sb.kubeconfig, tmp / name, "--pod-addresses", "--controller-name", CONTROLLER,
                    "--allow-unmanaged-endpointslices", lease_namespace=NS, prefix=host.command([]),
                    env={"POD_IP": host.address})
        except BaseException:
            self.close()
            raise

    def addresses(self) -> list[str]:
        return [h.address for h in self.fabric.hosts.values()]

    def gateway(self) -> dict:
        return json.loads(self.sb.kubectl("get", "gateway", "gw", "-n", NS, "-o", "json").stdout)

    def leader(self) -> str:
        lease = json.loads(self.sb.kubectl("get", "lease", "gwpolicy-gateway", "-n", NS, "-o", "json").stdout)
        return lease["spec"]["holderIdentity"]

    def kill(self, name: str) -> None:
        """The replica's pod dies: its gateway and its NGINX, both with SIGKILL."""
        gw = self.replicas[name]
        master = gw.master_pid()
        gw.stop(signal.SIGKILL, leave_nginx=True)
        if master is not None:
            for pid in [master, *_children(master)]:
                try:
                    import os
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        for gw in self.replicas.values():
            gw.stop()
        for c in self.closers:
            c()
        if self.echo is not None:
            self.echo.stop()
        self.sb.close()
        self.fabric.close()


def _children(pid: int) -> list[int]:
    from pathlib import Path

    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("replicas"))
    try:
        yield c
    finally:
        c.close()


def _status_addresses(c: Cluster) -> list[str]:
    st = c.gateway().get("status") or {}
    return sorted(a["value"] for a in st.get("addresses") or [])


def test_every_replica_serves_every_route_and_an_edit_reaches_all(cluster):
    c = cluster
    wanted = sorted(c.addresses())
    wait_until(lambda: _status_addresses(c) == wanted, 60,
               what=f"status.addresses = every replica's address {wanted}: {_status_addresses(c)}")
    for address in c.addresses():
        for i in range(5):
            wait_until(lambda: request(address, 80, f"/r{i}", timeout=5)[0] == 200, 30,
                       what=f"/r{i} through the replica at {address}")
    t0 = time.monotonic()
    c.sb.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(_route("new", "/new")))
    for address in c.addresses():
        wait_until(lambda: request(address, 80, "/new", timeout=5)[0] == 200, 30, step=0.02,
                   what=f"the edit served by the replica at {address}")
    print(f"edit served by all {len(wanted)} replicas after {time.monotonic() - t0:.2f} s")
    gw = c.gateway()
    programmed = next(x for x in gw["status"]["conditions"] if x["type"] == "Programmed")
    assert programmed["status"] == "True", programmed


def test_spec_addresses_are_what_status_says_and_every_replica_serves_the_gateway(cluster):
    """Serving on the pods' addresses, a Gateway's spec.addresses name where clients reach them (a
    load balancer in front of the pods, made by whoever runs it): status.addresses lists those, each
    with its type, instead of the replicas' addresses, and every replica serves the Gateway on its
    own address at the listener's port."""
    c = cluster
    lb = [{"type": "IPAddress", "value": "203.0.113.7"}, {"type": "Hostname", "value": "lb.example.com"}]
    gateway = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "lb", "namespace": NS},
               "spec": {"gatewayClassName": "replicas", "addresses": lb,
                        "listeners": [{"name": "http", "port": 8000, "protocol": "HTTP"}]}}
    route = _route("lb", "/lb")
    route["spec"]["parentRefs"] = [{"name": "lb"}]
    c.sb.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([gateway, route]))
    try:
        def status() -> dict:
            return json.loads(c.sb.kubectl("get", "gateway", "lb", "-n", NS, "-o", "json").stdout).get("status") or {}

        wait_until(lambda: status().get("addresses") == lb, 60, what=f"status.addresses = spec.addresses: {status()}")
        for address in c.addresses():
            wait_until(lambda: request(address, 8000, "/lb", timeout=5)[0] == 200, 30,
                       what=f"Gateway lb through the replica at {address}")
        conditions = {x["type"]: x["status"] for x in status()["conditions"]}
        assert conditions["Accepted"] == conditions["Programmed"] == "True", status()["conditions"]
        assert _status_addresses(c) == sorted(c.addresses())  # the Gateway without spec.addresses: the pods'
    finally:
        c.sb.kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all([gateway, route]))


class _Client:
    """Requests spread round-robin over the replicas' addresses; `retry`: an idempotent request that
    fails is sent again to the next address."""

    def __init__(self, addresses: list[str], retry: bool) -> None:
        self.addresses, self.retry = addresses, retry
        self.ok, self.failed, self.retried = 0, [], 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        ring = itertools.cycle(self.addresses)
        while not self._stop.is_set():
            for attempt in range(len(self.addresses) if self.retry else 1):
                address = next(ring)
                try:
                    if request(address, 80, "/r1", timeout=3)[0] == 200:
                        self.ok += 1
                        break
                    why = "not 200"
                except OSError as exc:
                    why = repr(exc)
                if attempt + 1 < (len(self.addresses) if self.retry else 1):
                    self.retried += 1
                    continue
                self.failed.append(f"{address}: {why}")
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)


def test_killing_the_leader_under_load_loses_nothing_for_a_retrying_client_and_status_moves(cluster):
    c = cluster
    wanted = sorted(c.addresses())
    wait_until(lambda: _status_addresses(c) == wanted, 60, what="every replica in status.addresses")
    leader = c.leader()
    survivors = [n for n in c.replicas if n != leader]
    retrying, plain = _Client(c.addresses(), True), _Client(c.addresses(), False)
    try:
        time.sleep(1.0)
        killed_at = time.monotonic()
        c.kill(leader)
        wait_until(lambda: c.leader() in survivors, LEASE_SECONDS + 5, step=0.1,
                   what="another replica holds the Lease")
        took_over = time.monotonic() - killed_at
        # the new leader writes status: the dead replica's address leaves status.addresses
        gone = c.fabric[leader].address
        wait_until(lambda: gone not in _status_addresses(c) and len(_status_addresses(c)) == 2, 2 * LEASE_SECONDS + 10,
                   what=f"status.addresses without {gone}: {_status_addresses(c)}")
        time.sleep(1.0)
    finally:
        retrying.stop()
        plain.stop()
    print(f"leader {leader} killed: another leads after {took_over:.1f} s; retrying client ok={retrying.ok} "
          f"retried={retrying.retried}; plain client ok={plain.ok} failed={len(plain.failed)}")
    assert took_over <= LEASE_SECONDS + 2  # the Lease duration, and the candidates' retry period
    assert retrying.failed == [] and retrying.ok > 100, (retrying.ok, retrying.failed[:5])
    # without retries, only the requests sent to the dead replica fail: those to the others succeed
    assert plain.ok > 100 and all(f.startswith(gone + ":") for f in plain.failed), plain.failed[:5]

