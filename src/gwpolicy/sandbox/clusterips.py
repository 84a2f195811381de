"""Cluster IPs of Services, as kube-apiserver's allocator (`--service-cluster-ip-range`) gives them.

A Service of type ClusterIP, NodePort or LoadBalancer that is not headless gets one IPv4 address of
the sandbox's range when it is created (`gwpolicy sandbox --service-cidr`, default
`DEFAULT_SERVICE_CIDR`): the one it asks for in `spec.clusterIP`/`spec.clusterIPs`, when that is in
the range and free, else the lowest free one (kube-apiserver picks a random one; the sandbox's
choice is reproducible). `spec.clusterIPs`, `spec.ipFamilies` and `spec.ipFamilyPolicy` are
written as kube-apiserver writes them for a single-stack IPv4 Service. An address is free again
once its Service is deleted (the set of addresses in use is read from the stored Services).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

#: the range the sandbox allocates from unless told otherwise: kubeadm's default Service range
DEFAULT_SERVICE_CIDR = "10.96.0.0/12"


def parse_range(cidr: str) -> ipaddress.IPv4Network:
    """An IPv4 network of at least 4 addresses (ValueError naming the flag otherwise)."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise ValueError(f"--service-cidr {cidr!r}: {exc}") from None
    if not isinstance(net, ipaddress.IPv4Network) or net.num_addresses < 4:
        raise ValueError(f"--service-cidr {cidr!r}: must be an IPv4 network of at least 4 addresses (/30 or wider)")
    return net


def wants_ip(spec: dict[str, Any]) -> bool:
    """Does a Service with this spec get a cluster IP (not ExternalName, not headless)?"""
    return spec.get("type", "ClusterIP") != "ExternalName" and spec.get("clusterIP") != "None" \
        and "None" not in (spec.get("clusterIPs") or [])


class RangeError(ValueError):
    """The Service asks for an address the range cannot give: the field, its value and the message, in
    kube-apiserver's words."""

    def __init__(self, field: str, value: Any, message: str) -> None:
        super().__init__(message)
        self.field, self.value = field, value


def allocate(spec: dict[str, Any], net: ipaddress.IPv4Network, used: Iterable[str]) -> None:
    """Give `spec` its cluster IP (in place); RangeError when the one it asks for cannot be given."""
    taken = set(used)
    asked = spec.get("clusterIP") or (spec.get("clusterIPs") or [None])[0]
    if asked:
        try:
            ip = ipaddress.ip_address(asked)
        except ValueError:
            return  # the field validation names the malformed address
        if ip not in net:
            raise RangeError("spec.clusterIPs", [asked], f"failed to allocate IP {asked}: the provided network does not "
                             "match the current range")
        if asked in taken:
            raise RangeError("spec.clusterIPs", [asked], f"failed to allocate IP {asked}: provided IP is already allocated")
        chosen = asked
    else:
        chosen = next((str(h) for h in net.hosts() if str(h) not in taken), "")
        if not chosen:
            raise RangeError("spec.clusterIPs", [], f"failed to allocate a serviceIP: range is full ({net})")
    spec["clusterIP"] = chosen
    spec["clusterIPs"] = [chosen]
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")


def in_use(services: Iterable[dict[str, Any]]) -> set[str]:
    """The cluster IPs the stored Services hold."""
    out: set[str] = set()
    for s in services:
        spec = s.get("spec") or {}
        out.update(ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ip != "None")
    return out
