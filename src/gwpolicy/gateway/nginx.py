"""The NGINX child process: stage, validate, swap, reload, verify, roll back (the edge of the gateway).

A reload counts only once the new configuration is seen serving: `nginx -s reload` exits 0 even
when the master then fails to apply the configuration (a port in use), so every generation
carries a probe (`control.conf`: `GET /generation` on a unix socket answers its number) and the
error log written since the SIGHUP is read for `[emerg]`. The first configuration is checked with
`nginx -t` before NGINX starts; a new one is checked by the running master itself on SIGHUP (the
same parse `nginx -t` makes, done once instead of twice): when it rejects it, or cannot apply it
(a port in use), it keeps serving the old one, `current` points at the old one again and the new
tree is removed, so a configuration NGINX rejects is never loaded nor left on disk
(`test_reloads=True` runs `nginx -t` before every reload as well).

NGINX outlives the process that runs it. The master is started by setsid(2), apart from our process group (a signal
to the gateway's process group does not reach it) and is not tied to our life: when the gateway is
killed, crashes or is restarted, NGINX goes on serving the last configuration it took. What a
successor needs to find it is in `root/nginx.json` (the master's pid and start time, its control
socket, the generation it serves and the digest of that generation's files), written after every
successful apply. A new `Nginx` on the same `root` adopts a master it finds there (`adopted`): the
pid must still be that process (same start time), an NGINX master started on this `root`, and its
control socket must answer the recorded generation; then nothing is restarted, and an `apply` of
the same files reloads nothing. A master that fails those checks but is still ours (it holds our
ports) is stopped, and a new one starts with the next `apply`. `stop()` quits NGINX (SIGQUIT:
in-flight requests end first, then SIGTERM, then SIGKILL); `release()` lets go of it and leaves it
serving, for the next process. Only with `outlive=True` (the gateway) does NGINX outlive a normal
exit of the interpreter that forgot both (tests and benchmarks never leave one behind).

With `sidecar=True` this process never starts NGINX itself: `gwpolicy nginx-sidecar` (gateway/sidecar.py)
runs it, in a container of its own, on the same `root` (a volume both containers mount at the same
path, in a pod whose containers share one process namespace), and records its master in
`root/nginx-sidecar.json`. The first `apply` writes the generation, points `current` at it and
waits for that master (which reads `current` when it starts, or is told to reload), and every
later `apply` signals it as above; the unix sockets live in `root/sockets/`, which both see.

Layout under `root`: `gen-<n>/` one directory per generation, `current -> gen-<n>` (NGINX runs
with `-p root/current/`, so a SIGHUP reads the new generation), `run/` (pid, temp files),
`logs/error.log`, `nginx.json`.
"""

from __future__ import annotations

import atexit
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: the unix sockets a rendered configuration names live under this placeholder (pure rendering
#: cannot know where); `Nginx` puts them in its own short directory when it writes the files
from gwpolicy.gateway.dataplane import SOCKET_DIR

MIN_VERSION = (1, 22)
STATE_FILE = "nginx.json"
SIDECAR_FILE = "nginx-sidecar.json"  # the master `gwpolicy nginx-sidecar` runs: {"pid", "start", "sidecar"}
_SEVERE = re.compile(r"\[(emerg|alert|crit)\]")


class NginxError(RuntimeError):
    """NGINX is missing or unusable; the message says what to install or fix."""


@dataclass(frozen=True)
class ReloadResult:
    generation: int  # the generation serving after this call
    ok: bool
    error: str = ""
    changed: bool = True  # False: the files were the ones already serving, nothing was reloaded
    seconds: float = 0.0  # the whole apply
    test_seconds: float = 0.0  # of which `nginx -t`
    reload_seconds: float = 0.0  # of which SIGHUP (or start) until the new generation answered


def nginx_version(binary: str = "nginx") -> tuple[int, int, int]:
    """The version of the NGINX binary, or NginxError saying what is missing."""
    path = shutil.which(binary) or (binary if os.path.exists(binary) else None)
    if path is None:
        raise NginxError(f"NGINX not found ({binary!r} is not on PATH): install the Debian package "
                         f"'nginx' (./dev test installs it) or pass the path of an nginx binary")
    try:
        out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10)
    except OSError as e:
        raise NginxError(f"cannot run {path}: {e}") from e
    m = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", out.stderr + out.stdout)
    if m is None:
        raise NginxError(f"{path} -v did not print an NGINX version: {(out.stderr or out.stdout).strip()!r}")
    version = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if version[:2] < MIN_VERSION:
        raise NginxError(f"NGINX {'.'.join(map(str, version))} at {path} is too old: this data plane needs "
                         f"{'.'.join(map(str, MIN_VERSION))} or newer")
    return version


def check_modules(files: dict[str, bytes]) -> None:
    """Every `load_module` of nginx.conf exists (njs comes from Debian's libnginx-mod-http-js, the
    stream module of TLS passthrough from libnginx-mod-stream)."""
    for m in re.finditer(rb"^\s*load_module\s+([^;]+);", files.get("nginx.conf", b""), re.M):
        path = m.group(1).decode()
        if not os.path.exists(path):
            if "stream_js" in path:
                raise NginxError(f"NGINX module {path} is missing (install the Debian package 'libnginx-mod-stream-js'); "
                                 "a GRPCRoute on a plaintext listener needs it (HTTP/1.1 and h2c on one port)")
            if "stream" in path:
                raise NginxError(f"NGINX module {path} is missing (install the Debian package 'libnginx-mod-stream'); "
                                 "TLS passthrough listeners need it")
            hint = " (install the Debian package 'libnginx-mod-http-js')" if "js" in path else ""
            raise NginxError(f"NGINX module {path} is missing{hint}; header, query and method matches need it")


def files_digest(files: dict[str, bytes]) -> str:
    """A digest of a rendered configuration (render's output, before `Nginx` writes it): equal
    inputs render byte-equal files, so two replicas serving one configuration have one digest."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + len(files[name]).to_bytes(8, "big") + files[name])
    return "sha256:" + h.hexdigest()


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), None when the process is
    gone or a zombie: a pid with another start time is another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def nginx_command(binary: str, root: Path) -> list[str]:
    """How NGINX runs on `root` (in the foreground, reading `root/current/`), whoever starts it: an
    adoption recognises a master by this command line."""
    cur = root / "current"
    return [binary, "-p", f"{cur}/", "-c", str(cur / "nginx.conf"), "-e", str(root / "logs" / "error.log"),
            "-g", "daemon off;"]


def runs_on(pid: int, root: Path) -> bool:
    """Is `pid` an NGINX master started by `nginx_command` on `root`?"""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"nginx" in title and f"{root}/current/".encode() in title


def sidecar_master(root: Path) -> tuple[int, str] | None:
    """(pid, start time) of the NGINX master `gwpolicy nginx-sidecar` runs on `root`, when it runs."""
    try:
        rec = json.loads((root / SIDECAR_FILE).read_text())
        pid, start = int(rec["pid"]), str(rec["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (pid, start) if start_time(pid) == start and runs_on(pid, root) else None


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Nginx:
    """One NGINX master serving the generations `apply` hands it; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], *, binary: str = "nginx", verify_timeout: float = 60.0,
                 keep_generations: int = 2, test_reloads: bool = False, outlive: bool = False,
                 sidecar: bool = False) -> None:
        self.root = Path(root).resolve()
        #: False (a library user: tests, benchmarks): NGINX is stopped when this interpreter exits
        #: normally, if `stop()` or `release()` did not come first. The gateway passes True: NGINX
        #: outlives it whatever way it ends, unless it stops NGINX itself
        self.outlive = outlive
        #: run `nginx -t` before a reload too. Off by default: the master checks the new configuration
        #: itself on SIGHUP and keeps the running one when it rejects it (see "Reloads" in
        #: docs/gateway.md), so a separate test only parses the whole configuration a second time
        self.test_reloads = test_reloads
        #: NGINX is run by `gwpolicy nginx-sidecar` on this root, never started here (module docstring)
        self.sidecar = sidecar
        self.binary = shutil.which(binary) or binary
        self.verify_timeout = verify_timeout
        self.keep = max(2, keep_generations)
        self.version = nginx_version(binary)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None  # the master, when this process started it
        self._master: tuple[int, str] | None = None  # (pid, start time) of the master, started or adopted
        self._generation = 0
        self._attempt = 0
        self._digest: str | None = None  # files_digest of the generation serving
        #: (pid, generation) of a running master this process took over from an earlier one, or None
        self.adopted: tuple[int, int] | None = None
        #: why a master found in nginx.json was not adopted (and was stopped), or None
        self.not_adopted: str | None = None
        for d in ("run", "logs"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.error_log = self.root / "logs" / "error.log"
        self._sockdir = ""
        self._adopt()
        # generations an earlier process left here (a restart on the same --state-dir): nothing this
        # process starts reads them, and they may hold private keys of Secrets deleted since; the
        # numbering goes on after the highest, so a new generation never takes an old one's number.
        # The generation an adopted master serves stays.
        old = self._generations()
        self._attempt = max((n for n, _ in old), default=0)
        for n, p in old:
            if n != self._generation or self.adopted is None:
                shutil.rmtree(p, ignore_errors=True)
        if not self._sockdir and sidecar:  # where the sidecar's NGINX sees them too
            self._sockdir = str(self.root / "sockets")
            os.makedirs(self._sockdir, exist_ok=True)
            os.chmod(self._sockdir, 0o711)
        if not self._sockdir:
            self._sockdir = tempfile.mkdtemp(prefix="gwng-")  # unix socket paths must stay short
            # NGINX's workers (another user when the master runs as root) connect to the sockets of a
            # passthrough port's HTTPS servers and relays: they must be able to pass through the directory
            os.chmod(self._sockdir, 0o711)
        self.control_socket = os.path.join(self._sockdir, "control.sock")
        if not outlive:
            atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        if self.pid is not None:
            self.stop()

    def _adopt(self) -> None:
        """Take over the master an earlier process on this root left running (see the module
        docstring); stop one that is ours but fails the checks."""
        try:
            rec = json.loads((self.root / STATE_FILE).read_text())
            pid, start, sockdir, gen, digest = (int(rec["pid"]), str(rec["start"]), str(rec["sockdir"]),
                                                int(rec["generation"]), str(rec["digest"]))
        except (OSError, ValueError, KeyError, TypeError):
            return
        if start_time(pid) != start:
            self._forget_state()
            return  # gone (a stop, a crash of NGINX itself, a reboot): a new master starts on apply
        if not runs_on(pid, self.root):
            self._forget_state()
            return  # the pid is another process now (a reused pid with the same start tick: only in theory)
        self._master = (pid, start)
        self.control_socket = os.path.join(sockdir, "control.sock")
        answered = self.probe()
        target = self._current_target()
        if answered == gen and target == f"gen-{gen}" and (self.root / target / "nginx.conf").exists():
            self._sockdir, self._generation, self._digest = sockdir, gen, digest
            self.adopted = (pid, gen)
            return
        self.not_adopted = (f"the NGINX master {pid} found in {self.root / STATE_FILE} answers generation {answered} "
                            f"where generation {gen} (current -> {target}) was recorded; it is stopped and a new one "
                            "starts with the next configuration")
        self._quit(10.0)
        shutil.rmtree(sockdir, ignore_errors=True)
        self._forget_state()

    def _save_state(self) -> None:
        if self._master is None:
            return
        tmp = self.root / f".{STATE_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"pid": self._master[0], "start": self._master[1], "sockdir": self._sockdir,
                                   "generation": self._generation, "digest": self._digest}))
        os.replace(tmp, self.root / STATE_FILE)

    def _forget_state(self) -> None:
        (self.root / STATE_FILE).unlink(missing_ok=True)

    # -- public API -----------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The generation NGINX serves (0 before the first successful apply)."""
        return self._generation

    @property
    def digest(self) -> str | None:
        """files_digest of the configuration NGINX serves (None before the first apply)."""
        return self._digest

    @property
    def pid(self) -> int | None:
        """The running master's pid (one this process started or adopted), else None."""
        if self._proc is not None:
            self._proc.poll()  # reap it when it ended: a zombie has no start time
        if self._master is None or start_time(self._master[0]) != self._master[1]:
            return None
        return self._master[0]

    def apply(self, files: dict[str, bytes]) -> ReloadResult:
        """Serve `files` (render's output): validate, swap, start or reload, verify, roll back."""
        with self._lock:
            t0 = time.perf_counter()
            digest = files_digest(files)
            if self._digest == digest and self.pid is not None:
                return ReloadResult(self._generation, True, changed=False)
            try:
                check_modules(files)
            except NginxError as e:
                return ReloadResult(self._generation, False, str(e))
            self._attempt += 1
            gen = self._attempt  # never reused: a late answer of a failed attempt cannot pass for this one
            gdir = self.root / f"gen-{gen}"
            if gdir.exists():
                shutil.rmtree(gdir)
            self._write(gdir, files, gen)
            t_test = time.perf_counter()
            reloading = self.pid is not None
            problem = self._test(gdir) if self.test_reloads or not reloading else ""
            test_s = time.perf_counter() - t_test
            if problem:
                shutil.rmtree(gdir, ignore_errors=True)
                return ReloadResult(self._generation, False, f"nginx -t rejected the configuration: {problem}",
                                    seconds=time.perf_counter() - t0)
            previous = self._current_target()
            self._point_current(gdir.name)
            offset = self.error_log.stat().st_size if self.error_log.exists() else 0
            t_reload = time.perf_counter()
            if self.pid is None:
                error = self._start(gen, offset)
                if error and self.pid is not None and not self.sidecar:  # a master that gave up may still hold the ports it bound
                    self._signal(signal.SIGKILL)
                    self._wait_gone(10)
                if error:
                    self._master = self._proc = None
                    self._forget_state()
            else:
                old_workers = self._workers()
                self._signal(signal.SIGHUP)
                error = self._verify(gen, offset) or self._retired(old_workers)
                if error and not self.test_reloads and self.pid is not None and self.probe() != gen:
                    error = f"NGINX rejected the configuration on reload (the previous one keeps serving): {error}"
            if error:
                if previous is not None:
                    self._point_current(previous)
                shutil.rmtree(gdir, ignore_errors=True)
                return ReloadResult(self._generation, False, error, seconds=time.perf_counter() - t0)
            self._generation = gen
            self._digest = digest
            self._save_state()
            self._prune()
            now = time.perf_counter()
            return ReloadResult(gen, True, seconds=now - t0, test_seconds=test_s, reload_seconds=now - t_reload)

    def check(self, files: dict[str, bytes]) -> str:
        """`nginx -t` of `files` in a scratch directory, loading nothing: "" when NGINX would take
        them, else its messages (what finding the object NGINX refuses runs, gateway/isolate.py)."""
        with self._lock:
            try:
                check_modules(files)
            except NginxError as e:
                return str(e)
            cdir = self.root / "check"
            shutil.rmtree(cdir, ignore_errors=True)
            try:
                self._write(cdir, files, 0)
                return self._test(cdir)
            finally:
                shutil.rmtree(cdir, ignore_errors=True)

    def stop(self, timeout: float = 10.0) -> None:
        """Quit NGINX gracefully (SIGQUIT: in-flight requests end), then SIGTERM, then SIGKILL;
        idempotent. Whether this process started the master or adopted it."""
        with self._lock:
            self._quit(timeout)
            self._forget_state()
            shutil.rmtree(self._sockdir, ignore_errors=True)

    def release(self) -> None:
        """Let go of NGINX and leave it serving: the next `Nginx` on this root adopts it."""
        with self._lock:
            self._master = self._proc = None

    def _quit(self, timeout: float) -> None:
        for sig, wait in ((signal.SIGQUIT, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.pid is None or not self._signal(sig) or self._wait_gone(wait):
                break
        self._master = self._proc = None

    def _signal(self, sig: int) -> bool:
        """Send `sig` to the master (checked to be the same process first); False when it is gone."""
        pid = self.pid
        if pid is None:
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _wait_gone(self, timeout: float) -> bool:
        """Wait until the master is gone (reaped, when it is our child); True when it is."""
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        end = time.monotonic() + timeout
        while self.pid is not None:  # adopted: another process (init) reaps it
            if time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    def __enter__(self) -> "Nginx":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def probe(self, timeout: float = 2.0) -> int | None:
        """The generation the running workers answer with, or None."""
        conn = _UnixHTTPConnection(self.control_socket, timeout)
        try:
            conn.request("GET", "/generation")
            resp = conn.getresponse()
            body = resp.read().decode().strip()
            return int(body) if resp.status == 200 and body.isdigit() else None
        except (OSError, http.client.HTTPException, ValueError):
            return None
        finally:
            conn.close()

    # -- internals ------------------------------------------------------------------------------

    def _write(self, gdir: Path, files: dict[str, bytes], gen: int) -> None:
        sockets = SOCKET_DIR.encode()
        for rel, data in files.items():
            if rel.endswith(".conf") and sockets in data:  # the renderer's unix sockets live in our short directory
                data = data.replace(sockets, self._sockdir.encode())
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise ValueError(f"refusing to write {rel!r} outside the generation directory")
            p = gdir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if rel.startswith("secrets/"):
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            else:
                p.write_bytes(data)
        (gdir / "control.conf").write_text(
            "# written by gwpolicy's process layer: which generation the workers serve\n"
            f"server {{\n    listen unix:{self.control_socket};\n"
            f"    location = /generation {{\n        return 200 \"{gen}\";\n    }}\n}}\n")

    def _test(self, gdir: Path) -> str:
        try:
            out = subprocess.run([self.binary, "-t", "-q", "-p", f"{gdir}/", "-c", str(gdir / "nginx.conf"),
                                  "-e", str(self.root / "logs" / "test.log")], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return "nginx -t did not finish within 600 s"
        text = (out.stderr + out.stdout).strip()
        severe = [l for l in text.splitlines() if _SEVERE.search(l)]
        if out.returncode != 0 or severe:
            return _clean("; ".join(severe) or text or f"exit status {out.returncode}")
        return ""

    def _current_target(self) -> str | None:
        cur = self.root / "current"
        return os.readlink(cur) if cur.is_symlink() else None

    def _point_current(self, target: str) -> None:
        tmp = self.root / f".current-{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, self.root / "current")

    def _start(self, gen: int, offset: int) -> str:
        if self.sidecar:
            return self._await_sidecar(gen, offset)
        # a master that failed to start (a port another process held) leaves its unix sockets
        # behind, and the next one could not bind them: no NGINX of ours runs now, so they are stale
        for sock in Path(self._sockdir).glob("**/*.sock"):
            sock.unlink(missing_ok=True)
        # setsid(2): NGINX outlives us and a signal to our process group (a terminal's
        # Ctrl-C) does not reach it; `stop()` and the next process' adoption are its ends
        with open(self.root / "logs" / "stderr.log", "ab") as err:
            self._proc = subprocess.Popen(
                nginx_command(self.binary, self.root),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, cwd=self.root)
        started = start_time(self._proc.pid)
        self._master = (self._proc.pid, started) if started is not None else None
        # recorded before it may serve, with the generation it served so far (none): a successor
        # that finds it unverified stops it instead of leaving an orphan on the ports
        self._save_state()
        return self._verify(gen, offset)

    def _await_sidecar(self, gen: int, offset: int) -> str:
        """Take the master `gwpolicy nginx-sidecar` runs on this root (waiting for it to start) and
        have it serve `gen`: it read `current` when it started, which may have been before `current`
        pointed at `gen`; then a reload."""
        deadline = time.monotonic() + self.verify_timeout
        while True:
            master = sidecar_master(self.root)
            if master is not None:
                self._master = master
                answered = self.probe()
                if answered == gen:
                    return ""
                if answered is not None:  # running, its signal handlers set: it may take a SIGHUP
                    break
            if time.monotonic() > deadline:
                self._master = None
                severe = "; ".join(dict.fromkeys(self._severe_since(offset)[0]))
                return (f"no NGINX run by `gwpolicy nginx-sidecar --state-dir {self.root}` served generation {gen} "
                        f"within {self.verify_timeout:.0f} s" + (f": {_clean(severe)}" if severe else
                                                                  " (does the nginx container run?)"))
            time.sleep(0.02)
        offset = self.error_log.stat().st_size if self.error_log.exists() else 0
        old_workers = self._workers()
        self._signal(signal.SIGHUP)
        return self._verify(gen, offset) or self._retired(old_workers)

    def _verify(self, gen: int, offset: int) -> str:
        deadline = time.monotonic() + self.verify_timeout
        delay = 0.01
        while True:
            if self.pid is None:
                err = (self.root / "logs" / "stderr.log").read_text(errors="replace")[-2000:]
                self._master = self._proc = None
                return "NGINX exited: " + _clean("; ".join(self._severe_since(offset)[0]) or err.strip() or "no message")
            if self.probe() == gen:
                return ""
            severe, text = self._severe_since(offset)
            # a bind() that fails is retried by the master for about 2 s ("try again to bind()"); the
            # reload has failed only once it gives up, else a late success would go unnoticed
            retrying = "try again to bind()" in text and "still could not bind()" not in text
            if severe and not retrying:
                return "NGINX did not apply the configuration: " + _clean("; ".join(dict.fromkeys(severe)))
            if time.monotonic() > deadline:
                return f"NGINX did not serve generation {gen} within {self.verify_timeout:.0f} s"
            time.sleep(delay)
            delay = min(delay * 2, 0.02)  # a probe is one request on a unix socket: look often

    def _workers(self) -> list[int]:
        pid = self.pid
        if pid is None:
            return []
        try:
            return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def _retired(self, old: list[int]) -> str:
        """Wait until the workers of the previous generation accept no more connections.

        Both generations' workers listen on the same sockets for a moment after the new ones
        start; an old worker closes its listening sockets when it takes the master's QUIT, just
        after it retitles itself "worker process is shutting down" (in-flight requests and idle
        keep-alive connections then end, bounded by worker_shutdown_timeout). Until then a new
        connection may still get the old configuration."""
        deadline = time.monotonic() + self.verify_timeout
        pending = list(old)
        while pending:
            still = []
            for pid in pending:
                try:
                    title = Path(f"/proc/{pid}/cmdline").read_bytes()
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
                except OSError:
                    continue  # gone
                if state != "Z" and b"shutting down" not in title:
                    still.append(pid)
            pending = still
            if pending:
                if time.monotonic() > deadline:
                    return f"the previous NGINX workers {pending} did not stop accepting within {self.verify_timeout:.0f} s"
                time.sleep(0.005)
        time.sleep(0.005)  # the title is set just before the listening sockets are closed
        return ""

    def _severe_since(self, offset: int) -> tuple[list[str], str]:
        try:
            with open(self.error_log, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return [], ""
        return [l for l in text.splitlines() if _SEVERE.search(l)], text

    def _generations(self) -> list[tuple[int, Path]]:
        return sorted((int(p.name[4:]), p) for p in self.root.glob("gen-*") if p.name[4:].isdigit())

    def _prune(self) -> None:
        """Keep the last `keep` generations (the serving one and those before it, to look at), but
        only the serving one's private keys: NGINX reads certificates and keys when it loads a
        configuration, never later, so an older generation's `secrets/` are of no use to it."""
        gens = self._generations()
        for n, p in gens[:-self.keep]:
            shutil.rmtree(p, ignore_errors=True)
        for n, p in gens[-self.keep:]:
            if n != self._generation:
                shutil.rmtree(p / "secrets", ignore_errors=True)


def _clean(text: str) -> str:
    """NGINX's messages without their timestamps and pids."""
    text = re.sub(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[(\w+)\] \d+#\d+: ", r"[\1] ", text)
    return re.sub(r"nginx: ", "", text).strip()
