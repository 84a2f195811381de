"""The translated mesh conformance cases (tests/data/mesh-conformance, format in its README) as data:
loading, where each request goes, and the placeholders a harness fills in.

The comparisons are those of the gateway cases (tests/gwconformance.py: `compare` for a round trip,
`check_status` for a route's parents); this module only adds what the mesh cases say differently:
a request is sent from inside a client namespace to a Service's cluster IP (or to one instance's
own address), not to a Gateway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

CASES_DIR = Path(__file__).resolve().parent / "data" / "mesh-conformance"
_POD_IP = re.compile(r"\$\{podIP:([a-z0-9-]+)/([a-z0-9-]+)\}")


def load_base() -> dict[str, Any]:
    return yaml.safe_load((CASES_DIR / "base.yaml").read_text())  # type: ignore[no-any-return]


def case_names() -> list[str]:
    return sorted(p.stem for p in CASES_DIR.glob("*.yaml") if p.stem != "base")


def load_case(name: str) -> dict[str, Any]:
    return yaml.safe_load((CASES_DIR / f"{name}.yaml").read_text())  # type: ignore[no-any-return]


def all_requests(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's round trips: its `requests`, and the `weights` check's request."""
    out = list(case.get("requests") or [])
    if case.get("weights"):
        out.append(case["weights"])
    return out


@dataclass(frozen=True)
class Target:
    """Where one request is sent: an address and port inside the client's namespace, and the Host header."""

    client_namespace: str
    address: str
    port: int
    host: str


def substitute(text: str, pod_ips: Mapping[tuple[str, str], Sequence[str]]) -> str:
    """`${podIP:<namespace>/<backend>}` -> the address of that backend's first instance."""
    def one(m: re.Match[str]) -> str:
        key = (m.group(1), m.group(2))
        if not pod_ips.get(key):
            raise KeyError(f"no instance of backend {key[0]}/{key[1]} for {m.group(0)}")
        return pod_ips[key][0]
    return _POD_IP.sub(one, text)


def target(entry: dict[str, Any], cluster_ips: Mapping[tuple[str, str], str],
           pod_ips: Mapping[tuple[str, str], Sequence[str]]) -> Target:
    """Where a `requests` (or `weights`) entry is sent from and to.

    `to: {namespace, service, port}` is the Service's cluster IP and that Service port;
    `to: {namespace, endpointOf, port}` is the address of the backend's first instance and that port."""
    to = entry["to"]
    ns = to["namespace"]
    if "service" in to:
        key = (ns, to["service"])
        if key not in cluster_ips:
            raise KeyError(f"Service {ns}/{to['service']} has no cluster IP")
        address = cluster_ips[key]
    else:
        key = (ns, to["endpointOf"])
        if not pod_ips.get(key):
            raise KeyError(f"no instance of backend {ns}/{to['endpointOf']}")
        address = pod_ips[key][0]
    return Target(entry["from"], address, int(to["port"]), substitute(entry["request"]["host"], pod_ips))


def with_host(entry: dict[str, Any], host: str) -> dict[str, Any]:
    """The entry with its request's Host (placeholders filled) for `gwconformance.compare`, which
    takes an omitted `expectedRequest` to mean the request as sent."""
    out = dict(entry)
    out["request"] = {**entry["request"], "host": host}
    return out
