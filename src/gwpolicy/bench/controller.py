"""Controller figures, as users run it: a `gwpolicy sandbox` process holding the synthetic cluster
and a `gwpolicy controller` process against it, each measured on its own (the controller's figures
from its /statusz and /metrics, the sandbox's from /proc). This process only edits and waits.

Measured: time to the first complete status and its writes; one policy edit, one route edit and
one namespace-wide policy edit, each with reprocess / settle / the API writes it caused; then a
restart of the controller against the cluster that now carries its status (the full analysis on
objects with status that every restart meets, and the writes it makes: none should be needed)."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx2 as httpx
from prometheus_client.parser import text_string_to_metric_families

from gwpolicy.bench import procfs

QUIET = 0.3  # seconds without an event after which a settled controller counts as idle
MB = 1024 * 1024


def _proc_figures(pid: int) -> dict[str, float]:
    """Peak and current RSS (MB) and CPU seconds of a live process (bench/procfs.py); a figure /proc
    does not give is left out."""
    rss, peak = procfs.memory_mb(pid)
    figures = {"rss_mb": rss, "peak_rss_mb": peak, "cpu_s": procfs.cpu_seconds(pid)}
    return {k: v for k, v in figures.items() if v is not None}


class ControllerProcess:
    """`gwpolicy controller` in a child process; its state read from /statusz, its figures from /metrics."""

    def __init__(self, kubeconfig: str, workdir: str, name: str, breadcrumb_qps: float) -> None:
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "w+", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.timeline: list[tuple[float, int, bool, int, int]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gwpolicy.cli.main", "controller", "--kubeconfig", kubeconfig,
             "--listen", "127.0.0.1:0", "--lease-namespace", "gwpolicy-system", "--identity", name,
             "--breadcrumb-qps", str(breadcrumb_qps)],
            stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        port = self._port(60.0)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def _port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, encoding="utf-8") as fh:
                m = re.search(r"serving health and metrics on port (\d+)", fh.read())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        with open(self.log_path, encoding="utf-8") as fh:
            tail = fh.read()[-2000:]
        raise RuntimeError(f"gwpolicy controller did not start (exit {self.proc.poll()}):\n{tail}")

    def statusz(self) -> dict[str, Any]:
        return self.http.get("/statusz").json()

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics, by name."""
        text = self.http.get("/metrics").text
        return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels}

    def wait_idle(self, timeout: float, poll: float) -> float:
        """Wait until nothing is left to analyse or write and no event came for QUIET seconds; the
        monotonic time it was seen. Every second on the way, a sample of the process's RSS and state
        goes to `timeline` (seconds since start, RSS MB, informers synced, full analyses, writes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gwpolicy controller exited ({self.proc.returncode}); see {self.log_path}")
            st = self.statusz()
            now = time.monotonic()
            if not self.timeline or now - self.started - self.timeline[-1][0] >= 1.0:
                self.timeline.append((round(now - self.started, 1), round(_proc_figures(self.proc.pid).get("rss_mb", 0)),
                                      st["synced"], st["fullAnalyses"], st["writes"]))
            if st["idle"] and st["sinceLastEvent"] > QUIET:
                return now
            time.sleep(poll)
        raise TimeoutError("the controller did not settle")

    def figures(self) -> dict[str, Any]:
        m, st = self.metrics(), self.statusz()
        return {"full_analysis_s": round(st["lastFullAnalysisSeconds"], 2),
                "full_analysis_cpu_s": round(st["lastFullAnalysisCpuSeconds"], 2),
                "full_analyses": st["fullAnalyses"],
                "peak_rss_mb": round(m["gwpolicy_peak_resident_memory_bytes"] / MB),
                "rss_mb": round(m["process_resident_memory_bytes"] / MB),
                "cpu_s": round(m["process_cpu_seconds_total"], 1)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.http.close()
        self.log.close()


def _writes(http: httpx.Client) -> int:
    by = http.get("/sandbox/stats").json()["writesByResource"]
    return sum(n for plural, n in by.items() if plural != "leases")


def _patch(http: httpx.Client, path: str, patch: dict[str, Any]) -> dict[str, Any]:
    r = http.patch(path, params={"fieldManager": "bench"}, json=patch,
                   headers={"Content-Type": "application/merge-patch+json"})
    r.raise_for_status()
    return r.json()


def _edit(ctl: ControllerProcess, http: httpx.Client, path: str, patch: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One edit: until the controller has its event (watch latency), until it is idle again (settle),
    how long its analysis took to take it in (reprocess), and the API writes it caused."""
    before, st = _writes(http), ctl.statusz()
    t = time.monotonic()
    _patch(http, path, patch)
    while True:  # the edit has come back through the watch (when idle, nothing else sends events)
        now = ctl.statusz()
        if now["events"] > st["events"]:
            seen = time.monotonic() - t
            break
        if time.monotonic() - t > timeout:
            raise TimeoutError("the edit never reached the controller")
        time.sleep(0.002)
    idle = ctl.wait_idle(timeout, 0.005)
    after = ctl.statusz()
    incremental = after["incrementalUpdates"] > st["incrementalUpdates"]
    return {"settle_s": round(idle - t - QUIET, 3), "watch_latency_ms": round(1000 * seen, 1),
            "reprocess_ms": round(1000 * (after["lastUpdateSeconds"] if incremental else after["lastFullAnalysisSeconds"]), 1),
            "reprocess_cpu_ms": round(1000 * (after["lastUpdateCpuSeconds"] if incremental
                                              else after["lastFullAnalysisCpuSeconds"]), 1),
            "path": "incremental" if incremental else "full analysis",
            "writes": _writes(http) - before - 1,  # less the edit itself
            "controller_writes": after["writes"] - st["writes"]}


def _route_edit_during_backlog(base_url: str, client: dict[str, Any], url: str, after: float) -> float:
    """Edit a route `after` seconds into the first status; seconds until its new generation is in its status."""
    time.sleep(after)
    with httpx.Client(base_url=base_url, timeout=300, **client) as http:  # a client of its own: this runs in a thread
        t = time.monotonic()
        generation = _patch(http, url, {"spec": {"hostnames": ["during-backlog.example.com"]}})["metadata"]["generation"]
        while True:
            live = http.get(url).json()
            conds = [cd for p in (live.get("status") or {}).get("parents") or [] for cd in p.get("conditions") or []
                     if cd.get("type", "").startswith("gwpolicy.io/")]
            if conds and all(cd.get("observedGeneration") == generation for cd in conds):
                return time.monotonic() - t
            time.sleep(0.05)


def _one(http: httpx.Client, path: str, name: str) -> dict[str, Any]:
    items = http.get(path, params={"fieldSelector": f"metadata.name={name}"}).json()["items"]
    if not items:
        raise RuntimeError(f"the cluster has no {name} under {path}")
    return items[0]


def _targets(http: httpx.Client) -> tuple[str, str, str, str]:
    """What the edits change, read from the sandbox: a route's own RetryPolicy, route-000001, and the
    namespace-wide RetryPolicy of route-000000's namespace."""
    pols = http.get("/apis/policy.example.io/v1/retrypolicies").json()["items"]
    pol = min((p for p in pols if re.fullmatch(r"route-\d+-retries", p["metadata"]["name"])),
              key=lambda p: p["metadata"]["name"])
    base = "/apis/policy.example.io/v1/namespaces"
    route = _one(http, "/apis/gateway.networking.k8s.io/v1/httproutes", "route-000001")
    first_ns = _one(http, "/apis/gateway.networking.k8s.io/v1/httproutes", "route-000000")["metadata"]["namespace"]
    return (f"{base}/{pol['metadata']['namespace']}/retrypolicies/{pol['metadata']['name']}",
            f"/apis/gateway.networking.k8s.io/v1/namespaces/{route['metadata']['namespace']}/httproutes/route-000001",
            f"{base}/{first_ns}/retrypolicies/namespace-retries", first_ns)


def _measure(routes: int, path: str, timeout: float, breadcrumb_qps: float, restart: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        sandbox = subprocess.Popen([sys.executable, "-m", "gwpolicy.cli.main", "sandbox", "--port", "0",
                                    "--kubeconfig-out", kubeconfig, "--keep-creation-timestamp", "--crds", "none", "-f", path],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ctl: ControllerProcess | None = None
        try:
            line = sandbox.stdout.readline()  # type: ignore[union-attr]
            m = re.search(r"https?://127\.0\.0\.1:\d+", line)
            if m is None:
                raise RuntimeError(f"gwpolicy sandbox did not start: {line!r}")
            from gwpolicy.sandbox.server import client_options

            client = client_options(kubeconfig)  # the sandbox answers its token only, over TLS
            http = httpx.Client(base_url=m.group(0), timeout=300, **client)
            loaded = _proc_figures(sandbox.pid)
            http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": "gwpolicy-system"}})
            policy_url, route_url, ns_policy_url, _ = _targets(http)
            writes0 = _writes(http)
            ctl = ControllerProcess(kubeconfig, tmp, "controller-1", breadcrumb_qps)
            out: dict[str, Any] = {"routes": routes, "load_average_start": [round(x, 2) for x in os.getloadavg()]}
            if breadcrumb_qps > 0:  # a route edit a few seconds into the first status, while breadcrumbs queue
                pool = concurrent.futures.ThreadPoolExecutor(1)
                backlog = pool.submit(_route_edit_during_backlog, m.group(0), client, route_url, 5.0)
            idle = ctl.wait_idle(timeout, 0.2)
            out["first_status_s"] = round(idle - ctl.started - QUIET, 2)
            out["initial_writes"] = _writes(http) - writes0
            first = ctl.figures()
            out["timeline"] = ctl.timeline
            out.update({"full_analysis_s": first["full_analysis_s"], "full_analysis_cpu_s": first["full_analysis_cpu_s"]})
            if breadcrumb_qps > 0:
                out["breadcrumb_qps"] = breadcrumb_qps
                out["breadcrumb_calls"] = ctl.statusz()["breadcrumbCalls"]
                out["breadcrumb_budget_s"] = round(out["breadcrumb_calls"] / breadcrumb_qps, 2)
                out["route_edit_during_backlog_s"] = round(backlog.result(), 2)
                pool.shutdown()
            out["policy_edit"] = _edit(ctl, http, policy_url, {"spec": {"defaults": {"maxRetries": 8}}}, timeout)
            out["route_edit"] = _edit(ctl, http, route_url, {"spec": {"hostnames": ["renamed.example.com"]}}, timeout)
            out["namespace_policy_edit"] = _edit(ctl, http, ns_policy_url,
                                                 {"spec": {"defaults": {"backoff": {"max": "2s"}}}}, timeout)
            out["controller"] = ctl.figures()
            ctl.stop()
            ctl = None
            if restart:  # a second controller on objects that carry the first one's status
                writes1 = _writes(http)
                ctl = ControllerProcess(kubeconfig, tmp, "controller-2", breadcrumb_qps)
                idle = ctl.wait_idle(timeout, 0.2)
                out["restart"] = {"settled_s": round(idle - ctl.started - QUIET, 2), "writes": _writes(http) - writes1,
                                  **ctl.figures(), "timeline": ctl.timeline}
                ctl.stop()
                ctl = None
            out["sandbox"] = {"loaded_rss_mb": round(loaded.get("rss_mb", 0)),
                              **{k: round(v, 1) for k, v in _proc_figures(sandbox.pid).items()}}
            out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
            http.close()
            return out
        finally:
            if ctl is not None:
                ctl.stop()
            sandbox.terminate()
            sandbox.wait(30)


def measure_controller(routes: int, workdir: str, timeout: float = 3600, breadcrumb_qps: float = 0.0,
                       restart: bool = True) -> dict[str, Any]:
    """With `breadcrumb_qps` > 0, also the breadcrumb API calls, the time they need at that rate
    (`breadcrumb_budget_s`: the least a first complete status can take), and how long a route edit made
    5 s into the first status waits for its status. With `restart`, a second controller process is
    started once the first has stopped, on the cluster with status."""
    from gwpolicy.bench.generate import write_yaml

    path = os.path.join(workdir, f"cluster-{routes}.yaml")
    if not os.path.exists(path):
        write_yaml(routes, path)
    return _measure(routes, path, timeout, breadcrumb_qps, restart)
