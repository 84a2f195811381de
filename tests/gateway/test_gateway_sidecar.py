"""NGINX in a container of its own: `gwpolicy nginx-sidecar` runs NGINX on the state directory and
`gwpolicy gateway --nginx-sidecar` configures it. Real processes (sandbox, gateway, sidecar, NGINX,
an echo backend), traffic on loopback (127.0.26.0/24 for Gateways, 127.0.27.1 for the backend)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from gateway_proc import GatewayProcess, alive, nginx_master, request, stop_nginx, wait_until
from gwpolicy.gateway.nginx import SIDECAR_FILE
from sandbox_proc import BIN, SandboxProcess
from test_gateway_adoption import RequestStream, gateway_env, programmed_address, route

NS = "sidecar"
POOL = "127.0.26.0/24"
BACKEND_IP = "127.0.27.1"
CONTROLLER = "example.com/sidecar"


class SidecarProcess:
    """`gwpolicy nginx-sidecar` on a state directory; `stop` ends it and, failing that, its NGINX."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.log_path = state_dir.parent / "sidecar.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(BIN / "gwpolicy"), "nginx-sidecar", "--state-dir", str(state_dir),
                                          "--stop-timeout", "10"], stdout=subprocess.DEVNULL, stderr=log)

    def master(self) -> int | None:
        """The NGINX master the sidecar records, when it runs."""
        try:
            pid = json.loads((self.state_dir / SIDECAR_FILE).read_text())["pid"]
        except (OSError, ValueError, KeyError):
            return None
        return pid if alive(pid) else None

    def tail(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        master = self.master()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in (master, nginx_master(self.state_dir)):
            if pid is not None and alive(pid):  # the sidecar failed to stop it: no NGINX is left behind
                stop_nginx(self.state_dir)
                _kill(pid)
        return self.proc.returncode


def _kill(pid: int) -> None:
    import os

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def state():
    """A short state directory: NGINX's unix sockets live in it (a socket path has at most 107 bytes)."""
    top = Path(tempfile.mkdtemp(prefix="gwsc-"))
    try:
        yield top / "s"
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with gateway_env(tmp_path_factory.mktemp("sidecar"), NS, CONTROLLER, BACKEND_IP) as pair:
        yield pair


def _gateway(sb: SandboxProcess, state_dir: Path) -> GatewayProcess:
    return GatewayProcess(sb.kubeconfig, state_dir, "--nginx-sidecar", "--controller-name", CONTROLLER,
                          "--allow-loopback-endpoints", "--allow-unmanaged-endpointslices", pool=POOL)


def test_nginx_run_by_the_sidecar_outlives_a_sigkilled_gateway_and_stops_with_the_sidecar(env, state):
    """The sidecar waits for the gateway's configuration, then runs NGINX as its own child. SIGKILL
    of the gateway under a steady request stream: no request fails; the next gateway adopts that
    NGINX (same master pid) and applies an edit made while no gateway ran. The gateway's SIGTERM
    leaves NGINX serving; the sidecar's SIGTERM stops it gracefully (a request in flight ends)."""
    sb, _ = env
    sidecar = SidecarProcess(state)
    first = second = None
    try:
        time.sleep(0.5)
        assert sidecar.proc.poll() is None and sidecar.master() is None  # no configuration yet: it waits
        first = _gateway(sb, state)
        address = programmed_address(sb, NS)
        wait_until(lambda: request(address, 80, "/steady")[0] == 200, 15, what="traffic")
        master = sidecar.master()
        assert master is not None and _parent(master) == sidecar.proc.pid  # the sidecar's child, not the gateway's
        assert first.master_pid() == master and first.nginx_pids() == []
        stream = RequestStream(address, "/steady")
        try:
            time.sleep(0.5)
            first.stop(signal.SIGKILL, leave_nginx=True)
            time.sleep(1.0)  # no gateway runs: NGINX serves on
            assert alive(master)
            sb.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(route("edited", "/edited", NS)))
            assert request(address, 80, "/edited")[0] == 404  # nobody applied it yet
            t0 = time.monotonic()
            second = _gateway(sb, state)
            wait_until(lambda: request(address, 80, "/edited")[0] == 200, 30,
                       what=f"the edit served by the adopted NGINX\n{second.tail()}")
            took = time.monotonic() - t0
            time.sleep(0.5)
        finally:
            stream.stop()
        print(f"gateway SIGKILLed: {stream.ok} requests served, {len(stream.failed)} failed; the restarted gateway "
              f"had the adopted NGINX serve the edit {took:.2f} s after it started")
        assert stream.failed == [] and stream.ok > 50, (stream.ok, stream.failed[:5])
        assert second.master_pid() == master == sidecar.master()  # adopted, never restarted
        assert "adopted the running NGINX (master pid %d" % master in second.tail(200)

        assert second.stop(signal.SIGTERM, leave_nginx=True) == 0
        assert alive(master) and request(address, 80, "/edited")[0] == 200  # the gateway's SIGTERM leaves it

        slow: list[int] = []
        t = threading.Thread(target=lambda: slow.append(request(address, 80, "/steady?delay=1s", timeout=10)[0]))
        t.start()
        time.sleep(0.3)
        assert sidecar.stop(signal.SIGTERM) == 0
        t.join(10)
        assert slow == [200]  # in flight when the sidecar took SIGTERM: it ended first
        assert not alive(master) and not (state / SIDECAR_FILE).exists()
        with pytest.raises(OSError):
            request(address, 80, "/steady", timeout=2)
    finally:
        for gw in (first, second):
            if gw is not None:
                gw.stop(leave_nginx=True)
        sidecar.stop()


NGINX_CONF = """pid run/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path run/body; proxy_temp_path run/proxy; fastcgi_temp_path run/fastcgi;
    uwsgi_temp_path run/uwsgi; scgi_temp_path run/scgi;
    server {{ listen 127.0.26.250:{port}; location / {{ return 200 "{text}"; }} }}
}}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.26.250", 0))
        return s.getsockname()[1]


def test_the_sidecar_starts_nginx_again_when_it_exits_by_itself_and_sigint_stops_it(state):
    """No gateway: a configuration written by hand. The sidecar starts NGINX once `current` holds
    one and starts it again when it exits without being told (the gateway quits a master that fails
    its adoption checks); after a SIGKILL of the sidecar NGINX serves on, the next sidecar takes it
    over rather than starting a second one, and its SIGINT stops it."""
    port = _free_port()
    sidecar = SidecarProcess(state)
    try:
        gen = state / "gen-1"
        (gen / "run").mkdir(parents=True)
        (gen / "nginx.conf").write_text(NGINX_CONF.format(port=port, text="one"))
        (state / "current").symlink_to("gen-1")
        first = wait_until(sidecar.master, 15, what=f"NGINX started by the sidecar\n{sidecar.tail()}")
        wait_until(lambda: request("127.0.26.250", port, "/")[2] == b"one", 10, what="NGINX serving")
        import os

        os.kill(first, signal.SIGQUIT)
        again = wait_until(lambda: (m := sidecar.master()) not in (None, first) and m, 15,
                           what=f"NGINX started again\n{sidecar.tail()}")
        wait_until(lambda: request("127.0.26.250", port, "/")[2] == b"one", 10, what="NGINX serving again")
        assert _parent(again) == sidecar.proc.pid
        sidecar.proc.kill()  # SIGKILL, out of a container: NGINX serves on, and the next sidecar takes it over
        sidecar.proc.wait(5)
        assert alive(again) and request("127.0.26.250", port, "/")[2] == b"one"
        sidecar = SidecarProcess(state)
        wait_until(lambda: "took over the NGINX master pid %d" % again in sidecar.tail(), 15,
                   what=f"the orphaned NGINX taken over\n{sidecar.tail()}")
        assert sidecar.master() == again
        assert sidecar.stop(signal.SIGINT) == 0
        assert not alive(again)
    finally:
        sidecar.stop()
