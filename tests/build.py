"""Tiny builders for test manifests, so that each test shows only what it is about."""

from __future__ import annotations

from typing import Any

GW = "gateway.networking.k8s.io"


def meta(name: str, ns: str | None = None, ts: str = "2024-01-01T00:00:00Z", **extra: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "creationTimestamp": ts, "generation": 1}
    if ns:
        m["namespace"] = ns
    m.update(extra)
    return m


def gatewayclass(name: str = "cls") -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta(name), "spec": {"controllerName": "x.io/c"}}


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name, labels=labels)}


def gateway(name: str, ns: str, *listeners: dict[str, Any], cls: str = "cls") -> dict[str, Any]:
    ls = list(listeners) or [{"name": "http", "port": 80, "protocol": "HTTP"}]
    return {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(name, ns),
            "spec": {"gatewayClassName": cls, "listeners": ls}}


def route(name: str, ns: str, parents: list[dict[str, Any]], rules: list[dict[str, Any]] | None = None,
          kind: str = "HTTPRoute", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": kind, "metadata": meta(name, ns),
            "spec": {"parentRefs": parents, "rules": rules if rules is not None else [{}], **spec}}


def parent(name: str, ns: str | None = None, **extra: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"group": GW, "kind": "Gateway", "name": name}
    if ns:
        p["namespace"] = ns
    p.update(extra)
    return p


def service(name: str, ns: str, *ports: tuple[str, int]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns),
            "spec": {"ports": [{"name": n, "port": p} for n, p in ports]}}


def target(kind: str, name: str, ns: str | None = None, section: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"group": "" if kind in ("Namespace", "Service") else GW, "kind": kind, "name": name}
    if ns:
        t["namespace"] = ns
    if section:
        t["sectionName"] = section
    return t


def policy(kind: str, name: str, ns: str | None, targets: dict[str, Any] | list[dict[str, Any]],
           ts: str = "2024-01-01T00:00:01Z", group: str = "example.io", **spec: Any) -> dict[str, Any]:
    t = {"targetRefs": targets} if isinstance(targets, list) else {"targetRef": targets}
    return {"apiVersion": f"{group}/v1", "kind": kind, "metadata": meta(name, ns, ts), "spec": {**t, **spec}}


def policykind(kind: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta(kind.lower()),
            "spec": {"group": "example.io", "kind": kind, **spec}}
