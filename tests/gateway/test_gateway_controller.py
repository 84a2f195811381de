"""`gwpolicy gateway` as a user runs it: real processes (sandbox, gateway, NGINX, echo backends),
kubectl, traffic on loopback (127.0.20.0/24 for Gateways, 127.0.22.0/24 for backends)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from gateway_proc import GatewayProcess, alive, request, wait_until
from gwpolicy.gateway.controller import with_defaults
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER
from gwpolicy.gateway.status import POLICY_KINDS_ANNOTATION
from sandbox_proc import BIN, GW_CRDS, SandboxProcess

NS = "gwtest"
BACKEND_IP = "127.0.22.1"


def _apply(sb: SandboxProcess, *objs: dict) -> None:
    sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(list(objs)))


def _get(sb: SandboxProcess, kind: str, name: str, ns: str | None = NS) -> dict:
    args = ["get", kind, name, "-o", "json"] + (["-n", ns] if ns else [])
    return json.loads(sb.kubectl(*args).stdout)


def _cond(conds: list[dict], ctype: str) -> dict:
    return next((c for c in conds or [] if c.get("type") == ctype), {})


GATEWAY_CLASS = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "gwtest"},
                 "spec": {"controllerName": GATEWAY_CONTROLLER}}


def _objects(port: int) -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": NS},
         "spec": {"gatewayClassName": "gwtest", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": NS},
         "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 8080, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "echo-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "echo"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [BACKEND_IP], "conditions": {"ready": True}}]},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": NS},
         "spec": {"parentRefs": [{"name": "gw"}, {"name": "elsewhere"}],
                  "rules": [{"backendRefs": [{"name": "echo", "port": 8080}]}]}},
    ]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    sb = SandboxProcess(tmp, "--keep-creation-timestamp")
    gw = None
    echo = EchoServer("echo-abc-def", NS, address=BACKEND_IP).start()
    try:
        sb.kubectl("apply", "--server-side", *sum((["-f", str(GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml")]
                                                  for n in ("gatewayclasses", "gateways", "httproutes", "referencegrants",
                                                            "tlsroutes")), []))
        gw = GatewayProcess(sb.kubeconfig, tmp / "state")
        yield sb, gw, echo
    finally:
        if gw is not None:
            gw.stop()
        echo.stop()
        sb.close()


def test_gatewayclass_is_accepted_before_any_gateway_exists(env):
    sb, gw, _ = env
    _apply(sb, GATEWAY_CLASS)
    def accepted():
        o = _get(sb, "gatewayclass", "gwtest", None)
        ok = _cond((o.get("status") or {}).get("conditions"), "Accepted").get("status") == "True"
        return o if ok and POLICY_KINDS_ANNOTATION in (o["metadata"].get("annotations") or {}) else None

    cls = wait_until(accepted, 15, what="GatewayClass Accepted and annotated")
    conds = cls["status"]["conditions"]
    assert all(c["observedGeneration"] == cls["metadata"]["generation"] for c in conds)
    assert _cond(conds, "SupportedVersion")["status"] == "True"
    assert "HTTPRoute" in [f["name"] for f in cls["status"]["supportedFeatures"]]
    assert "TimeoutPolicy.gwpolicy.io" in cls["metadata"]["annotations"][POLICY_KINDS_ANNOTATION].split(",")
    assert "gateways" not in sb.kubectl("get", "gateways", "-A").stdout  # truly none yet


def test_traffic_status_and_another_controllers_entry_left_alone(env):
    sb, gw, echo = env
    _apply(sb, GATEWAY_CLASS, *_objects(echo.port))
    theirs = {"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": NS, "name": "elsewhere"},
              "controllerName": "example.com/other-controller",
              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "theirs",
                              "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    sb.http.patch(f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes/r/status",
                  json={"status": {"parents": [theirs]}},
                  headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()

    def programmed():
        # the objects arrive in more than one burst: a first status may rightly count no route yet
        o = _get(sb, "gateway", "gw")
        status = o.get("status") or {}
        counted = [x.get("attachedRoutes") for x in status.get("listeners") or []] == [1]
        return o if counted and _cond(status.get("conditions"), "Programmed").get("status") == "True" else None

    g = wait_until(programmed, 30, what=f"Gateway Programmed with its route\n{gw.tail()}")
    address = g["status"]["addresses"][0]["value"]
    assert address.startswith("127.0.20.")
    listener = g["status"]["listeners"][0]
    assert listener["attachedRoutes"] == 1
    assert {c["type"]: c["status"] for c in listener["conditions"]} == {
        "Accepted": "True", "Programmed": "True", "ResolvedRefs": "True", "Conflicted": "False"}

    def answered():
        status, _, body = request(address, 80, "/hello?x=1")
        return json.loads(body) if status == 200 else None

    echoed = wait_until(answered, 30, what="traffic through NGINX")
    assert echoed["pod"] == "echo-abc-def" and echoed["path"] == "/hello?x=1" and echoed["namespace"] == NS

    route = wait_until(lambda: (lambda o: o if any(p.get("controllerName") == GATEWAY_CONTROLLER
                                                   for p in (o.get("status") or {}).get("parents", [])) else None)(
        _get(sb, "httproute", "r")), 15, what="route status")
    parents = route["status"]["parents"]
    assert parents[0] == theirs  # another controller's entry: untouched, in place
    ours = [p for p in parents if p["controllerName"] == GATEWAY_CONTROLLER]
    assert len(ours) == 1 and ours[0]["parentRef"]["name"] == "gw"  # "elsewhere" does not exist: nothing said
    assert _cond(ours[0]["conditions"], "Accepted")["status"] == "True"
    assert _cond(ours[0]["conditions"], "ResolvedRefs")["status"] == "True"


def test_a_missing_backend_gives_500_and_resolvedrefs_false(env):
    sb, gw, echo = env
    objs = _objects(echo.port)
    route = objs[-1]
    route["metadata"]["name"] = "missing"
    route["spec"] = {"parentRefs": [{"name": "gw"}], "hostnames": ["missing.example"],
                     "rules": [{"backendRefs": [{"name": "nope", "port": 8080}]}]}
    _apply(sb, route)

    def unresolved():
        o = _get(sb, "httproute", "missing")
        c = _cond(next(iter((o.get("status") or {}).get("parents") or []), {}).get("conditions"), "ResolvedRefs")
        return c if c.get("status") == "False" else None

    assert wait_until(unresolved, 15, what="ResolvedRefs False")["reason"] == "BackendNotFound"
    address = _get(sb, "gateway", "gw")["status"]["addresses"][0]["value"]
    wait_until(lambda: request(address, 80, "/", host="missing.example")[0] == 500, 15, what="500 for a missing backend")


def test_defaults_a_server_did_not_apply_are_filled_in_and_idempotent():
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r"},
             "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "s", "port": 80}]},
                                                              {"matches": [{"headers": [{"name": "a", "value": "b"}]}]}]}}
    got = with_defaults(route)
    assert got["spec"]["parentRefs"][0] == {"name": "gw", "group": "gateway.networking.k8s.io", "kind": "Gateway"}
    assert got["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert got["spec"]["rules"][0]["backendRefs"][0] == {"name": "s", "port": 80, "group": "", "kind": "Service", "weight": 1}
    assert got["spec"]["rules"][1]["matches"][0] == {"headers": [{"name": "a", "value": "b", "type": "Exact"}],
                                                     "path": {"type": "PathPrefix", "value": "/"}}
    assert with_defaults(got) == got
    assert "group" not in route["spec"]["parentRefs"][0]  # the input is not changed


def test_a_clean_stop_of_the_gateway_stops_its_nginx(env, tmp_path):
    """SIGTERM stops NGINX with the gateway (a SIGKILL does not: tests/gateway/test_gateway_adoption.py)."""
    sb, _, echo = env
    sig = signal.SIGTERM
    _apply(sb, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    other = GatewayProcess(sb.kubeconfig, tmp_path / "state", "--controller-name", "example.com/second",
                           pool="127.0.21.0/24")
    try:
        second = dict(GATEWAY_CLASS, metadata={"name": "second"}, spec={"controllerName": "example.com/second"})
        gwobj = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "second", "namespace": NS},
                 "spec": {"gatewayClassName": "second", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}
        _apply(sb, second, gwobj)

        def serving():
            o = _get(sb, "gateway", "second")
            if _cond((o.get("status") or {}).get("conditions"), "Programmed").get("status") != "True":
                return None
            return o["status"]["addresses"][0]["value"]

        address = wait_until(serving, 30, what=f"second gateway Programmed\n{other.tail()}")
        assert address.startswith("127.0.21.")
        pids = other.nginx_pids()
        assert len(pids) >= 2, pids  # a master and a worker
        request(address, 80, "/")  # NGINX answers (404: no route)
        other.stop(sig, leave_nginx=True)
        wait_until(lambda: not any(alive(p) for p in pids), 10, what=f"NGINX {pids} gone after {sig.name}")
        with pytest.raises(OSError):
            socket.create_connection((address, 80), timeout=1).close()
    finally:
        other.stop()
        sb.kubectl("delete", "gateway", "second", "-n", NS, "--ignore-not-found")


def test_the_quickstart_runs_and_curls_through_nginx():
    """examples/quickstart/run.sh, as the README shows it: both backends answer by path, 404 elsewhere."""
    script = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "run.sh"
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, ADDRESS_POOL="127.0.24.0/24"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Gateway demo is served on 127.0.24." in out.stdout
    answers = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(a["path"], a["pod"]) for a in answers] == [("/", "shop-v1-7d4b9c-x1"), ("/v2/cart", "shop-v2-5f6a8e-y2")]
    assert out.stdout.rstrip().endswith("404")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root (to drop to an unprivileged user with setpriv)")
def test_without_privileges_port_80_is_not_programmed_and_the_status_says_why(env):
    """docs/gateway.md "Ports below 1024": NGINX cannot bind them, the Gateway says so."""
    sb, _, _ = env
    work = Path(tempfile.mkdtemp(prefix="gwpolicy-nonroot-"))
    try:
        os.chmod(work, 0o777)
        kubeconfig = work / "kubeconfig"
        shutil.copy(sb.kubeconfig, kubeconfig)
        os.chmod(kubeconfig, 0o644)
        cls = dict(GATEWAY_CLASS, metadata={"name": "unprivileged"}, spec={"controllerName": "example.com/unprivileged"})
        gwobj = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "low", "namespace": NS},
                 "spec": {"gatewayClassName": "unprivileged", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}
        _apply(sb, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, cls, gwobj)
        proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(BIN / "gwpolicy"), "gateway",
                                 "--kubeconfig", str(kubeconfig), "--no-leader-election", "--listen", "127.0.0.1:0",
                                 "--state-dir", str(work / "state"), "--address-pool", "127.0.25.0/24",
                                 "--controller-name", "example.com/unprivileged"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            def failed():
                o = _get(sb, "gateway", "low")
                c = _cond((o.get("status") or {}).get("conditions"), "Programmed")
                return c if c.get("status") == "False" and c.get("reason") == "Invalid" else None

            cond = wait_until(failed, 30, what="Programmed=False/Invalid")
            assert "Permission denied" in cond["message"] and ":80" in cond["message"]
            listener = _get(sb, "gateway", "low")["status"]["listeners"][0]
            assert _cond(listener["conditions"], "Programmed")["status"] == "False"
        finally:
            proc.terminate()
            proc.wait(15)
    finally:
        sb.kubectl("delete", "gateway", "low", "-n", NS, "--ignore-not-found")
        shutil.rmtree(work, ignore_errors=True)


def _metric(port: int, name: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#") and 'result="ok"' in line or
               (line.startswith(name + " ") or line.startswith(name + "{")) and "result" not in line)


def test_beside_the_policy_controller_neither_fights_and_enforced_policies_get_our_ancestors(env):
    """Both controllers on one cluster: each writes only its own conditions and entries, both keep
    the other's, writes stop once status is right; a policy with a field NGINX cannot honour is
    Accepted=False/Invalid in our ancestor entry, naming the field."""
    import re
    import threading
    import time

    from gwpolicy.status import DEFAULT_CONTROLLER as POLICY_CONTROLLER

    sb, gw, echo = env
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(deploy / "10-policykind-crd.yaml"))
    sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(deploy / "41-timeoutpolicy.yaml"),
               "-f", str(deploy / "42-retrypolicy.yaml"))
    _apply(sb, GATEWAY_CLASS, *_objects(echo.port))
    timeout_policy = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "t", "namespace": NS},
                      "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
                               "default": {"connectionTimeout": "5s"}}}
    retry_policy = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "RetryPolicy", "metadata": {"name": "bad", "namespace": NS},
                    "spec": {"targetRef": {"group": "", "kind": "Service", "name": "echo"},
                             "default": {"attempts": 3, "codes": [503], "backoff": "100ms"}}}
    _apply(sb, timeout_policy, retry_policy)
    ctl = subprocess.Popen([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(sb.kubeconfig), "--listen", "127.0.0.1:0",
                            "--no-leader-election"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ctl_port = None
        while ctl_port is None:
            line = ctl.stderr.readline()
            assert line, "gwpolicy controller did not start"
            m = re.search(r"serving health and metrics on port (\d+)", line)
            ctl_port = int(m.group(1)) if m else None
        threading.Thread(target=ctl.stderr.read, daemon=True).start()  # keep its pipe drained

        def both_there():
            g = _get(sb, "gateway", "gw")
            types = {c["type"] for c in (g.get("status") or {}).get("conditions", [])}
            r = _get(sb, "httproute", "r")
            names = {p.get("controllerName") for p in (r.get("status") or {}).get("parents", [])}
            t = _get(sb, "timeoutpolicy", "t")
            anc = {a.get("controllerName") for a in (t.get("status") or {}).get("ancestors", [])}
            return ({"Accepted", "Programmed", "gwpolicy.io/TimeoutPolicyAffected"} <= types
                    and {GATEWAY_CONTROLLER, POLICY_CONTROLLER} <= names and {GATEWAY_CONTROLLER, POLICY_CONTROLLER} <= anc)

        wait_until(both_there, 30, what="both controllers' status")
        time.sleep(1.0)
        before = (_metric(gw.port, "gwpolicy_gateway_writes_total"), _metric(ctl_port, "gwpolicy_writes_total"))
        time.sleep(2.0)
        after = (_metric(gw.port, "gwpolicy_gateway_writes_total"), _metric(ctl_port, "gwpolicy_writes_total"))
        if after != before:  # say which object the two keep rewriting
            kinds = [("gateway", "gw"), ("httproute", "r"), ("timeoutpolicy", "t"), ("retrypolicy", "bad"),
                     ("gatewayclass", "gwtest"), ("service", "echo")]
            first = {k: _get(sb, k, n, None if k == "gatewayclass" else NS) for k, n in kinds}
            time.sleep(0.3)
            second = {k: _get(sb, k, n, None if k == "gatewayclass" else NS) for k, n in kinds}
            moving = {k: (json.dumps(first[k].get("status"), sort_keys=True), json.dumps(second[k].get("status"), sort_keys=True))
                      for k in first if first[k]["metadata"]["resourceVersion"] != second[k]["metadata"]["resourceVersion"]}
            seq = []
            with sb.http.stream("GET", f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/gateways",
                                params={"watch": "true", "resourceVersion": first["gateway"]["metadata"]["resourceVersion"],
                                        "timeoutSeconds": "1"}) as r:
                for line in r.iter_lines():
                    o = json.loads(line)["object"]
                    seq.append((o["metadata"]["resourceVersion"], [m.get("manager") + ":" + m.get("operation") for m in o["metadata"].get("managedFields", [])],
                                [c["type"] + "@" + c["lastTransitionTime"] for c in o.get("status", {}).get("conditions", [])]))
                    if len(seq) > 8:
                        break
            raise AssertionError(f"writes went on: {before} -> {after}; changing: {list(moving)}; gateway events: {seq}")
        assert both_there()
        bad = _get(sb, "retrypolicy", "bad")
        ours = [a for a in bad["status"]["ancestors"] if a["controllerName"] == GATEWAY_CONTROLLER]
        assert ours, bad["status"]
        acc = _cond(ours[0]["conditions"], "Accepted")
        assert (acc["status"], acc["reason"]) == ("False", "Invalid") and "spec.default.backoff" in acc["message"]
        good = _get(sb, "timeoutpolicy", "t")
        ours = [a for a in good["status"]["ancestors"] if a["controllerName"] == GATEWAY_CONTROLLER]
        assert [a["ancestorRef"]["name"] for a in ours] == ["gw"] and _cond(ours[0]["conditions"], "Accepted")["status"] == "True"
        # a field NGINX honours only approximately is said in the message (the policy stays Accepted)
        assert "spec.default.connectionTimeout is approximated" in _cond(ours[0]["conditions"], "Accepted")["message"]
    finally:
        ctl.terminate()
        try:
            ctl.wait(15)
        except subprocess.TimeoutExpired:
            ctl.kill()
            ctl.wait(5)
        sb.kubectl("delete", "timeoutpolicy", "t", "-n", NS, "--ignore-not-found")
        sb.kubectl("delete", "retrypolicy", "bad", "-n", NS, "--ignore-not-found")


def test_a_burst_of_changes_is_coalesced_into_few_reloads(env):
    sb, gw, echo = env
    _apply(sb, GATEWAY_CLASS, *_objects(echo.port))
    address = wait_until(lambda: (_get(sb, "gateway", "gw").get("status") or {}).get("addresses"), 30)[0]["value"]
    wait_until(lambda: request(address, 80, "/")[0] == 200, 30, what="route r served")
    before = _metric(gw.port, "gwpolicy_gateway_nginx_reloads_total")
    routes = [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": f"burst-{i}", "namespace": NS},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [f"burst-{i}.example"],
                        "rules": [{"backendRefs": [{"name": "echo", "port": 8080}]}]}} for i in range(20)]
    _apply(sb, *routes)
    def all_attached():
        g = _get(sb, "gateway", "gw")
        listener = g["status"]["listeners"][0]
        return listener["attachedRoutes"] >= 21 and _cond(g["status"]["conditions"], "Programmed")["status"] == "True"

    wait_until(all_attached, 30, what="21 routes attached and programmed")
    echoed = [json.loads(request(address, 80, f"/b{i}", host=f"burst-{i}.example")[2]) for i in range(20)]
    assert all(e["host"] == f"burst-{i}.example" for i, e in enumerate(echoed))
    reloads = _metric(gw.port, "gwpolicy_gateway_nginx_reloads_total") - before
    assert 1 <= reloads <= 10, f"{reloads} reloads for 20 route creations"
    sb.kubectl("delete", "httproute", *[r["metadata"]["name"] for r in routes], "-n", NS)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["leader-stops", "leader-killed"])
def test_every_replica_serves_and_status_writing_moves_when_the_leader_goes(env, tmp_path, how):
    """Two replicas with leader election: both run NGINX and serve (here on one machine, so on
    ports 1000 apart); only the leader writes status; when it stops (lease released) or is killed
    (lease expires), the other writes status and serves on."""
    sb, _, echo = env
    cls = dict(GATEWAY_CLASS, metadata={"name": "ha"}, spec={"controllerName": "example.com/ha"})
    gwobj = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "ha", "namespace": NS},
             "spec": {"gatewayClassName": "ha", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "ha", "namespace": NS},
             "spec": {"parentRefs": [{"name": "ha"}], "rules": [{"backendRefs": [{"name": "echo", "port": 8080}]}]}}
    _apply(sb, *_objects(echo.port)[:4], cls, gwobj, route)
    offsets = {"one": 0, "two": 1000}
    replicas = [GatewayProcess(sb.kubeconfig, tmp_path / name, "--controller-name", "example.com/ha", "--port-offset",
                               str(offsets[name]), pool="127.0.28.0/24", lease_namespace=NS) for name in offsets]
    try:
        def programmed():
            o = _get(sb, "gateway", "ha")
            c = _cond((o.get("status") or {}).get("conditions"), "Programmed")
            return o["status"]["addresses"][0]["value"] if c.get("status") == "True" else None

        address = wait_until(programmed, 30, what="Gateway ha Programmed")
        for port in (80, 1080):
            wait_until(lambda: request(address, port, "/")[0] == 200, 15, what=f"traffic on {port}")
        lease = _get(sb, "lease", "gwpolicy-gateway")
        leader = next(r for r in replicas if r.state_dir.name == lease["spec"]["holderIdentity"])
        standby = next(r for r in replicas if r is not leader)
        assert leader.master_pid() and standby.master_pid()  # every replica serves
        leader.stop(how)
        wait_until(lambda: _get(sb, "lease", "gwpolicy-gateway")["spec"]["holderIdentity"] == standby.state_dir.name,
                   20, what=f"the other replica leads\n{standby.tail()}")
        port = 80 + offsets[standby.state_dir.name]
        assert request(address, port, "/")[0] == 200
        _apply(sb, dict(gwobj, spec=dict(gwobj["spec"], listeners=[{"name": "http", "port": 80, "protocol": "HTTP",
                                                                    "allowedRoutes": {"namespaces": {"from": "All"}}}])))
        gen = _get(sb, "gateway", "ha")["metadata"]["generation"]
        wait_until(lambda: _cond(_get(sb, "gateway", "ha")["status"]["conditions"], "Programmed").get("observedGeneration")
                   == gen, 20, what=f"status written by the new leader\n{standby.tail()}")
        assert programmed() == address
    finally:
        for r in replicas:
            r.stop()
        sb.kubectl("delete", "httproute", "ha", "-n", NS, "--ignore-not-found")
        sb.kubectl("delete", "gateway", "ha", "-n", NS, "--ignore-not-found")


def test_health_readiness_and_metrics(env):
    import urllib.request

    sb, gw, echo = env
    _apply(sb, GATEWAY_CLASS, *_objects(echo.port))
    wait_until(lambda: (_get(sb, "gateway", "gw").get("status") or {}).get("addresses"), 30)
    get = lambda path: urllib.request.urlopen(f"http://127.0.0.1:{gw.port}{path}", timeout=5)  # noqa: E731
    assert get("/healthz").read() == b"ok"
    wait_until(lambda: get("/readyz").status == 200, 15, what="ready")
    text = get("/metrics").read().decode()
    assert 'gwpolicy_gateway_nginx_reloads_total{result="ok"}' in text and "gwpolicy_gateway_reconciles_total" in text
    statusz = json.loads(get("/statusz").read())
    assert statusz["synced"] and statusz["nginxError"] is None
    # full analyses and in-place updates are counted apart, as /statusz counts them
    assert _metric(gw.port, "gwpolicy_gateway_full_analyses_total") >= 1
    assert "gwpolicy_gateway_incremental_updates_total" in text
    assert 'gwpolicy_gateway_informer_stuck{resource="httproutes"} 0.0' in text  # as the controller reports its informers


def test_endpoints_follow_the_endpointslices(env):
    """The sandbox serves EndpointSlices and the gateway watches them: no ready endpoint -> 5xx; a
    slice with the echo backend -> 200; the endpoint not ready -> 5xx again."""
    sb, gw, echo = env
    _apply(sb, GATEWAY_CLASS, *_objects(echo.port))
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "late", "namespace": NS},
           "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": echo.port}]}}
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "late", "namespace": NS},
             "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["late.example"],
                      "rules": [{"backendRefs": [{"name": "late", "port": 8080}]}]}}
    _apply(sb, svc, route)
    address = wait_until(lambda: (_get(sb, "gateway", "gw").get("status") or {}).get("addresses"), 30)[0]["value"]
    wait_until(lambda: request(address, 80, "/", host="late.example")[0] >= 500, 15, what="5xx without endpoints")
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": "late-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "late"}},
              "addressType": "IPv4", "ports": [{"name": "http", "port": echo.port, "protocol": "TCP"}],
              "endpoints": [{"addresses": [BACKEND_IP], "conditions": {"ready": True}}]}
    _apply(sb, slice_)
    wait_until(lambda: request(address, 80, "/", host="late.example")[0] == 200, 15, what="200 once the slice has the endpoint")
    slice_["endpoints"][0]["conditions"]["ready"] = False
    _apply(sb, slice_)
    wait_until(lambda: request(address, 80, "/", host="late.example")[0] >= 500, 15, what="5xx once it is not ready")
    sb.kubectl("delete", "httproute", "late", "-n", NS)


def test_a_tlsroute_is_passed_through_by_sni_and_gets_its_status(env, tmp_path):
    """TLS passthrough end to end: the gateway watches TLSRoutes, writes their status and the
    listener's, and NGINX forwards the handshake to the backend, whose own certificate the client
    sees (NGINX does not terminate)."""
    import ssl

    import gwconformance as gc

    sb, gw, _ = env
    crt, key = gc.make_cert(["secure.pass.example"])
    (tmp_path / "b.crt").write_bytes(crt)
    (tmp_path / "b.key").write_bytes(key)
    backend = EchoServer("tls-echo-abc-def", NS, address="127.0.22.2", cert=str(tmp_path / "b.crt"),
                         key=str(tmp_path / "b.key")).start()
    gwy = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "pass", "namespace": NS},
           "spec": {"gatewayClassName": "gwtest", "listeners": [
               {"name": "tls", "port": 8443, "protocol": "TLS", "tls": {"mode": "Passthrough"},
                "allowedRoutes": {"kinds": [{"kind": "TLSRoute"}]}}]}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tls-echo", "namespace": NS},
           "spec": {"ports": [{"name": "https", "port": 443, "targetPort": backend.port}]}}
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": "tls-echo-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "tls-echo"}},
              "addressType": "IPv4", "ports": [{"name": "https", "port": backend.port, "protocol": "TCP"}],
              "endpoints": [{"addresses": ["127.0.22.2"], "conditions": {"ready": True}}]}
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute", "metadata": {"name": "secure", "namespace": NS},
             "spec": {"parentRefs": [{"name": "pass"}], "hostnames": ["secure.pass.example"],
                      "rules": [{"backendRefs": [{"name": "tls-echo", "port": 443}]}]}}
    try:
        _apply(sb, GATEWAY_CLASS, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, gwy, svc, slice_, route)

        def accepted():
            o = _get(sb, "tlsroute", "secure")
            ours = [p for p in (o.get("status") or {}).get("parents") or [] if p.get("controllerName") == GATEWAY_CONTROLLER]
            return ours[0] if ours and _cond(ours[0]["conditions"], "Accepted").get("status") == "True" else None

        parent = wait_until(accepted, 30, what=f"TLSRoute Accepted\n{gw.tail()}")
        assert _cond(parent["conditions"], "ResolvedRefs")["status"] == "True"
        g = wait_until(lambda: (lambda o: o if _cond((o.get("status") or {}).get("conditions"), "Programmed").get("status")
                                == "True" else None)(_get(sb, "gateway", "pass")), 30, what="Gateway pass Programmed")
        listener = g["status"]["listeners"][0]
        assert listener["supportedKinds"] == [{"group": "gateway.networking.k8s.io", "kind": "TLSRoute"}]
        assert listener["attachedRoutes"] == 1
        address = g["status"]["addresses"][0]["value"]
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

        def backend_cert():
            try:
                with socket.create_connection((address, 8443), timeout=5) as raw, \
                        ctx.wrap_socket(raw, server_hostname="secure.pass.example") as s:
                    return s.getpeercert(binary_form=True)
            except OSError:
                return None

        assert wait_until(backend_cert, 30, what="passthrough to the TLS backend") == ssl.PEM_cert_to_DER_cert(crt.decode())
    finally:
        sb.kubectl("delete", "tlsroute", "secure", "-n", NS)
        sb.kubectl("delete", "gateway", "pass", "-n", NS)
        backend.stop()
