"""tests/netns.py: hosts in network namespaces on a bridge, real HTTP between them, and nothing
left behind (after success, after a failure, after a killed run).

Addresses come from the fabric's own /24 of 198.18.0.0/16 (not 127.0.0.0/8: loopback is not
routed between namespaces); see tests/netns.py.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import netns
from netns import CLUSTER_IPS, Fabric, Host, leftovers, run_in_thread, sweep

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

TESTS = Path(__file__).resolve().parents[1]
TIMEOUT = 5.0


class _Who(BaseHTTPRequestHandler):
    """Answers JSON naming the server (its label) and the peer address it saw."""

    server: "_WhoServer"

    def do_GET(self) -> None:
        body = json.dumps({"server": self.server.label, "peer": self.client_address[0], "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _WhoServer(ThreadingHTTPServer):
    daemon_threads = True
    label = ""


@contextmanager
def serving(label: str, address: str, port: int = 8080, host: Host | None = None) -> Iterator[_WhoServer]:
    """An HTTP server on address:port, its socket made inside `host` (the root namespace if None)."""
    def make() -> _WhoServer:
        return _WhoServer((address, port), _Who)

    server = host.call(make) if host is not None else make()
    server.label = label
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        t.join(TIMEOUT)


def get(address: str, port: int = 8080, path: str = "/") -> dict[str, str]:
    conn = http.client.HTTPConnection(address, port, timeout=TIMEOUT)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == 200
        return json.loads(resp.read())  # type: ignore[no-any-return]
    finally:
        conn.close()


def test_http_from_one_host_to_another() -> None:
    with Fabric(["client", "server"]) as fab:
        client, server = fab["client"], fab["server"]
        with serving("server", server.address, host=server):
            got = client.call(get, server.address, 8080, "/hello")
        assert got == {"server": "server", "peer": client.address, "path": "/hello"}
        # the calling thread is back in the root namespace, which reaches the host through the bridge
        with serving("server", server.address, host=server):
            assert get(server.address)["peer"] == fab.gateway


def test_a_command_in_a_host_reaches_a_server_in_the_root_namespace() -> None:
    with Fabric(["client"]) as fab:
        address = fab.add_root_address()
        script = f"import urllib.request; print(urllib.request.urlopen('http://{address}:8080/x', timeout={TIMEOUT}).read().decode())"
        with serving("root", address):
            run = fab["client"].run([sys.executable, "-c", script])
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout) == {"server": "root", "peer": fab["client"].address, "path": "/x"}


def test_a_hosts_own_hosts_file_names_addresses_for_its_commands_only() -> None:
    with Fabric(["a", "b"]) as fab:
        fab["a"].hosts_file({"api.external.test": fab.gateway})
        lookup = [sys.executable, "-c", "import socket; print(socket.gethostbyname('api.external.test'))"]
        run = fab["a"].run(lookup)
        assert run.returncode == 0 and run.stdout.strip() == fab.gateway, run.stderr
        assert fab["b"].run(lookup).returncode != 0  # b has no such name
        etc = netns.ETC_NETNS / fab["a"].netns
        assert (etc / "hosts").exists() and f"etc {fab['a'].netns}" in leftovers(fab.id)
    assert not etc.exists() and leftovers(fab.id) == []


def test_the_same_address_in_two_hosts_is_each_hosts_own() -> None:
    # a Service's cluster IP served by a proxy in each client namespace: each host reaches its own
    cluster_ip = str(CLUSTER_IPS.network_address + 10)
    with Fabric(["a", "b", "c"]) as fab:
        for name in ("a", "b"):
            assert fab[name].add_address(cluster_ip) == cluster_ip
        with serving("proxy-a", cluster_ip, 80, host=fab["a"]), serving("proxy-b", cluster_ip, 80, host=fab["b"]):
            assert fab["a"].call(get, cluster_ip, 80)["server"] == "proxy-a"
            assert fab["b"].call(get, cluster_ip, 80)["server"] == "proxy-b"
            # c has no proxy and no route to that range: refused by its own kernel at once
            with pytest.raises(OSError) as caught:
                fab["c"].call(socket.create_connection, (cluster_ip, 80), TIMEOUT)
            assert caught.value.errno == errno.ENETUNREACH


def test_nothing_leaves_the_fabric() -> None:
    # no default route in a host: an address outside the fabric's /24 is unreachable, not sent out
    with Fabric(["a"]) as fab:
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            fab["a"].call(socket.create_connection, ("203.0.113.7", 80), TIMEOUT)
        assert caught.value.errno == errno.ENETUNREACH
        assert time.monotonic() - started < 1.0
        assert fab["a"].run(["ip", "-4", "route", "show", "default"]).stdout.strip() == ""


def test_a_route_through_the_bridge_reaches_a_further_network() -> None:
    with Fabric(["client", "router"]) as fab:
        client, router = fab["client"], fab["router"]
        far = str(CLUSTER_IPS.network_address + 77)
        router.add_address(far)
        client.add_route(f"{far}/32", via=router.address)
        with serving("router", far, host=router):
            assert client.call(get, far)["server"] == "router"


def test_every_host_reaches_every_other() -> None:
    names = [f"h{i}" for i in range(5)]
    with Fabric(names) as fab:
        addresses = {h.address for h in fab.hosts.values()}
        assert len(addresses) == len(names), addresses
        with serving("h0", fab["h0"].address, host=fab["h0"]) as s0, \
                serving("h1", fab["h1"].address, host=fab["h1"]), \
                serving("h2", fab["h2"].address, host=fab["h2"]), \
                serving("h3", fab["h3"].address, host=fab["h3"]), \
                serving("h4", fab["h4"].address, host=fab["h4"]):
            assert s0.label == "h0"
            for src in fab.hosts.values():
                for dst in fab.hosts.values():
                    if src is not dst:
                        got = src.call(get, dst.address)
                        assert (got["server"], got["peer"]) == (dst.name, src.address)


def test_a_server_started_in_a_thread_inside_a_host() -> None:
    with Fabric(["server"]) as fab:
        host = fab["server"]
        server = run_in_thread(host, lambda: _WhoServer((host.address, 8080), _Who))
        server.label = "threaded"
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        try:
            assert get(host.address)["server"] == "threaded"
        finally:
            server.shutdown()
            server.server_close()


def test_the_calling_thread_returns_to_its_namespace_after_an_error() -> None:
    own = os.readlink("/proc/thread-self/ns/net")
    with Fabric(["a"]) as fab:
        with pytest.raises(ZeroDivisionError):
            with fab["a"].enter():
                assert os.readlink("/proc/thread-self/ns/net") != own
                raise ZeroDivisionError
        assert os.readlink("/proc/thread-self/ns/net") == own


def test_close_leaves_nothing_also_after_a_failure() -> None:
    fab_id = ""
    with pytest.raises(RuntimeError, match="inside the block"):
        with Fabric(["a", "b"]) as fab:
            fab_id = fab.id
            fab.add_root_address()
            assert len(leftovers(fab_id)) == 5  # two namespaces, the bridge, two veth ends
            raise RuntimeError("inside the block")
    assert leftovers(fab_id) == []
    assert not (netns.STATE_DIR / f"{fab_id}.json").exists()
    assert fab_id not in subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout


def test_what_a_killed_run_left_is_swept() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            sys.path.insert(0, sys.argv[1])
            import netns
            fab = netns.Fabric(["a", "b"])
            print(fab.id, flush=True)
            time.sleep(60)
        """), str(TESTS)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        fab_id = child.stdout.readline().strip()
        assert len(leftovers(fab_id)) == 5, leftovers(fab_id)
        child.send_signal(signal.SIGKILL)
        child.wait(TIMEOUT)
        assert len(leftovers(fab_id)) == 5  # no cleanup ran in the killed process
        with netns._locked():
            swept = sweep()
        assert fab_id in swept
        assert leftovers(fab_id) == []
        assert not (netns.STATE_DIR / f"{fab_id}.json").exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(TIMEOUT)


def test_a_live_fabric_of_another_process_is_not_swept() -> None:
    with Fabric(["a"]) as fab:
        with netns._locked():
            assert fab.id not in sweep()
        assert len(leftovers(fab.id)) == 3


def test_two_fabrics_at_once_take_different_subnets() -> None:
    with Fabric(["a"]) as one, Fabric(["a"]) as two:
        assert not one.subnet.overlaps(two.subnet)
        with serving("two", two["a"].address, host=two["a"]):
            # one's host is not on two's bridge: two's /24 is not reachable from it
            with pytest.raises(OSError) as caught:
                one["a"].call(socket.create_connection, (two["a"].address, 8080), TIMEOUT)
            assert caught.value.errno == errno.ENETUNREACH


def test_without_the_capabilities_the_reason_says_so() -> None:
    # what a user without root sees in the skip message: the missing capabilities, named
    run = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r}); import netns; print(netns.unavailable())"],
        capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert "CAP_NET_ADMIN and CAP_SYS_ADMIN" in run.stdout and "not root" in run.stdout, run.stdout
