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
    sandbox where a client's kubeconfig still points); `kill()` ends it with SIGKILL, as a crash.
    It has tests/kube_apiserver.py's KubeApiServer's face (tests/live_server.py): the sandbox
    authorizes every request, so every identity is the one kubeconfig and nothing is refused."""

    kind = "sandbox"

    def __init__(self, tmp: Path, *extra: str, port: int = 0, loopback_endpoints: bool = True) -> None:
        self.kubeconfig = tmp / "kubeconfig"
        # the tests' echo backends listen on loopback, which kube-apiserver (and the sandbox without
        # the switch) refuses in an EndpointSlice
        loopback = ["--allow-loopback-endpoints"] if loopback_endpoints else []
        self.proc = subprocess.Popen([str(BIN / "gwpolicy"), "sandbox", "--port", str(port), "--kubeconfig-out",
                                      str(self.kubeconfig), "--bookmark-interval", "0.2", *loopback, *extra],
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

    def identity(self, sa: str, namespace: str = "gwpolicy-system") -> Path:
        return self.kubeconfig

    def refused(self, sa: str, namespace: str = "gwpolicy-system") -> list[str]:
        return []

    def apply(self, objects, manager: str = "gwpolicy-test") -> list[dict]:
        from gwpolicy.sandbox.seed import apply_all

        return apply_all(self.url, objects, manager, **self.client)

    def install_deploy(self, *files: str, policy_groups=()) -> None:
        from kube_apiserver import deploy_objects, policy_group_roles

        self.apply(deploy_objects(*files) + [r for g in policy_groups for r in policy_group_roles(g)])

    def writes(self, sa: str | None = None, resources: set[str] | None = None,
               exclude: frozenset[str] = frozenset({"leases"})) -> int:
        """Writes the sandbox took (by anyone: it knows no ServiceAccounts), by resource."""
        by = self.http.get("/sandbox/stats").json()["writesByResource"]
        return sum(n for res, n in by.items() if res not in exclude and (resources is None or res in resources))

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
