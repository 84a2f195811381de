"""A synthetic cluster of N routes: every level of the hierarchy, every policy class and strategy,
cross-namespace attachment and backends, and some conflicts. Deterministic for a given N and seed.

About 3 objects and 330 bytes of YAML per route (20k routes: ~60k objects, ~20 MB).
"""

from __future__ import annotations

import argparse
import random
from typing import Any, Callable, Iterator

GW = "gateway.networking.k8s.io"
P = "policy.example.io"
ROUTES_PER_NAMESPACE = 200
ROUTES_PER_GATEWAY = 1000


def _meta(name: str, ns: str | None, ts: int) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "creationTimestamp": f"2025-01-{1 + ts // 86400 % 28:02d}T"
                         f"{ts // 3600 % 24:02d}:{ts // 60 % 60:02d}:{ts % 60:02d}Z", "generation": 1}
    if ns is not None:
        m["namespace"] = ns
    return m


def _ref(kind: str, name: str, ns: str | None = None, section: str | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"group": "" if kind in ("Namespace", "Service") else GW, "kind": kind, "name": name}
    if ns:
        r["namespace"] = ns
    if section:
        r["sectionName"] = section
    return r


def _policy(kind: str, name: str, ns: str | None, target: dict[str, Any], ts: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{P}/v1", "kind": kind, "metadata": _meta(name, ns, ts), "spec": {"targetRefs": [target], **spec}}


def cluster(routes: int, seed: int = 1) -> Iterator[dict[str, Any]]:
    """Yield the objects of a cluster with `routes` HTTPRoutes."""
    rnd = random.Random(seed)
    namespaces = [f"app-{i:04d}" for i in range(max(2, routes // ROUTES_PER_NAMESPACE))]
    gateways = [f"gw-{i:03d}" for i in range(max(2, routes // ROUTES_PER_GATEWAY))]
    ts = 0
    yield {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"retrypolicies.{P}", "labels": {"gateway.networking.k8s.io/policy": "inherited"}},
           "spec": {"group": P, "scope": "Namespaced", "names": {"kind": "RetryPolicy", "plural": "retrypolicies"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {
                        # every field the policies below use: an API server prunes the others (and status)
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "targetRefs": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                            "defaults": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                         "properties": {"headers": {"type": "object", "additionalProperties": {"type": "string"}}}},
                            "overrides": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                          "properties": {"headers": {"type": "object", "additionalProperties": {"type": "string"}}}},
                        }}, "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}
    yield {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": {"name": f"timeoutpolicies.{P}"},
           "spec": {"group": P, "kind": "TimeoutPolicy", "attachment": "Inherited",
                    "fieldMappings": [{"setting": "request", "targetKind": {"group": GW, "kind": "HTTPRoute"},
                                       "field": "spec.timeouts.request"}]}}
    yield {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": {"name": f"healthcheckpolicies.{P}"},
           "spec": {"group": P, "kind": "HealthCheckPolicy", "mergeStrategy": "None", "targetKinds": [{"group": "", "kind": "Service"}]}}
    yield {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": {"name": f"headerpolicies.{P}"},
           "spec": {"group": P, "kind": "HeaderPolicy", "mergeStrategy": "Patch"}}
    for cls in ("public", "internal"):
        yield {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": _meta(cls, None, 0),
               "spec": {"controllerName": "example.io/gateway"}}
        yield _policy("ClusterTimeoutPolicy", f"{cls}-class", None, _ref("GatewayClass", cls), 1,
                      defaults={"request": "60s", "idle": "300s"})
    yield {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta("infra", None, 0)}
    for i, ns in enumerate(namespaces):
        yield {"apiVersion": "v1", "kind": "Namespace", "metadata": {**_meta(ns, None, 0), "labels": {"tier": "web" if i % 2 else "api"}}}
        ts += 1
        yield _policy("RetryPolicy", "namespace-retries", ns, _ref("Namespace", ns), ts,
                      defaults={"maxRetries": 2, "backoff": {"base": "25ms", "max": "1s"}},
                      **({"overrides": {"maxRetries": 1}} if i % 5 == 0 else {}))
    for i, gw in enumerate(gateways):
        yield {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": _meta(gw, "infra", 0), "spec": {
            "gatewayClassName": "public" if i % 3 else "internal",
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                 "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "api", "port": 8080, "protocol": "HTTP", "allowedRoutes": {
                    "namespaces": {"from": "Selector", "selector": {"matchLabels": {"tier": "api"}}}}},
            ]}}
        ts += 1
        yield _policy("TimeoutPolicy", f"{gw}-timeouts", "infra", _ref("Gateway", gw), ts,
                      defaults={"request": "30s", "idle": "120s"}, overrides={"connect": "5s"})
        yield _policy("TimeoutPolicy", f"{gw}-https", "infra", _ref("Gateway", gw, section="https"), ts,
                      defaults={"idle": "600s"})
        yield _policy("RetryPolicy", f"{gw}-retries", "infra", _ref("Gateway", gw), ts,
                      defaults={"maxRetries": 3, "retryOn": ["reset", "connect-failure"], "headers": {"x-gw": gw}})
        yield _policy("HeaderPolicy", f"{gw}-headers", "infra", _ref("Gateway", gw), ts,
                      defaults={"request": {"x-env": "prod", "x-gateway": gw}})
    for r in range(routes):
        ns = namespaces[r % len(namespaces)]
        name = f"route-{r:06d}"
        parents = [{"group": GW, "kind": "Gateway", "name": gateways[r % len(gateways)], "namespace": "infra",
                    "sectionName": "https"}]
        if r % 5 == 0:  # also on another Gateway's plain HTTP listener
            parents.append({"group": GW, "kind": "Gateway", "name": gateways[(r + 1) % len(gateways)],
                            "namespace": "infra", "sectionName": "http"})
        svc = f"svc-{r:06d}"
        backends = [{"name": svc, "port": 8080}]
        if r % 20 == 0:  # a shared backend in another namespace, allowed by a ReferenceGrant
            backends.append({"name": "shared-auth", "namespace": namespaces[0], "port": 8080})
        rules = [{"name": "api", "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": backends},
                 {"name": "web", "backendRefs": [{"name": svc, "port": 8080}]}]
        spec: dict[str, Any] = {"parentRefs": parents, "hostnames": [f"{name}.example.com"], "rules": rules}
        if r % 7 == 0:
            spec["timeouts"] = {"request": "15s"}
        yield {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": _meta(name, ns, 0), "spec": spec}
        yield {"apiVersion": "v1", "kind": "Service", "metadata": _meta(svc, ns, 0),
               "spec": {"ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}]}}
        ts += 1
        roll = rnd.random()
        if roll < 0.2:
            yield _policy("RetryPolicy", f"{name}-retries", ns, _ref("HTTPRoute", name), ts,
                          defaults={"maxRetries": rnd.choice([3, 4, 5]), "retryOn": ["5xx"]})
            if roll < 0.01:  # a newer policy on the same route that disagrees: Conflicted
                yield _policy("RetryPolicy", f"{name}-retries-2", ns, _ref("HTTPRoute", name), ts + 1,
                              defaults={"maxRetries": 9})
        elif roll < 0.25:
            yield _policy("TimeoutPolicy", f"{name}-api", ns, _ref("HTTPRoute", name, section="api"), ts,
                          overrides={"request": "5s"})
        elif roll < 0.35:
            yield _policy("HealthCheckPolicy", f"{svc}-health", ns, _ref("Service", svc), ts,
                          path="/healthz", intervalSeconds=10)
        elif roll < 0.40:
            yield _policy("HeaderPolicy", f"{name}-headers", ns, _ref("HTTPRoute", name), ts,
                          defaults={"request": {"x-env": None, "x-route": name}})
    yield {"apiVersion": "v1", "kind": "Service", "metadata": _meta("shared-auth", namespaces[0], 0),
           "spec": {"ports": [{"name": "http", "port": 8080}]}}
    yield {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": _meta("routes-to-auth", namespaces[0], 0),
           "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": ns} for ns in namespaces],
                    "to": [{"group": "", "kind": "Service", "name": "shared-auth"}]}}
    yield {"apiVersion": f"{GW}/v1", "kind": "BackendTLSPolicy", "metadata": _meta("shared-auth-tls", namespaces[0], 1),
           "spec": {"targetRefs": [_ref("Service", "shared-auth")],
                    "validation": {"hostname": "auth.example.com", "wellKnownCACertificates": "System"}}}


def write_yaml(routes: int, path: str, seed: int = 1) -> int:
    """Write the cluster as one multi-document YAML file; returns the number of objects."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    objs = list(cluster(routes, seed))
    with open(path, "w", encoding="utf-8") as fh:
        yaml.dump_all(objs, fh, Dumper=dumper, sort_keys=False, default_flow_style=False)
    return len(objs)


def route_counts(text: str) -> list[int]:
    """`--sizes 1000,10000`: route counts, comma-separated; empty for none."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a route count (want numbers such as 1000,10000)") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n}: a route count must be at least 1")
        counts.append(n)
    return counts


def at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n}: must be at least {low}")
        return n
    return parse
