"""Debian's NGINX with a hand-written configuration, for the prototypes that try a data-plane design
before the renderer writes it (HTTP/2 listeners, tracing). `RawNginx(tmp, http="...")` wraps the
given http-context text (and optional stream-context text) in a complete nginx.conf, checks it with
`nginx -t`, runs the master in the foreground as our child (it dies with the test process, and
`stop()` ends it), and reloads a new text with `reload()`. Unix sockets belong under `.sockets`;
the text may name it `@sockets@`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

MODULES = Path("/usr/lib/nginx/modules")


def _pdeathsig() -> None:  # pragma: no cover - runs in the child
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class RawNginx:
    def __init__(self, tmp: Path, *, http: str, stream: str = "", modules: tuple[str, ...] = (),
                 worker_processes: int = 1) -> None:
        self.dir = tmp
        (tmp / "tmp").mkdir(parents=True, exist_ok=True)
        self.conf = tmp / "nginx.conf"
        self.error_log = tmp / "error.log"
        self.modules, self.n_workers = modules, worker_processes
        self.proc: subprocess.Popen[bytes] | None = None
        #: where unix sockets go: a directory NGINX's workers (another user when the master is root)
        #: can reach, which a test's 0700 temporary directory is not
        self.sockets = Path(tempfile.mkdtemp(prefix="gwp-raw-"))
        self.sockets.chmod(0o711)
        self._write(http, stream)

    def _write(self, http: str, stream: str) -> None:
        d = self.dir
        loads = "".join(f"load_module {MODULES / m};\n" for m in self.modules)
        temp = " ".join(f"{k}_temp_path {d / 'tmp'};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        text = (f"{loads}worker_processes {self.n_workers};\nerror_log {self.error_log} info;\npid {d / 'nginx.pid'};\n"
                f"events {{ worker_connections 1024; }}\n"
                f"http {{\n  access_log off;\n  {temp}\n{http}\n}}\n"
                + (f"stream {{\n{stream}\n}}\n" if stream else ""))
        self.conf.write_text(text.replace("@sockets@", str(self.sockets)))

    def check(self) -> str:
        """`nginx -t` over the configuration: '' when it passes, else what NGINX said."""
        out = subprocess.run(["nginx", "-t", "-p", str(self.dir), "-c", str(self.conf)], capture_output=True,
                             text=True, timeout=30)
        return "" if out.returncode == 0 else out.stderr

    def start(self) -> "RawNginx":
        problem = self.check()
        assert not problem, problem
        self.proc = subprocess.Popen(["nginx", "-p", str(self.dir), "-c", str(self.conf), "-g", "daemon off;"],
                                     preexec_fn=_pdeathsig, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_for_workers(set())
        return self

    def workers(self) -> set[int]:
        assert self.proc is not None
        try:
            return set(map(int, Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()))
        except OSError:
            return set()

    def _wait_for_workers(self, old: set[int], timeout: float = 15.0) -> None:
        """Until the master runs `worker_processes` workers, none of them from before (a reload is done)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc is not None and self.proc.poll() is None, self.error_log.read_text()[-2000:]
            now = self.workers()
            if len(now) >= self.n_workers and not (now & old):
                return
            time.sleep(0.02)
        raise AssertionError(f"NGINX did not (re)start its workers: {self.error_log.read_text()[-2000:]}")

    def reload(self, *, http: str, stream: str = "") -> None:
        self._write(http, stream)
        problem = self.check()
        assert not problem, problem
        old = self.workers()
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)
        self._wait_for_workers(old)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.sockets, ignore_errors=True)

    def __enter__(self) -> "RawNginx":
        try:
            return self.start()
        except BaseException:
            self.stop()  # a configuration NGINX refused: the socket directory goes too
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> list[int]:
        return ([self.proc.pid] if self.proc else []) + sorted(self.workers())


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes so far (from /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")
