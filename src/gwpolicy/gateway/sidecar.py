"""`gwpolicy nginx-sidecar`: runs the gateway's NGINX in a container of its own.

In a Kubernetes pod, every process of a container ends with the container's main process: NGINX
started by `gwpolicy gateway` dies with a crash of the gateway container. This process is the main
process of a second container (the pod shares one process namespace, and both containers mount the
state directory at the same path): it waits until the gateway has written a configuration
(`DIR/current/nginx.conf`), starts NGINX on it exactly as the gateway would (gateway/nginx.py,
`nginx_command`), records the master in `DIR/nginx-sidecar.json`, and waits. `gwpolicy gateway
--nginx-sidecar` finds the master there, and from then on validates, reloads (SIGHUP) and verifies
it as its own; after a crash of the gateway, the next gateway process adopts it (`DIR/nginx.json`).

Signals: SIGTERM and SIGQUIT stop NGINX gracefully (its SIGQUIT: requests in flight end, bounded
by worker_shutdown_timeout; then SIGTERM after --stop-timeout, SIGKILL 5 s later) and end this
process with status 0; SIGINT stops it at once (NGINX's SIGTERM). An NGINX that exits on its own
(or is stopped by the gateway, which stops a master that fails its adoption checks) is started
again from `current`, after a pause that grows from 0.2 s to 5 s while it keeps failing. A sidecar
that finds the master an earlier one recorded still running (that one was killed with SIGKILL, out
of a container) takes it over instead of starting a second NGINX.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gwpolicy import serve
from gwpolicy.cli.args import HelpFormatter, Parser, program_name
from gwpolicy.gateway.nginx import SIDECAR_FILE, NginxError, nginx_command, nginx_version, sidecar_master, start_time

log = logging.getLogger("gwpolicy.nginx-sidecar")

GRACEFUL, FAST = "graceful", "fast"


@dataclass
class SidecarOptions:
    state_dir: Path
    nginx: str = "/usr/sbin/nginx"
    stop_timeout: float = 25.0  # a graceful stop's wait before NGINX's SIGTERM


class Sidecar:
    """Runs NGINX on `state_dir` until told to stop; see the module docstring."""

    def __init__(self, opts: SidecarOptions, poll: float = 0.1) -> None:
        self.root = opts.state_dir.resolve()
        self.opts = opts
        self.poll = poll
        self.stopping: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stopping != FAST:
            self.stopping = FAST if signum == signal.SIGINT else GRACEFUL

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        pause = 0.2
        waiting_logged = False
        while self.stopping is None:
            if not (self.root / "current" / "nginx.conf").exists():
                if not waiting_logged:
                    log.info("waiting for the gateway's configuration in %s", self.root / "current")
                    waiting_logged = True
                time.sleep(self.poll)
                continue
            started = time.monotonic()
            code = self._serve()
            if self.stopping is not None:
                break
            pause = 0.2 if time.monotonic() - started > 10 else min(pause * 2, 5.0)
            log.warning("NGINX exited with status %s; starting it again in %.1f s", code, pause)
            end = time.monotonic() + pause
            while self.stopping is None and time.monotonic() < end:
                time.sleep(min(self.poll, pause))
        log.info("stopped")
        return 0

    def _serve(self) -> int | None:
        """Start NGINX (or take over the one an earlier sidecar on this root left running), wait
        until it ends, stopping it when a signal says so; its exit status, when it was our child."""
        found = sidecar_master(self.root)
        if found is not None:  # an earlier sidecar was killed, its NGINX serves on: watch it instead
            pid, start = found
            log.info("took over the NGINX master pid %d an earlier nginx-sidecar left running on %s", pid, self.root)
        else:
            with open(self.root / "logs" / "stderr.log", "ab") as err:
                # setsid(2): a terminal's Ctrl-C reaches NGINX only through this process
                self.proc = subprocess.Popen(nginx_command(self.opts.nginx, self.root), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                             cwd=self.root)
            pid, start = self.proc.pid, start_time(self.proc.pid) or ""
            self._record(pid, start)
            target = os.readlink(self.root / "current") if (self.root / "current").is_symlink() else "current"
            log.info("started NGINX (master pid %d) on %s -> %s", pid, self.root / "current", target)
        sent = False
        while self._running(pid, start):
            if self.stopping is not None and not sent:
                self._stop(pid, start)
                sent = True
            time.sleep(self.poll)
        (self.root / SIDECAR_FILE).unlink(missing_ok=True)
        code = self.proc.returncode if self.proc is not None else None
        self.proc = None
        return code

    def _running(self, pid: int, start: str) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return start_time(pid) == start  # not our child: someone else reaps it

    def _stop(self, pid: int, start: str) -> None:
        steps = ([(signal.SIGQUIT, self.opts.stop_timeout)] if self.stopping == GRACEFUL else []) + \
            [(signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)]
        for sig, wait in steps:
            if not self._running(pid, start):
                return
            log.info("sending %s to NGINX (master pid %d)", signal.Signals(sig).name, pid)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            end = time.monotonic() + wait
            while self._running(pid, start) and time.monotonic() < end:
                time.sleep(0.02)

    def _record(self, pid: int, start: str) -> None:
        tmp = self.root / f".{SIDECAR_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"pid": pid, "start": start, "sidecar": os.getpid()}))
        os.replace(tmp, self.root / SIDECAR_FILE)


DESCRIPTION = """Run the gateway's NGINX in a container of its own, so that it outlives a crash of
the gateway's container (a pod with shareProcessNamespace: true, both containers mounting the
state directory at the same path; deploy/70-gateway.yaml). Waits until `gwpolicy gateway
--nginx-sidecar --state-dir DIR` has written a configuration to DIR, starts NGINX on it, and
leaves its reloads to the gateway. SIGTERM or SIGQUIT stop NGINX gracefully (requests in flight
end) and then this process; SIGINT stops NGINX at once. An NGINX that exits by itself is started
again."""


def parse(argv: list[str]) -> SidecarOptions:
    p = Parser(prog=f"{program_name()} nginx-sidecar", formatter_class=HelpFormatter, description=DESCRIPTION,
               epilog="""example (the gateway's pod: deploy/70-gateway.yaml):
  gwpolicy nginx-sidecar --state-dir /var/run/gwpolicy &
  gwpolicy gateway --nginx-sidecar --state-dir /var/run/gwpolicy --kubeconfig /tmp/sb.kubeconfig
""")
    p.add_argument("--state-dir", required=True,
                   help="the gateway's --state-dir (the volume both containers mount, at the same path)")
    p.add_argument("--nginx", default="/usr/sbin/nginx", help="the NGINX binary (1.22 or newer, with njs)")
    p.add_argument("--stop-timeout", type=float, default=25.0,
                   help="seconds a graceful stop waits for requests in flight before NGINX's fast stop (default 25; "
                        "keep it under the pod's terminationGracePeriodSeconds)")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    a = p.parse_args(argv)
    serve.setup_logging(a.verbose)
    return SidecarOptions(Path(a.state_dir), a.nginx, a.stop_timeout)


def main(argv: list[str]) -> int:
    opts = parse(argv)
    try:
        nginx_version(opts.nginx)
    except NginxError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    return Sidecar(opts).run()
