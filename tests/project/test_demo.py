"""The demo (`./dev demo`, examples/demo/run.sh) from a clean state (no cache of the CRD bundle, a new
temporary directory): curl gets 504 on the slow path and 200 on the fast one, `gwpolicy describe`
says which policy set each value and what it beat, and once the Service's policy is deleted the 504
is a 200; in under a minute, and nothing it started is left running. As root and as a normal user;
`--keep` leaves the playground up until Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from gateway_proc import request, wait_until
from helpers import ROOT
from sandbox_proc import BIN

SCRIPT = ROOT / "examples" / "demo" / "run.sh"
POOL = "127.0.76.0/24"  # this module's /24 (tests/gateway_kit.py); the Gateway gets 127.0.76.1
ADDRESS = "127.0.76.1"

pytestmark = pytest.mark.skipif(not Path("/usr/sbin/nginx").exists() or not shutil.which("curl"),
                                reason="the demo needs NGINX and curl")


def _marked(marker: str) -> list[str]:
    """Processes whose environment carries the marker: what the demo started, NGINX included."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return out


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A temporary directory a normal user may write too (the demo's TMPDIR and cache)."""
    d = Path(tempfile.mkdtemp(prefix="gwpolicy-demo-test-"))
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _env(workdir: Path, marker: str) -> dict[str, str]:
    port = _free_port()
    return dict(os.environ, DEMO_ADDRESS_POOL=POOL, DEMO_PORT=str(port), TMPDIR=str(workdir),
                XDG_CACHE_HOME=str(workdir / "cache"), GWPOLICY_DEMO_TEST=marker)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return s.getsockname()[1]


def _check_story(out: str) -> None:
    steps = out.split("==> ")
    traffic = next(s for s in steps if s.startswith("Traffic"))
    assert re.search(r"/reports/monthly\n  HTTP 504 after 1\.\d s\n", traffic), traffic
    assert re.search(r"/reports/daily\n  HTTP 200 after 0\.\d s, answered by reports-", traffic), traffic
    described = next(s for s in steps if s.startswith("Which policy"))
    assert re.search(r"connectionTimeout\s+5s\s+TimeoutPolicy/demo/gateway-timeouts\s+overrides\s+Gateway/demo/demo\s+"
                     r"2s \(defaults TimeoutPolicy/demo/reports-timeouts\)", described), described
    assert re.search(r"readTimeout\s+1s\s+TimeoutPolicy/demo/reports-timeouts\s+defaults\s+Service/demo/reports", described)
    impact = next(s for s in steps if s.startswith("What deleting"))
    assert re.search(r"Service/demo/reports\s+TimeoutPolicy\s+readTimeout\s+1s\s+<unset>", impact), impact
    after = next(s for s in steps if s.startswith("Deleting it"))
    assert re.search(r"/reports/monthly\n  HTTP 200 after 2\.\d s, answered by reports-", after), after


def _run(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    return out, time.monotonic() - t


def test_the_demo_shows_a_policy_changing_traffic_and_leaves_nothing_running(workdir: Path) -> None:
    marker = uuid.uuid4().hex
    out, seconds = _run([str(SCRIPT)], _env(workdir, marker))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    _check_story(out.stdout)
    assert seconds < 60, f"the demo took {seconds:.1f} s"
    assert "./dev demo --keep" in out.stdout
    assert not _marked(marker), _marked(marker)
    assert not [p.name for p in workdir.iterdir() if p.name.startswith("gwpolicy-demo.")], "its directory stays"


def _unprivileged() -> list[str]:
    """How to run the demo without the privilege to bind ports below 1024: as nobody where that user
    can run this checkout's Python (and what it starts), else as root without CAP_NET_BIND_SERVICE
    (where the Python lives in root's home, as with pyenv under /root)."""
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*nobody, "env", str(BIN / "gwpolicy"), "--version"], capture_output=True)
    return nobody if probe.returncode == 0 else ["setpriv", "--bounding-set=-net_bind_service"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="as a normal user the test above is this one; setpriv drops root's privileges")
def test_the_demo_needs_no_privilege(workdir: Path) -> None:
    marker = uuid.uuid4().hex
    env = dict(_env(workdir, marker), HOME="/nonexistent")
    out, seconds = _run([*_unprivileged(), str(SCRIPT)], env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    _check_story(out.stdout)
    assert not _marked(marker), _marked(marker)


def test_keep_leaves_the_playground_up_until_ctrl_c(workdir: Path) -> None:
    marker = uuid.uuid4().hex
    env = _env(workdir, marker)
    proc = subprocess.Popen([str(SCRIPT), "--keep"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "The playground is up until Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "The playground is up" in text, text
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", "".join(lines + [proc.stdout.readline()])).group(1)
        status, _, body = wait_until(lambda: (r := request(ADDRESS, int(env["DEMO_PORT"]), "/reports/daily",
                                                           host="shop.example"))[0] == 200 and r, 10, what="traffic")
        assert b"reports-" in body
        got = subprocess.run(["kubectl", "get", "timeoutpolicies", "-n", "demo", "-o", "name"], capture_output=True,
                             text=True, env=dict(env, KUBECONFIG=kubeconfig), timeout=30)
        assert got.stdout.split() == ["timeoutpolicy.gwpolicy.io/gateway-timeouts"]
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    deadline = time.monotonic() + 10
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _marked(marker), _marked(marker)


def test_dev_demo_parable_keeps_the_parable() -> None:
    out = subprocess.run([str(ROOT / "dev"), "demo", "parable"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"maxRetries\s+1\s+RetryPolicy/baker/baker-retries\s+overrides", out.stdout), out.stdout[-2000:]


def test_echo_delay_slows_one_path_only() -> None:
    from gwpolicy.gateway.echo import EchoServer

    with EchoServer("reports-1", "demo", delays={"/reports/monthly": 0.4}) as echo:
        def seconds(path: str) -> float:
            t = time.monotonic()
            assert request("127.0.0.1", echo.port, path)[0] == 200
            return time.monotonic() - t

        assert seconds("/reports/monthly") >= 0.4 and seconds("/reports/monthly/2026?x=1") >= 0.4
        assert seconds("/reports/monthlyx") < 0.3 and seconds("/reports/daily") < 0.3
    bad = subprocess.run([str(BIN / "gwpolicy"), "echo", "--port", "0", "--pod", "p", "--namespace", "n",
                          "--delay", "reports=2s"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--delay 'reports=2s': expected PATH=DURATION" in bad.stderr, bad.stderr
