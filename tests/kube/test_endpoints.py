"""The health and metrics endpoints every watching process serves (controller/endpoints.py): a busy or
malformed listen address is one `Error:` line naming the option and exit 1, never a traceback, for
the controller, the webhook and the gateway alike; and what they serve."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gwpolicy.controller.endpoints import ListenError, healthz, metrics, serve_endpoints
from gwpolicy.sandbox.server import write_kubeconfig
from sandbox_proc import BIN

COMMANDS = {"controller": ["controller", "--no-leader-election"], "webhook": ["webhook", "--no-register", "--port", "0"],
            "gateway": ["gateway", "--no-leader-election"]}
FLAG = {"controller": "--listen", "webhook": "--health-listen", "gateway": "--listen"}


def _run(command: str, tmp_path: Path, listen: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), 1)  # never reached: the listen fails first
    extra = ["--state-dir", str(tmp_path / "state")] if command == "gateway" else []
    return subprocess.run([str(BIN / "gwpolicy"), *COMMANDS[command], "--kubeconfig", str(kubeconfig),
                           FLAG[command], listen, *extra], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_busy_health_port_is_an_error_message(tmp_path: Path, command: str) -> None:
    if command == "gateway" and not Path("/usr/sbin/nginx").exists():
        pytest.skip("the gateway checks for NGINX first")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = _run(command, tmp_path, f"127.0.0.1:{port}")
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert f"Error: cannot listen on 127.0.0.1:{port}" in out.stderr and FLAG[command] in out.stderr, out.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_malformed_health_address_is_an_error_message(tmp_path: Path, command: str) -> None:
    if command == "gateway" and not Path("/usr/sbin/nginx").exists():
        pytest.skip("the gateway checks for NGINX first")
    out = _run(command, tmp_path, "127.0.0.1:http")
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert f"Error: {FLAG[command]} '127.0.0.1:http': expected HOST:PORT with a numeric port" in out.stderr, out.stderr


def test_the_endpoints_serve_health_and_the_registrys_metrics() -> None:
    registry = CollectorRegistry()
    Counter("demo_things", "Things counted", registry=registry).inc(3)

    async def go() -> tuple[bytes, bytes]:
        runner, port = await serve_endpoints("127.0.0.1:0", {"/healthz": healthz, "/metrics": metrics(registry)})
        try:
            def get(path: str) -> bytes:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read()

            return await asyncio.to_thread(get, "/healthz"), await asyncio.to_thread(get, "/metrics")
        finally:
            await runner.cleanup()

    health, text = asyncio.run(go())
    assert health == b"ok"
    assert b"# HELP demo_things_total Things counted" in text and b"demo_things_total 3.0" in text


def test_a_failed_listen_frees_what_it_set_up() -> None:
    async def go() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            with pytest.raises(ListenError, match="--my-flag"):
                await serve_endpoints(f"127.0.0.1:{s.getsockname()[1]}", {"/healthz": healthz}, "--my-flag")
        runner, _ = await serve_endpoints("127.0.0.1:0", {"/healthz": healthz})  # the loop is still usable
        await runner.cleanup()

    asyncio.run(go())
