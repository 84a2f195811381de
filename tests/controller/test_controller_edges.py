"""The controller at the edges of a real cluster: other controllers on the same status lists, an API
server that comes back without its data, lists that fail, CRDs that go away, --namespace, the Lease
namespace out of the box, lease expiry on the local clock, the breadcrumb rate, and --listen."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import socket
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx2 as httpx
import pytest
import yaml

from gwpolicy.controller.app import Controller, Options
from gwpolicy.controller.defaults import listen as default_listen
from gwpolicy.controller.main import parse
from gwpolicy.sandbox.server import write_kubeconfig
from gwpolicy.sandbox.store import ApiFailure
from kube_harness import Cluster, cluster, key_of, offline_expectation, strip_times
from sandbox_proc import BIN, SandboxProcess, wait_for

PARABLE = Path(__file__).resolve().parents[2] / "examples" / "parable"
OURS, THEIRS = "gwpolicy.io/policy-controller", "other.example.com/policy-controller"


def run(coro):
    return asyncio.run(coro)


def parable() -> list[dict]:
    return [d for f in sorted(PARABLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def _get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        return await http.get(path)


def _metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


# ---------- 1. two controllers on the same status lists ----------

def test_two_controllers_share_status_lists_and_stop_writing(tmp_path: Path, server_kind: str) -> None:
    """Against the sandbox and kube-apiserver (there both as deploy/'s ServiceAccount)."""
    async def go():
        async with cluster(server_kind, tmp_path) as c:
            await c.seed(parable())
            ours = await c.controller(controller_name=OURS, leader_election=False)
            theirs = await c.controller(controller_name=THEIRS, leader_election=False, field_manager="other")
            await c.idle(ours, timeout=20)
            await c.idle(theirs, timeout=20)
            await c.idle(ours, timeout=5)
            writes = c.writes
            await asyncio.sleep(1.0)
            assert c.writes == writes, f"{c.writes - writes} writes in 1 s after both controllers were idle"
            after = c.objects()
            policies = [o for o in after if o["apiVersion"].startswith("policy.acme.io/")]
            assert policies
            for p in policies:
                names = {e["controllerName"] for e in p["status"]["ancestors"]}
                assert names == {OURS, THEIRS}, f"{p['metadata']['name']}: {names}"
            routes = [o for o in after if o["kind"] == "HTTPRoute" and (o.get("status") or {}).get("parents")]
            assert any({p["controllerName"] for p in r["status"]["parents"]} >= {OURS, THEIRS} for r in routes)
            # and each is what `gwpolicy status --controller-name` computes for it offline
            assert offline_expectation(after, OURS) == {}
            assert offline_expectation(after, THEIRS) == {}
    run(go())


def test_status_entries_keep_their_places(tmp_path: Path) -> None:
    """Another controller's entry before or after ours stays where it is; ours is replaced in place."""
    async def go():
        async with Cluster(tmp_path) as c:
            objs = parable()
            pol = next(o for o in objs if o["metadata"]["name"] == "typo")
            theirs = {"ancestorRef": {"group": "", "kind": "Namespace", "name": "elsewhere"}, "controllerName": THEIRS,
                      "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "theirs",
                                      "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
            await c.seed(objs)
            ctl = await c.controller()
            await c.idle(ctl)
            live = next(o for o in c.objects() if o["metadata"]["name"] == "typo")
            mine = [e for e in live["status"]["ancestors"] if e["controllerName"] == OURS]
            # someone else appends its entry, after ours
            edited = {"apiVersion": pol["apiVersion"], "kind": pol["kind"],
                      "metadata": {"name": "typo", "namespace": pol["metadata"]["namespace"]},
                      "status": {"ancestors": mine + [theirs]}}
            r = c.sandbox.store.registry.by_kind[("policy.acme.io", pol["kind"])]
            t0 = time.monotonic()
            c.sandbox.store.update(r, pol["metadata"]["namespace"], "typo", dict(live, status=edited["status"]),
                                   subresource="status", manager="other")
            writes = c.writes
            await c.idle(ctl, after=t0)
            assert c.writes == writes, "ours first and theirs after is right too: nothing to write"
            live = next(o for o in c.objects() if o["metadata"]["name"] == "typo")
            assert [e["controllerName"] for e in live["status"]["ancestors"]] == [OURS, THEIRS]
            assert offline_expectation(c.objects()) == {}, "offline `gwpolicy status` keeps the places too"
    run(go())


# ---------- 2. an API server restarted without its data ----------

@pytest.mark.parametrize("strict", [False, True], ids=["lax-watch", "kube-apiserver-watch"])
def test_restart_without_data_relists_and_ends_equal_to_offline(tmp_path: Path, strict: bool) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            objs = parable()
            await c.seed(objs)
            ctl = await c.controller()
            await c.idle(ctl)
            # a cluster that has lived a while: its etcd revision is far ahead of a new one's, and the
            # informers hold it (from the bookmarks)
            c.sandbox.store.rv += 10_000
            await asyncio.sleep(0.6)
            old_rv = int(c.sandbox.store.rv)
            # the server comes back with a new etcd; the objects are applied again (say by GitOps),
            # one of them changed
            changed = copy.deepcopy(objs)
            typo = next(o for o in changed if o["metadata"]["name"] == "typo")
            typo["spec"]["targetRefs"][0]["name"] = "cake"
            t0 = time.monotonic()
            await c.restart_without_data(changed, strict=strict)
            assert c.sandbox.store.rv < old_rv, "the test needs versions that went back"
            await c.idle(ctl, quiet=0.5, after=t0, timeout=30)
            after = c.objects()
            assert offline_expectation(after) == {}, "after the restart the cluster is not what offline computes"
            assert any(i.resets for i in ctl.informers.values()), "no informer noticed the reset"
            assert next(o for o in after if o["metadata"]["name"] == "typo")["status"]["ancestors"]
            # an edit after the restart is seen too
            mod = copy.deepcopy(typo)
            mod["spec"]["targetRefs"][0]["name"] = "bread"
            t1 = time.monotonic()
            await c.apply(mod)
            await c.idle(ctl, quiet=0.5, after=t1)
            assert offline_expectation(c.objects()) == {}
            assert (await _get(ctl.port, "/readyz")).status_code == 200
    run(go())


def test_periodic_resync_catches_what_a_watch_missed(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller(resync=1.0)
            await c.idle(ctl)
            # a status of ours removed behind the watch's back (no event: the server lost it)
            store = c.sandbox.store
            key = next(k for k, o in store.objects.items() if o["metadata"]["name"] == "typo")
            live = copy.deepcopy(store.objects[key])
            live["status"] = {}
            store._bump(live)  # noqa: SLF001 - a new version, and no event for it
            store.objects[key] = live
            for _ in range(60):
                await asyncio.sleep(0.1)
                if (store.objects[key].get("status") or {}).get("ancestors"):
                    break
            assert (store.objects[key].get("status") or {}).get("ancestors"), "the resync did not restore it"
    run(go())


# ---------- 7. a kind that cannot be listed ----------

def test_a_kind_that_cannot_be_listed_is_not_ready(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            c.fail_lists("grpcroutes")
            ctl = await c.controller()
            await asyncio.sleep(1.5)
            r = await _get(ctl.port, "/readyz")
            assert r.status_code == 503 and "grpcroutes.gateway.networking.k8s.io" in r.text and "500" in r.text, r.text
            statusz = (await _get(ctl.port, "/statusz")).json()
            assert statusz["ready"] is False
            assert "500" in statusz["informers"]["gateway.networking.k8s.io/grpcroutes"]["error"]
            text = (await _get(ctl.port, "/metrics")).text
            assert _metric(text, 'gwpolicy_informer_stuck{resource="grpcroutes"}') == 1.0
            assert _metric(text, 'gwpolicy_informer_failures_total{operation="list",resource="grpcroutes"}') >= 1
            assert _metric(text, 'gwpolicy_informer_stuck{resource="httproutes"}') == 0.0


def test_a_kind_whose_list_starts_failing_later_is_not_ready(tmp_path: Path) -> None:
    """Synced once, then its watch history is compacted and every new list fails: not ready, until it lists again."""
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller()
            await c.idle(ctl)
            assert (await _get(ctl.port, "/readyz")).status_code == 200
            c.fail_lists("httproutes")
            await c.faults(compact=True, dropWatches=True)
            for _ in range(40):
                await asyncio.sleep(0.1)
                r = await _get(ctl.port, "/readyz")
                if r.status_code == 503:
                    break
            assert r.status_code == 503 and "httproutes.gateway.networking.k8s.io" in r.text, r.text
            c.heal_lists()
            for _ in range(60):
                await asyncio.sleep(0.2)
                if (await _get(ctl.port, "/readyz")).status_code == 200:
                    break
            assert (await _get(ctl.port, "/readyz")).status_code == 200, "ready again once the list works"
    run(go())


# ---------- 6. a policy CRD deleted ----------

def test_deleting_a_policy_crd_takes_back_its_breadcrumbs(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller()
            await c.idle(ctl)

            def crumbs(kind: str) -> list[str]:
                t = f"gwpolicy.io/{kind}Affected"
                return [o["metadata"]["name"] for o in c.objects()
                        if any(cond.get("type") == t for p in (o.get("status") or {}).get("parents") or []
                               for cond in p.get("conditions") or [])
                        or any(cond.get("type") == t for cond in (o.get("status") or {}).get("conditions") or [])]

            assert crumbs("RetryPolicy"), "the parable's RetryPolicies leave breadcrumbs"
            t0 = time.monotonic()
            async with httpx.AsyncClient(base_url=c.server.url) as http:
                r = await http.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/retrypolicies.policy.acme.io")
                assert r.status_code == 200, r.text
            await c.idle(ctl, quiet=0.5, after=t0)
            assert crumbs("RetryPolicy") == []
            assert ("policy.acme.io", "RetryPolicy") not in ctl.kinds
            assert not [k for k in ctl.informers if k.kind == "RetryPolicy"]
            assert crumbs("TimeoutPolicy"), "the other kinds' breadcrumbs stay"
            assert (await _get(ctl.port, "/readyz")).status_code == 200
    run(go())


# ---------- 3. --namespace ----------

def test_namespace_mode_reads_everything_and_writes_only_inside(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            before = c.objects()
            expected = offline_expectation(before)
            inside = {k for k in expected if k[2] == "baker"}
            assert inside and any(k[2] != "baker" for k in expected)
            ctl = await c.controller(namespace="baker")
            await c.idle(ctl)
            after = c.objects()
            prev = {key_of(o): o for o in before}
            for o in after:
                k = key_of(o)
                if k[1] == "Lease":
                    continue
                got = (strip_times(o.get("status") or {}), dict(o["metadata"].get("annotations") or {}))
                if k in inside:
                    assert got == expected[k], f"{k}: wrote {got}, offline says {expected[k]}"
                else:
                    old = (strip_times(prev[k].get("status") or {}), dict(prev[k]["metadata"].get("annotations") or {}))
                    assert got == old, f"{k} is outside --namespace baker and was written"
    run(go())


# ---------- 4. the Lease namespace and expiry ----------

@pytest.mark.parametrize("where", ["kubeconfig-context", "pod"])
def test_lease_namespace_comes_from_the_context_or_the_pod(tmp_path: Path, where: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    if where == "pod":
        monkeypatch.setenv("POD_NAMESPACE", "infra")  # the Deployment sets it from metadata.namespace

    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable() + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "infra"}}])
            write_kubeconfig(str(c.kubeconfig), c.server.port, namespace="infra" if where != "pod" else "default")
            ctl = Controller(Options(kubeconfig=str(c.kubeconfig), listen="127.0.0.1:0", lease_duration=1.5,
                                     breadcrumb_qps=0, debounce=0.01))
            await ctl.start()
            c.controllers.append(ctl)
            await c.idle(ctl)
            assert ctl.lease_namespace == "infra"
            assert ("coordination.k8s.io", "leases", "infra", "gwpolicy-controller") in c.sandbox.store.objects
            assert offline_expectation(c.objects()) == {}
    run(go())


def test_a_missing_lease_namespace_says_what_to_do(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller(lease_namespace="nowhere", lease_duration=0.6)
            await asyncio.sleep(1.0)
            r = await _get(ctl.port, "/readyz")
            assert r.status_code == 503
            for hint in ("'nowhere'", "kubectl apply -f deploy/00-namespace.yaml", "--lease-namespace", "--no-leader-election"):
                assert hint in r.text, r.text
            text = (await _get(ctl.port, "/metrics")).text
            assert _metric(text, 'gwpolicy_leader_election_errors_total{reason="namespace-missing"}') >= 1
            assert ctl.writes_done == 0
    run(go())


def test_a_forbidden_lease_says_which_rbac_is_missing(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            store = c.sandbox.store
            reading = store.get

            def get(r, *args, **kwargs):
                if r.plural == "leases":
                    raise ApiFailure(403, "Forbidden", 'leases.coordination.k8s.io "gwpolicy-controller" is forbidden: '
                                     'User "system:serviceaccount:x:y" cannot get resource "leases"')
                return reading(r, *args, **kwargs)

            store.get = get  # type: ignore[method-assign]
            ctl = await c.controller(lease_duration=0.6)
            await asyncio.sleep(1.0)
            r = await _get(ctl.port, "/readyz")
            assert r.status_code == 503 and "leases" in r.text and "deploy/20-rbac.yaml" in r.text, r.text
            text = (await _get(ctl.port, "/metrics")).text
            assert _metric(text, 'gwpolicy_leader_election_errors_total{reason="forbidden"}') >= 1
    run(go())


async def _lease(c: Cluster, holder: str, renew: datetime, duration: int = 1) -> None:
    await c.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": "gwpolicy-controller", "namespace": "gwpolicy-system"},
                   "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": _fmt(renew),
                            "acquireTime": _fmt(renew), "leaseTransitions": 0}}, manager="ghost")


def test_a_lease_left_with_a_clock_ahead_expires_on_our_clock(tmp_path: Path) -> None:
    """A holder whose clock ran an hour ahead died: its renewTime is in our future. client-go takes the
    lease once it has not changed for leaseDurationSeconds, whatever the times in it say."""
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            await _lease(c, "ghost", datetime.now(timezone.utc) + timedelta(hours=1))
            ctl = await c.controller(identity="me", lease_duration=1.0)
            for _ in range(60):
                if ctl.elector.is_leader:
                    break
                await asyncio.sleep(0.05)
            assert ctl.elector.is_leader, "a lease unchanged for its duration was not taken"
    run(go())


def test_a_renewing_holder_with_a_clock_behind_keeps_its_lease(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            behind = datetime.now(timezone.utc) - timedelta(hours=1)
            await _lease(c, "ghost", behind)
            ctl = await c.controller(identity="me", lease_duration=1.0)
            end = time.monotonic() + 2.5
            n = 0
            while time.monotonic() < end:
                n += 1
                await _lease(c, "ghost", behind + timedelta(seconds=n))  # renewing, on its own (slow) clock
                assert not ctl.elector.is_leader, "took the lease of a holder that renews it"
                await asyncio.sleep(0.2)
    run(go())


# ---------- 5. the breadcrumb rate ----------

def test_the_breadcrumb_rate_is_spent_on_writes_only(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            writes: list[float] = []
            c.sandbox.store.listeners.append(lambda ev: writes.append(time.monotonic())
                                             if ev.type == "MODIFIED" and ev.plural != "leases"
                                             and ev.group != "policy.acme.io" else None)
            qps = 25.0
            ctl = await c.controller(breadcrumb_qps=qps, leader_election=False)
            await c.idle(ctl, quiet=0.2, timeout=60)
            done = time.monotonic() - 0.2
            n = len(writes)
            assert n >= 15
            budget = (n - 1) / qps
            assert writes[-1] - writes[0] >= 0.9 * budget, "faster than the rate"
            # before: every echo of our own writes queued again and took a slot too, so the controller
            # was busy (and a new edit waited) twice as long as the writes needed
            took = done - writes[0]
            assert took <= 1.1 * budget + 0.3, f"{n} breadcrumb writes at {qps}/s kept it busy {took:.2f}s, the rate needs {budget:.2f}s"
    run(go())


def test_a_route_edited_during_the_first_status_does_not_wait_for_the_backlog(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            objs = parable()
            await c.seed(objs)
            qps = 4.0
            ctl = await c.controller(breadcrumb_qps=qps, leader_election=False)
            route = None
            # wait until the first breadcrumbs are written and a backlog of several seconds remains
            for _ in range(100):
                done = [o for o in c.objects() if o["kind"] == "HTTPRoute" and any(
                    p["controllerName"] == OURS for p in (o.get("status") or {}).get("parents") or [])]
                if done:
                    route = done[0]
                    break
                await asyncio.sleep(0.05)
            assert route is not None and len(ctl.low) / qps > 2.0, "the test needs a backlog of a few seconds"
            edited = copy.deepcopy(next(o for o in objs if o["kind"] == "HTTPRoute"
                                        and o["metadata"]["name"] == route["metadata"]["name"]
                                        and o["metadata"].get("namespace") == route["metadata"].get("namespace")))
            edited["spec"]["hostnames"] = ["edited.example.com"]
            t0 = time.monotonic()
            out = await c.apply(edited)
            generation = out["metadata"]["generation"]
            while time.monotonic() - t0 < 10:
                live = next(o for o in c.objects() if key_of(o) == key_of(route))
                conds = [cd for p in live["status"]["parents"] if p["controllerName"] == OURS for cd in p["conditions"]]
                if conds and all(cd["observedGeneration"] == generation for cd in conds):
                    break
                await asyncio.sleep(0.05)
            waited = time.monotonic() - t0
            # the writers already hold a slot each (4), and the edit makes a few breadcrumbs of its own
            allowed = (4 + 3) / qps
            assert waited < allowed, f"the edited route's breadcrumb waited {waited:.2f}s (> {allowed:.2f}s) behind the backlog"
            assert ctl.low, "the backlog was still there: the edit went before it"
    run(go())


def test_a_pass_during_the_backlog_costs_what_it_queues_not_the_backlog() -> None:
    """Each pass of the reconcile loop during the first status queues a few breadcrumbs before the
    backlog. Rebuilding the backlog behind them on every pass made the first status quadratic (at 20k
    routes ~9% of the controller's CPU, growing with the cluster)."""
    from gwpolicy.refs import Ref

    def passes(backlog: int) -> float:
        ctl = Controller(Options())
        ctl.low = dict.fromkeys(Ref("", "Service", "ns", f"svc-{i}") for i in range(backlog))
        fresh = [Ref("gateway.networking.k8s.io", "HTTPRoute", "ns", f"r-{i}") for i in range(300)]
        t = time.process_time()
        for ref in fresh:
            ctl._enqueue([ref], full=False)
        spent = time.process_time() - t
        ctl.leader_election = False
        ctl.opts.leader_election = False
        ctl.model.stale = False
        taken = [ctl._take()[0] for _ in range(len(fresh))]
        assert set(taken) == set(fresh), "what a change caused goes before the backlog"
        assert len(ctl.low) == backlog
        return spent

    small, large = min(passes(10) for _ in range(3)), min(passes(100_000) for _ in range(3))
    assert large < 20 * small + 0.01, f"300 passes took {large:.3f}s with a backlog of 100k, {small:.4f}s with 10"


# ---------- 7. --listen ----------

def test_listen_defaults_to_loopback_outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert default_listen("controller") == "127.0.0.1:8080"
    assert parse([]).listen is None  # resolved at start
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert default_listen("controller") == "0.0.0.0:8080"


def test_a_busy_port_is_an_error_message(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), 1)  # never reached: the listen fails first
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(kubeconfig),
                              "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--listen" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


# ---------- out of the box ----------

def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_out_of_the_box_against_a_fresh_sandbox(tmp_path: Path) -> None:
    """`gwpolicy controller --kubeconfig F`, no other flag: the Lease goes to the context's namespace
    (`default`, as kubectl's), health listens on 127.0.0.1:8080, and status is written."""
    if not _free(8080):
        pytest.skip("127.0.0.1:8080 is busy on this machine (the default --listen is what this test runs)")
    from gwpolicy.sandbox.seed import apply_all

    sb = SandboxProcess(tmp_path)
    proc = None
    try:
        # every cluster has `default` (kube-apiserver creates it); this sandbox makes namespaces on demand
        apply_all(sb.url, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}] + parable(),
                  **sb.client)
        env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "POD_NAMESPACE")}
        proc = subprocess.Popen([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(sb.kubeconfig)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

        def written() -> bool:
            items = sb.http.get("/apis/policy.acme.io/v1/retrypolicies").json()["items"]
            return bool(items) and all((o.get("status") or {}).get("ancestors") for o in items)

        wait_for(written, timeout=30, step=0.2)
        lease = sb.http.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/gwpolicy-controller")
        assert lease.status_code == 200
        ready = wait_for(lambda: httpx.get("http://127.0.0.1:8080/readyz").status_code == 200, timeout=10)
        assert ready
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            assert proc.returncode == 0, err
        sb.close()
