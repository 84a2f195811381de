"""A `gwpolicy gateway` process for tests (real process, real NGINX), its NGINX pids, and a plain
HTTP client that opens a fresh connection per request (reloads never break a request that way)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gateway_kit import TEST_ENDPOINT_FLAGS
from sandbox_proc import BIN

#: the CP engineer's loopback range: Gateways get addresses from here, echo backends from the next
GATEWAY_POOL = "127.0.20.0/24"


class GatewayProcess:
    def __init__(self, kubeconfig: Path, state_dir: Path, *extra: str, pool: str = GATEWAY_POOL,
                 lease_namespace: str | None = None, prefix: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        """`prefix`: a command the gateway runs under (`ip netns exec NAME`); `env`: added to ours."""
        self.state_dir = state_dir
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.log = open(self.log_path, "w")
        election = (["--lease-namespace", lease_namespace, "--lease-duration", "3", "--identity", state_dir.name]
                    if lease_namespace else ["--no-leader-election"])
        self.proc = subprocess.Popen([*(prefix or []), str(BIN / "gwpolicy"), "gateway", "--kubeconfig", str(kubeconfig),
                                      "--listen", "127.0.0.1:0", *election, "--state-dir", str(state_dir),
                                      "--address-pool", pool, "--debounce", "0.02", *TEST_ENDPOINT_FLAGS, *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.port = None
        end = time.monotonic() + 30
        lines = []
        while time.monotonic() < end:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            self.log.write(line)
            m = re.search(r"serving health and metrics on port (\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        assert self.port, "gwpolicy gateway did not start:\n" + "".join(lines)
        self._drain = threading.Thread(target=self._copy_log, daemon=True)
        self._drain.start()

    def _copy_log(self) -> None:
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()

    def tail(self, n: int = 40) -> str:
        self.log.flush()
        return "".join(self.log_path.read_text().splitlines(True)[-n:])

    def nginx_pids(self) -> list[int]:
        """The NGINX master started for this gateway and its workers."""
        out = []
        for child in _children(self.proc.pid):
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"nginx" in cmd:
                out.append(child)
                out += _children(child)
        return out

    def master_pid(self) -> int | None:
        """The NGINX master this gateway's state directory records (started or adopted), if it runs."""
        return nginx_master(self.state_dir)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0, leave_nginx: bool = False) -> int:
        """Stop the gateway with `sig`; then, unless `leave_nginx`, the NGINX it leaves serving too
        (after SIGKILL or SIGUSR2 it outlives the gateway: no test leaves one behind)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if not self.log.closed:
            self._drain.join(2)
            self.log.close()
        if not leave_nginx:
            stop_nginx(self.state_dir)
        return self.proc.returncode


def nginx_master(state_dir: Path) -> int | None:
    """The running NGINX master recorded in a gateway's state directory (nginx.json), or None."""
    try:
        rec = json.loads((state_dir / "nginx.json").read_text())
    except (OSError, ValueError):
        return None
    pid = rec.get("pid")
    return pid if isinstance(pid, int) and alive(pid) and _start(pid) == rec.get("start") else None


def stop_nginx(state_dir: Path) -> None:
    """Quit the NGINX a gateway left serving in `state_dir` (SIGQUIT, then SIGKILL), and wait for it."""
    pid = nginx_master(state_dir)
    if pid is None:
        return
    for sig, wait in ((signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if not alive(pid):
            return


def _start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    """Children of every thread of `pid` (a child started from a thread is listed under that thread)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class _TLSConnection(http.client.HTTPConnection):
    """HTTPS to an address with the SNI (and certificate name) of a hostname."""

    def __init__(self, address: str, port: int, ctx: ssl.SSLContext, sni: str, timeout: float) -> None:
        super().__init__(address, port, timeout=timeout)
        self.ctx, self.sni = ctx, sni

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self.ctx.wrap_socket(sock, server_hostname=self.sni)


def request(address: str, port: int, path: str, *, method: str = "GET", host: str | None = None,
            headers: dict[str, str] | None = None, timeout: float = 10.0, tls: ssl.SSLContext | None = None,
            sni: str | None = None, body: bytes | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request on a new connection (with `body` and its Content-Length when given); returns
    status, headers (in order) and body."""
    if tls is not None:
        conn: http.client.HTTPConnection = _TLSConnection(address, port, tls, sni or host or address, timeout)
    else:
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        default_port = 443 if tls is not None else 80
        conn.putheader("Host", host if host else (address if port == default_port else f"{address}:{port}"))
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, list(resp.getheaders()), body
    finally:
        conn.close()


def wait_until(pred: Any, timeout: float = 30.0, step: float = 0.1, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = pred()
        except Exception as exc:  # noqa: BLE001 - retried until the timeout
            v, last = None, exc
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"{what} not reached in {timeout}s" + (f" (last error: {last})" if last else ""))
