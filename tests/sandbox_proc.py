"""A `gwpolicy sandbox` process for tests, and a small HTTP client for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx

from gwpolicy.sandbox.server import client_options

BIN = Path(sys.executable).parent
GW_CRDS = Path(__file__).resolve().parent.parent / "deploy" / "gateway-api" / "standard"  # the shipped bundle


class SandboxProcess:
    """`gwpolicy sandbox` in a process of its own. `port=` starts it on a given port (a restarted
    sandbox where a client's kubeconfig still points); `kill()` ends it with SIGKILL, as a crash."""

    def __init__(self, tmp: Path, *extra: str, port: int = 0) -> None:
        self.kubeconfig = tmp / "kubeconfig"
        self.proc = subprocess.Popen([str(BIN / "gwpolicy"), "sandbox", "--port", str(port), "--kubeconfig-out",
                                      str(self.kubeconfig), "--bookmark-interval", "0.2", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"https://127\.0\.0\.1:(\d+)", line)
        assert m, f"sandbox did not start: {line} {self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        self.port = int(m.group(1))
        self.url = f"https://127.0.0.1:{m.group(1)}"
        # the sandbox answers only the token it wrote into its kubeconfig, over TLS with its own CA:
        # raw HTTP clients send the one and verify with the other, as kubectl and lightkube do
        self.client = client_options(str(self.kubeconfig))
        self.http = httpx.Client(base_url=self.url, timeout=10, **self.client)
        self.cache = tmp / "kubectl-cache"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        out = subprocess.run(["kubectl", "--cache-dir", str(self.cache), *args], capture_output=True, text=True,
                             input=input, env=env, timeout=60)
        if check:
            assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed that was not already written."""
        self.http.close()
        self.proc.kill()
        self.proc.wait(5)

    def __enter__(self) -> "SandboxProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for(pred, timeout: float = 10.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError("condition not met in time")
