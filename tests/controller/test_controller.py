"""The controller against the sandbox, and against a real kube-apiserver as deploy/'s ServiceAccount
(kube_harness.KubeCluster): equal to the offline computation, minimal writes, HA takeover, an API
server restart; faults, against the sandbox."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path

import httpx2 as httpx
import pytest
import yaml

from gwpolicy.controller import kube
from helpers import CONFORMANCE, needs_shared, scenario_files
from kube_harness import Cluster, cluster, differences, key_of, offline_expectation, strip_times
from live_server import require

SCENARIOS = scenario_files()
#: against kube-apiserver too, the seeds whose objects meet the server's own rules: breadcrumbs on
#: Services and Namespaces (metadata patches), shapes a CRD schema lets through or prunes, a CRD with no
#: status in its schema, cross-namespace grants, a cluster-scoped target, conflicts decided by
#: creationTimestamp (which the real server stamps), two paths, allowedRoutes. The other scenarios
#: (the GEP-713 tables) exercise the engine, which is the same whatever the server.
KUBE_SEEDS = {"seed-breadcrumbs", "seed-invalid-shapes", "seed-map-replaced-whole", "seed-cross-namespace-needs-grant",
              "seed-gatewayclass-needs-cluster-scope", "seed-ngf-conflict-oldest-wins", "seed-two-paths",
              "seed-allowed-routes"}
KUBE_SCENARIOS = [p for p in SCENARIOS if p.stem in KUBE_SEEDS]


def run(coro):
    return asyncio.run(coro)


def scenario(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["manifests"]


async def converge(tmp: Path, objects: list[dict], kind: str = "sandbox") -> list[str]:
    async with cluster(kind, tmp) as c:
        await c.seed(objects)
        before = c.objects()
        expected = offline_expectation(before)
        # a policy CRD whose schema has no `status` (seed-map-replaced-whole's) cannot hold one on a
        # real API server: the controller leaves it, and writes the rest
        pruned = {(k.group, k.kind) for o in before if o["kind"] == "CustomResourceDefinition"
                  for k in [kube.kind_of_crd(o, set())] if k is not None and not k.status_schema}
        prev = {key_of(o): o for o in before}
        expected = {key: ((strip_times(prev[key].get("status") or {}) if key in prev else {}), ann)
                    if key[:2] in pruned else (status, ann) for key, (status, ann) in expected.items()}
        ctl = await c.controller()
        await c.idle(ctl)
        return differences(before, c.objects(), expected)


@pytest.mark.parametrize("kind,path", [("sandbox", p) for p in SCENARIOS] + [("kube", p) for p in KUBE_SCENARIOS],
                         ids=[f"sandbox-{p.stem}" for p in SCENARIOS] + [f"kube-{p.stem}" for p in KUBE_SCENARIOS])
def test_controller_writes_what_gwpolicy_status_computes(kind: str, path: Path, tmp_path: Path) -> None:
    problems = run(converge(tmp_path, scenario(path), require(kind)))
    assert not problems, f"{path.relative_to(CONFORMANCE)}:\n  " + "\n  ".join(problems)


PARABLE = Path(__file__).resolve().parents[2] / "examples" / "parable"


def parable() -> list[dict]:
    return [d for f in sorted(PARABLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_one_policy_edit_writes_only_what_changes(tmp_path: Path, server_kind: str) -> None:
    async def go():
        async with cluster(server_kind, tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller()
            await c.idle(ctl)
            writes = c.writes
            analyses = ctl.model.reconciles
            assert analyses <= 2, f"the echoes of our own writes started {analyses} analyses"
            await asyncio.sleep(0.5)
            assert c.writes == writes, "an idle controller wrote"
            before = c.objects()
            # Ana's route policy: a new maxRetries that Charlie's override still beats; only its own status
            # (observedGeneration) changes, no effective value, no breadcrumb
            pol = next(o for o in before if o["metadata"]["name"] == "cake-retries")
            edited = copy.deepcopy(pol)
            edited["spec"]["defaults"]["maxRetries"] = 6
            edited["metadata"]["generation"] += 1  # as the API server bumps it for a spec change
            expected = offline_expectation([edited if key_of(o) == key_of(pol) else o for o in before])
            t0 = time.monotonic()
            await c.apply(edited)
            seeded = c.writes
            await c.idle(ctl, after=t0)
            assert c.writes - seeded == len(expected), f"wrote {c.writes - seeded}, offline needs {len(expected)}: {list(expected)}"
            assert len(expected) == 1
            assert ctl.model.reconciles == analyses, "a policy edit must not need a full analysis"
            assert ctl.model.incremental_updates >= 1
            # /metrics counts the update (it is applied as its event comes, between two passes)
            assert ctl.metrics.registry.get_sample_value("gwpolicy_incremental_updates_total") == \
                ctl.model.incremental_updates
    run(go())


def test_faults_dropped_streams_410_409_500_and_restart(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            objs = parable()
            other = next(o for o in objs if o["metadata"]["name"] == "typo")
            other["status"] = {"ancestors": [{"ancestorRef": {"group": "", "kind": "Namespace", "name": "baker"},
                                              "controllerName": "someone.else/controller",
                                              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                                                              "message": "theirs", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}]}
            await c.seed(objs)
            await c.faults(failWrites=[[2, 409], [4, 500], [7, 409]], latency=0.002)
            ctl = await c.controller()
            await asyncio.sleep(0.3)
            await c.faults(dropWatches=True)
            await asyncio.sleep(0.2)
            # a change while the controller is cut off, then history compacted: it must list again
            await c.server.stop()
            c.sandbox.store.compact()
            await asyncio.sleep(0.3)
            await c.server.start()
            mod = next(o for o in objs if o["metadata"]["name"] == "baker-retries")
            mod = copy.deepcopy(mod)
            mod["spec"]["overrides"]["maxRetries"] = 2
            t0 = time.monotonic()
            await c.apply(mod)
            await c.faults(compact=True)
            await c.idle(ctl, quiet=0.5, after=t0)
            await c.server.restart()
            await c.idle(ctl, quiet=0.5)
            after = c.objects()
            expected = offline_expectation(after)
            assert expected == {}, f"the cluster is not what offline computes: {list(expected)[:5]}"
            typo = next(o for o in after if o["metadata"]["name"] == "typo")
            theirs = [e for e in typo["status"]["ancestors"] if e["controllerName"] == "someone.else/controller"]
            assert theirs and theirs[0]["conditions"][0]["message"] == "theirs"
            assert sum(i.relists for i in ctl.informers.values()) > len(ctl.informers)  # 410s led to new lists
    run(go())


def test_only_the_leader_writes_and_the_standby_takes_over(tmp_path: Path, server_kind: str) -> None:
    async def go():
        async with cluster(server_kind, tmp_path) as c:
            await c.seed(parable())
            first = await c.controller(identity="one", lease_duration=1.0)
            await asyncio.sleep(0.3)
            second = await c.controller(identity="two", lease_duration=1.0)
            await c.idle(first)
            await asyncio.sleep(1.0)
            assert first.elector.is_leader and not second.elector.is_leader
            assert first.writes_done > 0 and second.writes_done == 0
            await first.stop()
            c.controllers.remove(first)
            mod = copy.deepcopy(next(o for o in parable() if o["metadata"]["name"] == "typo"))
            mod["spec"]["targetRefs"][0]["name"] = "cake"
            t0 = time.monotonic()
            await c.apply(mod)
            for _ in range(60):
                if second.elector.is_leader:
                    break
                await asyncio.sleep(0.05)
            assert second.elector.is_leader, "the standby did not take over within the lease duration"
            await c.idle(second, after=t0)
            assert second.writes_done > 0
            assert offline_expectation(c.objects()) == {}
    run(go())


def test_the_controller_goes_on_after_the_api_server_restarts(tmp_path: Path, server_kind: str) -> None:
    """The API server goes away and comes back with its data (its watch cache starting again): the
    controller's watches end, it lists or watches again, and an edit made after the restart gets its
    status, with nothing written twice."""
    async def go():
        async with cluster(server_kind, tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller()
            await c.idle(ctl)
            await c.restart()
            mod = copy.deepcopy(next(o for o in parable() if o["metadata"]["name"] == "typo"))
            mod["spec"]["targetRefs"][0]["name"] = "cake"
            t0 = time.monotonic()
            await c.apply(mod)
            await c.idle(ctl, quiet=0.5, after=t0, timeout=60)
            assert offline_expectation(c.objects()) == {}, "the cluster is not what offline computes after the restart"
            writes = c.writes
            await asyncio.sleep(1.0)
            assert c.writes == writes, "an idle controller wrote after the restart"
    run(go())


def test_health_ready_and_metrics(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            ctl = await c.controller()
            await c.idle(ctl)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ctl.port}") as http:
                assert (await http.get("/healthz")).text == "ok"
                assert (await http.get("/readyz")).status_code == 200
                text = (await http.get("/metrics")).text
            for name in ("gwpolicy_events_total", "gwpolicy_reconcile_passes_total", "gwpolicy_full_analyses_total",
                         "gwpolicy_incremental_updates_total", "gwpolicy_writes_total", "gwpolicy_queue_depth",
                         "gwpolicy_errors_total", "gwpolicy_leader", "gwpolicy_informer_stuck"):
                assert name in text
            assert 'gwpolicy_leader 1.0' in text
            # the counters count what their names say: analyses are analyses, not loop passes
            assert f"gwpolicy_full_analyses_total {float(ctl.model.reconciles)}" in text
            passes = next(float(line.split()[1]) for line in text.splitlines()
                          if line.startswith("gwpolicy_reconcile_passes_total "))
            assert passes >= ctl.model.reconciles
    run(go())


@needs_shared
def test_a_new_policy_kind_is_watched_without_restart(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(scenario(CONFORMANCE / "seeds" / "seed-two-paths.yaml"))
            ctl = await c.controller()
            await c.idle(ctl)
            new = {"apiVersion": "late.example.io/v1", "kind": "LatePolicy", "metadata": {"name": "l", "namespace": "default"},
                   "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw-a"},
                            "defaults": {"x": 1}}}
            t0 = time.monotonic()
            await c.seed([new])
            await c.idle(ctl, quiet=0.5, after=t0)
            late = next(o for o in c.objects() if o["kind"] == "LatePolicy")
            assert late["status"]["ancestors"][0]["conditions"][0]["reason"] == "Accepted"
    run(go())


@needs_shared
def test_no_status_subresource_means_no_status_writes_and_no_loop(tmp_path: Path) -> None:
    async def go():
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "plainpolicies.x.io"},
               "spec": {"group": "x.io", "scope": "Namespaced", "names": {"kind": "PlainPolicy", "plural": "plainpolicies"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
        objs = scenario(CONFORMANCE / "seeds" / "seed-two-paths.yaml") + [crd, {
            "apiVersion": "x.io/v1", "kind": "PlainPolicy", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw-a"}, "defaults": {"a": 1}}}]
        async with Cluster(tmp_path) as c:
            await c.seed(objs)
            ctl = await c.controller()
            await c.idle(ctl)
            plain = next(o for o in c.objects() if o["kind"] == "PlainPolicy")
            assert "status" not in plain and plain["metadata"]["generation"] == 1
            assert ctl.model.reconciles <= 2
    run(go())


def test_writers_in_parallel_keep_breadcrumbs_to_the_qps_and_policies_first(tmp_path: Path) -> None:
    async def go():
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            writes: list[tuple[float, bool]] = []  # (when, is a policy's status)
            c.sandbox.store.listeners.append(lambda ev: writes.append((time.monotonic(), ev.group == "policy.acme.io"))
                                             if ev.type == "MODIFIED" and ev.plural != "leases" else None)
            qps = 40.0
            ctl = await c.controller(breadcrumb_qps=qps, write_workers=4)
            await c.idle(ctl, timeout=60)
            crumbs = [t for t, is_policy in writes if not is_policy]
            statuses = [t for t, is_policy in writes if is_policy]
            assert len(crumbs) >= 10 and statuses
            span = crumbs[-1] - crumbs[0]
            assert span >= 0.9 * (len(crumbs) - 1) / qps, f"{len(crumbs)} breadcrumbs in {span:.2f}s beat {qps}/s"
            assert max(statuses) <= crumbs[4], "policy status waits behind breadcrumbs"
    run(go())
