"""The controller's writes as /metrics counts them: each failed API call under what it tried to write."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2 as httpx
import yaml

from kube_harness import Cluster

PARABLE = Path(__file__).resolve().parents[2] / "examples" / "parable"


def parable() -> list[dict]:
    return [d for f in sorted(PARABLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _writes(text: str) -> dict[tuple[str, str], float]:
    """gwpolicy_writes_total by (what, result)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("gwpolicy_writes_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            out[(labels["what"].strip('"'), labels["result"].strip('"'))] = float(line.split()[-1])
    return out


def test_a_failed_annotation_write_is_counted_as_an_annotation_write(tmp_path: Path) -> None:
    """The parable's Services carry only our annotation (no status of ours): their first two
    annotation writes fail with 500, which /metrics must count under what="annotation"."""
    async def go() -> dict[tuple[str, str], float]:
        async with Cluster(tmp_path) as c:
            await c.seed(parable())
            await c.faults(failRequests=[{"code": 500, "times": 2, "verb": "write", "resource": "services",
                                          "fieldManager": "gwpolicy"}])
            ctl = await c.controller()
            await c.idle(ctl)
            services = [o for o in c.objects() if o["kind"] == "Service"]
            assert len(services) == 17 and all("gwpolicy.io/PolicyAffected" in (o["metadata"].get("annotations") or {})
                                               for o in services), "the failed writes were retried"
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ctl.port}") as http:
                return _writes((await http.get("/metrics")).text)

    writes = asyncio.run(go())
    assert writes.get(("annotation", "500")) == 2.0, writes
    assert ("status", "500") not in writes, f"a failed annotation write was counted as a status write: {writes}"
    assert writes.get(("annotation", "ok")) == 19.0, writes  # 17 Services and 2 Namespaces
