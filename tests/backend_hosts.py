"""Echo backends at addresses a real API server takes in an EndpointSlice.

kube-apiserver refuses a loopback address in an EndpointSlice (`may not be in the loopback range
(127.0.0.0/8, ::1/128)`): a cluster's pods never have one. Against it the gateway tests run their echo
backends on a test host of tests/netns.py (a network namespace on a bridge of the run's own, in
198.18.0.0/16, reached from the machine through the bridge). Nothing leaves the machine. It needs
what network namespaces need (`netns.unavailable()` says what is missing); the host and its
processes go when `stop()` is called, at interpreter exit, and what a run that died left is removed
by the next fabric made.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import netns

HERE = Path(__file__).resolve().parent
FIRST = 10  # address(i) is the fabric's network + FIRST + i: above the bridge (.1) and the host (.2)


def missing() -> str | None:
    """Why this machine cannot have such a host, or None."""
    why = netns.unavailable()
    return f"backends at non-loopback addresses need a network namespace: {why}" if why else None


class BackendHost:
    """A test host: `address(i)` is its i-th address (1-127); `serve(specs)` starts echo backends there."""

    def __init__(self) -> None:
        self.fabric = netns.Fabric(["backends"])
        self.host = self.fabric["backends"]
        self.procs: list[subprocess.Popen[str]] = []
        self.addresses: set[int] = set()
        self.v6: set[int] = set()

    def address(self, i: int) -> str:
        if not 1 <= i <= 127:
            raise ValueError(f"address index {i}: 1-127")
        address = str(ipaddress.ip_address(self.fabric.subnet.network_address) + FIRST + i)
        if i not in self.addresses:
            self.host.add_address(address, device="eth0")
            self.addresses.add(i)
        return address

    def address6(self, i: int) -> str:
        """The host's i-th IPv6 address (1-127), in a unique local /64 of the fabric's own (from its
        IPv4 /24), the bridge holding the prefix' first address: reached from the machine as the
        IPv4 ones are. Duplicate address detection is off, so the address is usable at once."""
        if not 1 <= i <= 127:
            raise ValueError(f"address index {i}: 1-127")
        net = self.fabric.subnet.network_address.packed
        prefix = f"fd00:{net[0]:x}{net[1]:02x}:{net[2]:x}::"
        if not self.v6:
            netns._ip("addr", "add", f"{prefix}1/64", "dev", self.fabric.bridge, "nodad")
        address = str(ipaddress.ip_address(f"{prefix}{FIRST + i:x}"))  # canonical, as the API server wants it
        if i not in self.v6:
            netns._ip("-n", self.host.netns, "addr", "add", f"{address}/64", "dev", "eth0", "nodad")
            self.v6.add(i)
        return address

    def serve(self, specs: list[dict[str, Any]]) -> None:
        """Echo backends (`gwpolicy.gateway.echo.EchoServer` arguments: pod, namespace, address, port,
        cert, key) in one process on the host; returns once every one listens."""
        proc = self.host.popen([sys.executable, str(HERE / "echo_host.py")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(specs) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.strip() == "ready", f"echo backends did not start: {line} {proc.stderr.read() if proc.poll() is not None else ''}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.procs = []
        self.fabric.close()
