"""The process shell (kube/process.py) as a user meets it in each long-running command: `gwpolicy
controller`, `gateway` and `webhook` serve /healthz, /readyz, /statusz and /metrics on the address
they are given, and report their leader election the same way; on SIGTERM they exit 0 having given
their Lease up (another replica need not wait for it to expire) and closed their endpoints; a
replica that does not hold the Lease writes nothing until it takes it. The defaults themselves
(ports, the Lease's namespace, the shared flags) are tests/kube/test_process_defaults.py's.

Live: against each API server (GWPOLICY_TEST_SERVERS), each command as a process of its own."""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

import live_server
import test_process_defaults
from gateway_proc import request, wait_until

COMMANDS = ("controller", "gateway", "webhook")
LISTEN_FLAG = {"controller": "--listen", "gateway": "--listen", "webhook": "--health-listen"}
LEASE = {"controller": "gwpolicy-controller", "gateway": "gwpolicy-gateway"}
LEADER_METRIC = {"controller": "gwpolicy_leader", "gateway": "gwpolicy_gateway_leader", "webhook": "gwpolicy_leader"}
POOL = "127.0.79.0/24"  # this module's /24 (tests/gateway_kit.py), for the gateway's Gateways
GW = "gateway.networking.k8s.io"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"

OBJECTS = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}},
    {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "shell"},
     "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
    {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": {"name": "edge", "namespace": "shop"},
     "spec": {"gatewayClassName": "shell", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
    {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "edge-timeouts", "namespace": "shop"},
     "spec": {"targetRef": {"group": GW, "kind": "Gateway", "name": "edge"}, "override": {"connectionTimeout": "5s"}}},
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Command(test_process_defaults.Command):
    """`gwpolicy COMMAND` against `server`, its endpoints on 127.0.0.1:`port`, started."""

    GRACE = 30.0

    def __init__(self, command: str, server: Any, tmp: Path, *extra: str) -> None:
        self.port = _free_port()
        args = [LISTEN_FLAG[command], f"127.0.0.1:{self.port}", *extra]
        if command != "webhook":
            args += ["--lease-namespace", "default", "--lease-duration", "3", "--identity", f"{command}-under-test"]
        if command == "gateway":
            args += ["--state-dir", str(tmp / "state"), "--address-pool", POOL, "--debounce", "0.02"]
        if command == "webhook":
            args += ["--port", "0", "--no-register"]
        super().__init__(command, Path(server.kubeconfig), tmp / f"{command}.log", *args)
        self.wait_started()

    def get(self, path: str) -> tuple[int, str]:
        try:
            status, _, body = request("127.0.0.1", self.port, path, timeout=5)
        except OSError:
            return 0, ""
        return status, body.decode() if isinstance(body, bytes) else str(body)

    def statusz(self) -> dict[str, Any]:
        status, body = self.get("/statusz")
        return json.loads(body) if status == 200 else {}


@pytest.fixture
def server(server_kind: str, tmp_path: Path) -> Iterator[Any]:
    objects = tmp_path / "objects.yaml"
    objects.write_text(yaml.safe_dump_all(OBJECTS))
    s = live_server.start(server_kind, tmp_path, files=[objects])
    try:
        yield s
    finally:
        s.close()


def _need_nginx(command: str) -> None:
    if command == "gateway" and not Path("/usr/sbin/nginx").exists():
        pytest.skip("the gateway needs NGINX")


def _lease(server: Any, name: str) -> dict[str, Any] | None:
    r = server.http.get(f"{LEASES}/{name}")
    return r.json() if r.status_code == 200 else None


def _accepted_by(obj: dict[str, Any], controller: str) -> bool:
    entries = [a for a in (obj.get("status") or {}).get("ancestors") or [] if a.get("controllerName") == controller]
    return any(c.get("type") == "Accepted" and c.get("status") == "True" for a in entries for c in a.get("conditions") or [])


def _what_it_writes(server: Any, command: str) -> bool:
    """Whether the status `command` writes is there: the controller's ancestor entry on the
    policy, the gateway's Accepted on its GatewayClass."""
    if command == "controller":
        r = server.http.get("/apis/gwpolicy.io/v1alpha1/namespaces/shop/timeoutpolicies/edge-timeouts")
        return r.status_code == 200 and _accepted_by(r.json(), "gwpolicy.io/policy-controller")
    r = server.http.get(f"/apis/{GW}/v1/gatewayclasses/shell")
    conditions = (r.json().get("status") or {}).get("conditions") or [] if r.status_code == 200 else []
    return any(c.get("type") == "Accepted" and c.get("status") == "True" for c in conditions)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_serves_its_endpoints_where_told_and_stops_in_order(command: str, server: Any, tmp_path: Path) -> None:
    _need_nginx(command)
    cmd = Command(command, server, tmp_path)
    try:
        assert cmd.get("/healthz") == (200, "ok"), cmd.tail()
        wait_until(lambda: cmd.get("/readyz")[0] == 200, 60, what=f"{command} ready")
        assert cmd.get("/readyz")[1].startswith("ok")
        want_leader = command != "webhook"  # the webhook writes nothing and takes no Lease
        got = wait_until(lambda: (s := cmd.statusz()).get("synced") and s.get("leader") and s, 30,
                         what=f"{command}'s /statusz: synced, and leading where it elects")
        assert got["leaseNamespace"] == ("default" if want_leader else None), got
        assert got["leaderElectionProblem"] is None, got
        metrics = cmd.get("/metrics")[1]
        assert re.search(rf"^{LEADER_METRIC[command]} 1\.0$", metrics, re.M), metrics[:2000]
        if want_leader:
            held = _lease(server, LEASE[command])
            assert held and held["spec"]["holderIdentity"] == f"{command}-under-test", held
        else:
            assert _lease(server, "gwpolicy-controller") is None and _lease(server, "gwpolicy-webhook") is None
    except AssertionError as exc:
        cmd.stop()
        raise AssertionError(f"{exc}\n--- {command}:\n{cmd.tail()}") from None
    assert cmd.stop() == 0, cmd.tail()
    # given up, not left to expire: a standby takes over at once
    if command != "webhook":
        lease = _lease(server, LEASE[command])
        assert lease is not None and not lease["spec"].get("holderIdentity"), lease
    if command == "gateway":  # this replica's own Lease (what its NGINX serves) is gone too
        mine = server.http.get(f"{LEASES}/gwpolicy-gateway-gateway-under-test")
        assert mine.status_code == 404, mine.text
    assert cmd.get("/healthz")[0] == 0, "the endpoints are closed once it has exited"


@pytest.mark.parametrize("command", ["controller", "gateway"])
def test_a_replica_without_the_lease_writes_nothing_until_it_takes_it(command: str, server: Any,
                                                                       tmp_path: Path) -> None:
    _need_nginx(command)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    server.apply([{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": LEASE[command], "namespace": "default"},
                   "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
                            "acquireTime": now, "renewTime": now}}])
    cmd = Command(command, server, tmp_path)
    try:
        wait_until(lambda: cmd.get("/readyz")[0] == 200, 60, what=f"{command} ready (a standby is ready)")
        wait_until(lambda: cmd.statusz().get("synced"), 30, what=f"{command} synced")
        wait_until(lambda: (cmd.statusz().get("reconciles") or cmd.statusz().get("fullAnalyses") or 0) >= 1, 30,
                   what=f"{command} analysed the cluster")
        for _ in range(15):  # three seconds: several lease attempts, the writers idle
            assert not _what_it_writes(server, command), f"{command} wrote status without holding the Lease"
            time.sleep(0.2)
        assert cmd.statusz()["leader"] is False
        assert re.search(rf"^{LEADER_METRIC[command]} 0\.0$", cmd.get("/metrics")[1], re.M)
        server.http.delete(f"{LEASES}/{LEASE[command]}")  # the other replica is gone
        wait_until(lambda: _what_it_writes(server, command), 30, what=f"{command} writes once it holds the Lease")
        assert cmd.statusz()["leader"] is True
    except AssertionError as exc:
        cmd.stop()
        raise AssertionError(f"{exc}\n--- {command}:\n{cmd.tail()}") from None
    assert cmd.stop() == 0, cmd.tail()
