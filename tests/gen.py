"""Hypothesis strategies that build small but tangled clusters: every level, every class and strategy."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

GW = "gateway.networking.k8s.io"
NAMESPACES = ["a", "b"]
TIMES = ["2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z", "2024-01-01T00:00:02Z"]
KEYS = ["retries", "timeout", "window"]


def meta(name: str, ns: str | None = None, ts: str = TIMES[0], **extra: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "creationTimestamp": ts, "generation": 1}
    if ns:
        m["namespace"] = ns
    m.update(extra)
    return m


settings_values = st.one_of(
    st.integers(min_value=0, max_value=1),
    st.sampled_from(["1s", "2s"]),
    st.lists(st.sampled_from(["x", "y"]), max_size=2),
    st.booleans(),
    st.none(),
)
settings = st.recursive(
    st.dictionaries(st.sampled_from(KEYS), settings_values, max_size=3),
    lambda inner: st.dictionaries(st.sampled_from(KEYS), st.one_of(settings_values, inner), max_size=3),
    max_leaves=6,
)


def route_and_service_targets(routes: list[tuple[str, str, Any]],
                              services: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The targetRefs a policy may draw among these routes ((namespace, name, rule names)) and
    Services ((namespace, name), port `http`): each object, and each of its sections."""
    out: list[dict[str, Any]] = []
    for ns, name, rules in routes:
        out.append({"group": GW, "kind": "HTTPRoute", "name": name, "namespace": ns})
        out += [{"group": GW, "kind": "HTTPRoute", "name": name, "namespace": ns, "sectionName": r} for r in rules]
    for ns, name in services:
        out.append({"group": "", "kind": "Service", "name": name, "namespace": ns})
        out.append({"group": "", "kind": "Service", "name": name, "namespace": ns, "sectionName": "http"})
    return out


@st.composite
def cluster(draw: st.DrawFn) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
    ]
    for ns in NAMESPACES:
        objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, labels={"team": ns})})
    for strategy, kind in (("Atomic", "AtomPolicy"), ("Patch", "PatchPolicy"), ("None", "SoloPolicy")):
        if draw(st.booleans()):
            objs.append({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta(kind.lower()),
                         "spec": {"group": "example.io", "kind": kind, "mergeStrategy": strategy,
                                  "statusAncestor": draw(st.sampled_from(["Target", "Gateway"]))}})
    gateways = []
    for i in range(draw(st.integers(1, 2))):
        ns = draw(st.sampled_from(NAMESPACES))
        listeners = [{"name": "http", "port": 80, "protocol": "HTTP",
                      "allowedRoutes": {"namespaces": {"from": draw(st.sampled_from(["Same", "All"]))}}}]
        if draw(st.booleans()):
            listeners.append({"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                              "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "b"}}}}})
        gateways.append((ns, f"gw{i}", tuple(l["name"] for l in listeners)))
        objs.append({"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(f"gw{i}", ns),
                     "spec": {"gatewayClassName": "cls", "listeners": listeners}})
    services = []
    for i in range(draw(st.integers(0, 2))):
        ns = draw(st.sampled_from(NAMESPACES))
        services.append((ns, f"svc{i}"))
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": meta(f"svc{i}", ns),
                     "spec": {"ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 9000}]}})
    routes = []
    for i in range(draw(st.integers(0, 3))):
        ns = draw(st.sampled_from(NAMESPACES))
        parents = [{"group": GW, "kind": "Gateway", "name": g[1], "namespace": g[0]}
                   for g in draw(st.lists(st.sampled_from(gateways), max_size=2, unique=True))]
        rules = []
        for r in range(draw(st.integers(1, 2))):
            rule: dict[str, Any] = {}
            if draw(st.booleans()):
                rule["name"] = f"rule{r}"
            if services:
                svc = draw(st.sampled_from(services))
                rule["backendRefs"] = [{"name": svc[1], "namespace": svc[0], "port": draw(st.sampled_from([80, 9000]))}]
            rules.append(rule)
        spec: dict[str, Any] = {"parentRefs": parents, "rules": rules}
        if draw(st.booleans()):
            spec["hostnames"] = [draw(st.sampled_from(["a.example.com", "other.org"]))]
        routes.append((ns, f"r{i}", tuple(r["name"] for r in rules if "name" in r)))
        objs.append({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta(f"r{i}", ns), "spec": spec})
    if draw(st.booleans()):
        objs.append({"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta("grant", "a"),
                     "spec": {"from": [{"group": "example.io", "kind": "FieldPolicy", "namespace": "b"}],
                              "to": [{"group": GW, "kind": "Gateway"}]}})
    targets: list[dict[str, Any]] = [{"group": GW, "kind": "GatewayClass", "name": "cls"}]
    targets += [{"group": "", "kind": "Namespace", "name": ns} for ns in NAMESPACES]
    for ns, name, listeners in gateways:
        targets.append({"group": GW, "kind": "Gateway", "name": name, "namespace": ns})
        targets += [{"group": GW, "kind": "Gateway", "name": name, "namespace": ns, "sectionName": l} for l in listeners + ("nosuch",)]
    targets += route_and_service_targets(routes, services)
    targets.append({"group": GW, "kind": "HTTPRoute", "name": "missing"})
    for i in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["FieldPolicy"] * 4 + ["DirectPolicy", "AtomPolicy", "PatchPolicy", "SoloPolicy"]))
        ns = draw(st.sampled_from(["a", "a", "a", "b", None]))
        common = [t for t in targets if t["kind"] in ("Gateway", "HTTPRoute") and "sectionName" not in t][:2] or targets
        choice = st.one_of(st.sampled_from(common), st.sampled_from(targets))
        spec = {"targetRefs": draw(st.lists(choice, min_size=1, max_size=2))}
        shape = draw(st.sampled_from(["defaults", "overrides", "both", "direct"]))
        if shape in ("defaults", "both"):
            spec["defaults"] = draw(settings)
        if shape in ("overrides", "both"):
            spec["overrides"] = draw(settings)
        if shape == "direct":
            spec.update(draw(settings))
        objs.append({"apiVersion": "example.io/v1", "kind": kind,
                     "metadata": meta(f"p{i}", ns, draw(st.sampled_from(TIMES))), "spec": spec})
    return objs
