"""The long-running commands with their defaults: `gwpolicy controller`, `gateway` and `webhook`,
each given nothing but `--kubeconfig`, all three at once against a fresh `gwpolicy sandbox`, each do
their job (the controller writes policy status, the gateway accepts its GatewayClass, starts NGINX
and serves a route, the webhook registers itself and warns on `kubectl apply`); and the flags they
share (kube/defaults.py) read the same in all three.

The defaults are machine-wide (ports 8080, 8081, 8082 and 9443 on 127.0.0.1): a lock file keeps two
runs of this module on one machine from meeting."""

from __future__ import annotations

import fcntl
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from gateway_proc import alive, request, wait_until
from gwpolicy.kube import defaults
from sandbox_proc import BIN, SandboxProcess

GATEWAY_ADDRESS = "127.0.70.1"  # this module's /24 (tests/gateway_kit.py)
ECHO_ADDRESS = "127.0.70.2"
DEFAULT_PORTS = {"controller": 8080, "gateway": 8081, "webhook": 8082}


@pytest.fixture(scope="module")
def machine_wide() -> Iterator[None]:
    with open("/tmp/gwpolicy-default-ports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for port in [*DEFAULT_PORTS.values(), 9443]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    pytest.fail(f"port {port} of 127.0.0.1 is taken on this machine: this test runs the commands with "
                                "their default ports")
        yield


class Command:
    """`gwpolicy COMMAND --kubeconfig F [EXTRA...]`, its stderr kept in `log`, its start line awaited."""

    def __init__(self, command: str, kubeconfig: Path, log: Path, *extra: str) -> None:
        self.command, self.log_path = command, log
        self.log = open(log, "w")
        self.proc = subprocess.Popen([str(BIN / "gwpolicy"), command, "--kubeconfig", str(kubeconfig), *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.started = threading.Event()
        self.banner = ""
        self._drain = threading.Thread(target=self._copy, daemon=True)
        self._drain.start()

    def _copy(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            if re.search(r"serving (health and metrics on port|https://)", line):
                self.banner = line
                self.started.set()

    def wait_started(self) -> str:
        assert self.started.wait(60), f"gwpolicy {self.command} did not start:\n{self.tail()}"
        return self.banner

    def tail(self) -> str:
        return "".join(self.log_path.read_text().splitlines(True)[-30:])

    #: seconds from SIGTERM to SIGKILL in `stop`
    GRACE = 20.0

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after GRACE seconds; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._drain.join(5)
        self.log.close()
        return self.proc.returncode


def gateway_objects(address: str, listeners: list[dict], echo_address: str, echo_port: int) -> list[dict]:
    """A GatewayClass of gwpolicy's gateway, the Gateway `default/demo` on `address`, and the Service
    `default/shop` whose one endpoint is an echo server."""
    gw = "gateway.networking.k8s.io"
    return [
        {"apiVersion": f"{gw}/v1", "kind": "GatewayClass", "metadata": {"name": "gwpolicy"},
         "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
        {"apiVersion": f"{gw}/v1", "kind": "Gateway", "metadata": {"name": "demo", "namespace": "default"},
         "spec": {"gatewayClassName": "gwpolicy", "addresses": [{"type": "IPAddress", "value": address}],
                  "listeners": listeners}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "shop", "namespace": "default"},
         "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": echo_port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "shop-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "shop"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": echo_port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [echo_address], "conditions": {"ready": True}}]},
    ]


def _objects(listener_port: int, echo_port: int) -> list[dict]:
    listeners = [{"name": "http", "port": listener_port, "protocol": "HTTP"}]
    return gateway_objects(GATEWAY_ADDRESS, listeners, ECHO_ADDRESS, echo_port) + [
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy",
         "metadata": {"name": "gateway-timeouts", "namespace": "default"},
         "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "demo"},
                  "override": {"connectionTimeout": "5s"}}}]


#: a rule NGINX answers itself: with its defaults the gateway sends to no loopback endpoint (and to
#: none of an EndpointSlice the EndpointSlice controller did not make), and these tests' backends
#: would be both
REDIRECT = {"filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "shop.example.org", "statusCode": 302}}]}
ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "shop", "namespace": "default"},
         "spec": {"parentRefs": [{"name": "demo"}], "hostnames": ["shop.example"], "rules": [REDIRECT]}}


def redirected(address: str, port: int, path: str, host: str | None = None) -> bool:
    """NGINX answers the route's redirect (302 to shop.example.org on the listener's port, the path kept)."""
    status, headers, _ = request(address, port, path, host=host)
    return status == 302 and dict(headers).get("Location") == f"http://shop.example.org:{port}{path}"


def _get(sb: SandboxProcess, path: str) -> dict:
    r = sb.http.get(path)
    return r.json() if r.status_code == 200 else {}


def _conditions(obj: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def _ready(port: int) -> bool:
    try:
        return request("127.0.0.1", port, "/readyz", timeout=2)[0] == 200
    except OSError:
        return False


def test_controller_gateway_and_webhook_do_their_job_with_only_a_kubeconfig(tmp_path: Path, machine_wide: None) -> None:
    if not Path("/usr/sbin/nginx").exists():
        pytest.skip("the gateway needs NGINX")
    with socket.socket() as s:  # a port for the Gateway's listener that is free on its address
        s.bind((GATEWAY_ADDRESS, 0))
        listener_port = s.getsockname()[1]
    with SandboxProcess(tmp_path) as sb:
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_objects(listener_port, 8080)))
        running = {c: Command(c, sb.kubeconfig, tmp_path / f"{c}.log") for c in ("controller", "gateway", "webhook")}
        nginx: list[int] = []
        try:
            for c, cmd in running.items():
                banner = cmd.wait_started()
                if c != "webhook":
                    assert f"on port {DEFAULT_PORTS[c]}" in banner, banner
                else:
                    assert "https://127.0.0.1:9443/validate" in banner, banner
            for c, port in DEFAULT_PORTS.items():  # health on loopback, each on its own port
                wait_until(lambda: _ready(port), 60, what=f"{c} ready on 127.0.0.1:{port}")

            # the webhook: registered, and kubectl apply of an affected route warns
            wait_until(lambda: _get(sb, "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gwpolicy"),
                       60, what="the webhook's configuration")
            out = wait_until(lambda: (o := sb.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(ROUTE))) and
                             "Warning: HTTPRoute default/shop is affected by TimeoutPolicy default/gateway-timeouts" in o.stderr
                             and o, 60, step=0.5, what="the webhook's warning")
            assert "httproute.gateway.networking.k8s.io/shop" in out.stdout

            # the gateway: its GatewayClass accepted, the Gateway programmed, the route served by NGINX
            wait_until(lambda: _conditions(_get(sb, "/apis/gateway.networking.k8s.io/v1/gatewayclasses/gwpolicy"))
                       .get("Accepted") == "True", 60, what="GatewayClass accepted")
            wait_until(lambda: _conditions(_get(sb, "/apis/gateway.networking.k8s.io/v1/namespaces/default/gateways/demo"))
                       .get("Programmed") == "True", 60, what="Gateway programmed")
            wait_until(lambda: redirected(GATEWAY_ADDRESS, listener_port, "/cart", "shop.example"), 30,
                       what="the route served by NGINX")
            from gateway_proc import _children
            nginx = [p for p in _children(running["gateway"].proc.pid)
                     if b"nginx" in Path(f"/proc/{p}/cmdline").read_bytes()]
            assert nginx, "the gateway runs NGINX"

            # the controller: the policy's status under its controllerName, and its Lease in the
            # kubeconfig context's namespace, as the gateway's
            def policy_status() -> bool:
                pol = _get(sb, "/apis/gwpolicy.io/v1alpha1/namespaces/default/timeoutpolicies/gateway-timeouts")
                return any(a.get("controllerName") == "gwpolicy.io/policy-controller"
                           and _conditions({"status": a}).get("Accepted") == "True"
                           for a in (pol.get("status") or {}).get("ancestors") or [])
            wait_until(policy_status, 60, what="the controller's policy status")
            for lease in ("gwpolicy-controller", "gwpolicy-gateway"):
                held = _get(sb, f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{lease}")
                assert (held.get("spec") or {}).get("holderIdentity"), lease
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(f"--- {c}:\n{cmd.tail()}" for c, cmd in running.items())) from None
        finally:
            for cmd in running.values():
                cmd.stop()
        assert all(cmd.proc.returncode == 0 for cmd in running.values()), {c: m.proc.returncode for c, m in running.items()}
        deadline = time.monotonic() + 10
        while any(alive(p) for p in nginx) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in nginx), "NGINX outlived the gateway"


SHARED_FLAGS = ("--kubeconfig", "--context", "--lease-namespace", "--lease-duration", "--identity",
                "--no-leader-election", "--verbose")


def _help(command: str) -> dict[str, str]:
    """Each option's help text (joined lines), by flag."""
    text = subprocess.run([str(BIN / "gwpolicy"), command, "--help"], capture_output=True, text=True, timeout=60).stdout
    out: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"  (-\w, )?(--?[\w-]+)", line)
        if m:
            flag = m.group(2)
            out[flag] = line[m.end():].strip()
        elif flag and line.startswith("    "):
            out[flag] += " " + line.strip()
        else:
            flag = None
    return {k: re.sub(r"\s+", " ", re.sub(r"^[A-Z_:]+\s+", "", v)) for k, v in out.items()}


def test_the_shared_flags_read_the_same_in_every_long_running_command() -> None:
    helps = {c: _help(c) for c in ("controller", "gateway", "webhook")}
    for flag in SHARED_FLAGS:
        have = {c: h[flag] for c, h in helps.items() if flag in h}
        expected = ("controller", "gateway", "webhook") if flag in ("--kubeconfig", "--context", "--verbose") else ("controller", "gateway")
        assert tuple(have) == expected, (flag, list(have))
        assert len(set(have.values())) == 1, (flag, have)
    # the listen address: loopback and each command's own port, the same sentence
    for c, flag in (("controller", "--listen"), ("gateway", "--listen"), ("webhook", "--health-listen")):
        port = defaults.PORTS[c]
        assert helps[c][flag] == (f"address of /healthz, /readyz, /metrics (default: 127.0.0.1:{port}, in a pod "
                                  f"0.0.0.0:{port}; port 0: any free port)"), helps[c][flag]


def test_defaults_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pod: every interface, the pod's namespace for the Lease, the pod's name as identity."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("POD_NAMESPACE", "gwpolicy-system")
    monkeypatch.setenv("POD_NAME", "gwpolicy-gateway-7d4b9c-x1")
    assert [defaults.listen(c) for c in ("controller", "gateway", "webhook")] == \
        ["0.0.0.0:8080", "0.0.0.0:8081", "0.0.0.0:8082"]
    assert defaults.lease_namespace(None, "default") == "gwpolicy-system"
    assert defaults.lease_namespace("elsewhere", "default") == "elsewhere"
    assert defaults.identity() == "gwpolicy-gateway-7d4b9c-x1"
    from gwpolicy.controller.main import parse as controller_parse
    from gwpolicy.gateway.controller import parse as gateway_parse

    assert controller_parse([]).identity == gateway_parse([]).identity == "gwpolicy-gateway-7d4b9c-x1"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.delenv("POD_NAME")
    assert defaults.listen("gateway") == "127.0.0.1:8081"
    assert defaults.lease_namespace(None, "infra") == "infra" and defaults.lease_namespace(None, None) == "default"
