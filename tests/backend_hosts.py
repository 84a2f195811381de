"""Echo backends at addresses a real API server takes in an EndpointSlice.

kube-apiserver refuses a loopback address in an EndpointSlice (`may not be in the loopback range
(127.0.0.0/8, ::1/128)`): a cluster's pods never have one. Against it the gateway tests run their echo
backends on a test host of the run's own: a network namespace reached from the machine through a veth
pair, the backends on addresses of 198.18.N.0/24 (RFC 2544's range for benchmark networks; nothing
else here uses it), the machine's end at 198.18.N.254. Nothing leaves the machine. It needs root (`ip
netns`); the namespace, its veth pair and its processes go when `stop()` is called, at interpreter exit,
and a namespace left by a run that died is removed by the next one.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def missing() -> str | None:
    """Why this machine cannot have such a host, or None."""
    if os.geteuid() != 0:
        return "backends at non-loopback addresses need a network namespace, and so root"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def _remove_stale() -> None:
    """Namespaces of runs whose process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        m = re.match(r"(gwpb(\d+)-(\d+))\b", line)
        if m and not Path(f"/proc/{m.group(3)}").exists():
            _ip("netns", "del", m.group(1), check=False)
            _ip("link", "del", f"gwpb{m.group(2)}", check=False)


class BackendHost:
    """A test host: `address(i)` is its i-th address (1-253); `serve(specs)` starts echo backends there."""

    def __init__(self) -> None:
        _remove_stale()
        for n in range(1, 250):
            link = f"gwpb{n}"
            if Path(f"/sys/class/net/{link}").exists():
                continue
            ns = f"{link}-{os.getpid()}"
            if _ip("netns", "add", ns, check=False).returncode != 0:
                continue
            if _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns, check=False).returncode != 0:
                _ip("netns", "del", ns, check=False)
                continue  # another run took that number between our look and our add
            self.n, self.link, self.ns = n, link, ns
            break
        else:
            raise RuntimeError("no free test network in 198.18.1-249.0/24")
        self.procs: list[subprocess.Popen] = []
        self.addresses: set[int] = set()
        atexit.register(self.stop)
        _ip("addr", "add", f"198.18.{self.n}.254/24", "dev", self.link)
        _ip("link", "set", self.link, "up")
        _ip("link", "set", "lo", "up", ns=self.ns)
        _ip("link", "set", "eth0", "up", ns=self.ns)

    def address(self, i: int) -> str:
        if i not in self.addresses:
            _ip("addr", "add", f"198.18.{self.n}.{i}/24", "dev", "eth0", ns=self.ns)
            self.addresses.add(i)
        return f"198.18.{self.n}.{i}"

    def serve(self, specs: list[dict[str, Any]]) -> None:
        """Echo backends (`gwpolicy.gateway.echo.EchoServer` arguments: pod, namespace, address, port,
        cert, key) in one process on the host; returns once every one listens."""
        for s in specs:
            self.address(int(s["address"].rsplit(".", 1)[1]))
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, str(HERE / "echo_host.py")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
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
        if getattr(self, "ns", None):
            _ip("netns", "del", self.ns, check=False)
            _ip("link", "del", self.link, check=False)
            self.ns = ""
