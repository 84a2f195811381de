"""Property: for random policy placements, each path's rendered NGINX settings equal what the
engine's effective policy for that exact path gives (per listener, route, rule and backend)."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policies
from gwpolicy.gateway import policyconf as pc
from test_gateway_policies import policy_manifests

dataplane = pytest.importorskip("gwpolicy.gateway.dataplane")
render_mod = pytest.importorskip("gwpolicy.gateway.render")

GW = "gateway.networking.k8s.io"
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if not os.environ.get("POL_NO_SHRINK") else [])
NS = "p"
LISTENERS = ("l80", "l81")
SERVICES = ("s0", "s1")
POLICY_LINE = re.compile(r"^\s*(proxy_connect_timeout|proxy_read_timeout|proxy_next_upstream_tries|"
                         r"proxy_next_upstream|client_max_body_size) ")


def _meta(name: str, ts: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "creationTimestamp": f"2025-01-01T00:00:{ts:02d}Z", "generation": 1, **extra}


@st.composite
def placements(draw: st.DrawFn) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "c"},
         "spec": {"controllerName": dataplane.DEFAULT_CONTROLLER_NAME}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": _meta("gw", 0),
         "spec": {"gatewayClassName": "c", "listeners": [{"name": n, "port": 80 + i, "protocol": "HTTP"}
                                                         for i, n in enumerate(LISTENERS)]}}]
    for i, s in enumerate(SERVICES):
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta(s, 0),
                     "spec": {"ports": [{"name": "http", "port": 8080}]}})
        objs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": _meta(f"{s}-x", 0, labels={"kubernetes.io/service-name": s}),
                     "addressType": "IPv4", "ports": [{"name": "http", "port": 9000 + i}],
                     "endpoints": [{"addresses": [f"127.0.39.{i + 1}"]}]})
    targets: list[dict[str, Any]] = [{"group": GW, "kind": "Gateway", "name": "gw"}]
    targets += [{"group": GW, "kind": "Gateway", "name": "gw", "sectionName": n} for n in LISTENERS]
    targets += [{"group": "", "kind": "Service", "name": s, **sec} for s in SERVICES for sec in ({}, {"sectionName": "http"})]
    for r in range(draw(st.integers(1, 3))):
        parents = [{"name": "gw", **({"sectionName": n} if n else {})}
                   for n in draw(st.lists(st.sampled_from([None, *LISTENERS]), min_size=1, max_size=2, unique=True))]
        rules = [{"name": f"r{k}", "matches": [{"path": {"type": "PathPrefix", "value": f"/route{r}/rule{k}"}}],
                  "backendRefs": [{"name": draw(st.sampled_from(SERVICES)), "port": 8080}]}
                 for k in range(draw(st.integers(1, 2)))]
        objs.append({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": _meta(f"route{r}", 0),
                     "spec": {"parentRefs": parents, "rules": rules}})
        targets.append({"group": GW, "kind": "HTTPRoute", "name": f"route{r}"})
        targets += [{"group": GW, "kind": "HTTPRoute", "name": f"route{r}", "sectionName": rl["name"]} for rl in rules]
    values = {"TimeoutPolicy": st.fixed_dictionaries({}, optional={"connectionTimeout": st.integers(1, 9),
                                                                  "readTimeout": st.sampled_from([1, 2, "500ms", "3s"])}),
              "RetryPolicy": st.fixed_dictionaries({"attempts": st.integers(1, 4)}),
              "ClientSettingsPolicy": st.fixed_dictionaries({"body": st.fixed_dictionaries({"maxSize": st.sampled_from(["1k", "2m"])})})}
    for i in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(sorted(values)))
        target = draw(st.sampled_from(targets))
        if kind == "ClientSettingsPolicy" and target["kind"] == "Service":
            continue  # ClientSettingsPolicy does not target Services
        stanzas = draw(st.lists(st.sampled_from(["default", "override"]), min_size=1, max_size=2, unique=True))
        objs.append({"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": _meta(f"p{i}", 1 + i),
                     "spec": {"targetRef": target, **{s: draw(values[kind]) for s in stanzas}}})
    return objs


def _rendered(servers_conf: str) -> dict[tuple[str, str, int], set[str]]:
    """(listener, route name, rule index) -> its policy directive lines, read back from servers.conf
    (a location's own lines plus those of the internal location it hands the request to)."""
    own: dict[tuple[str, str, int], set[str]] = {}
    jumps: dict[tuple[str, str, int], set[str]] = {}
    named: dict[str, set[str]] = {}
    listener = None
    current: tuple[str, str, int] | None = None
    block: str | None = None  # the location being read: "route" or an internal location
    for line in servers_conf.splitlines():
        text = line.strip()
        m = re.match(r"# Gateway \S+ listener (\S+)", text)
        if m:
            listener = m.group(1)
            continue
        m = re.match(r"location (?:= )?(@\S+|/_gw_\S+) \{", text)
        if m:
            block, current = m.group(1), None
            named.setdefault(block, set())
            continue
        if text.startswith("location "):
            block, current = "route", None
            continue
        m = re.match(r"# HTTPRoute [^/]+/(\S+) rule (\d+) match \d+", text)
        if m and listener and block == "route":
            current = (listener, m.group(1), int(m.group(2)))
            own.setdefault(current, set())
            jumps.setdefault(current, set())
            continue
        if text == "}":
            block, current = None, None
            continue
        m = re.match(r"(?:error_page \d+ =|rewrite \^) (@\S+|/_gw_\S+?)(?: last)?;", text)
        if m and current is not None:
            jumps[current].add(m.group(1))
        if POLICY_LINE.match(text):
            if current is not None:
                own[current].add(text)
            elif block and block.startswith(("@", "/_gw_")):
                named[block].add(text)
    return {k: own[k].union(*(named.get(j, set()) for j in jumps[k])) for k in own}


def _expected(a: Any) -> dict[tuple[str, str, int], set[str]]:
    """What the engine's effective policy on each backend path gives, translated."""
    out: dict[tuple[str, str, int], set[str]] = {}
    routes = {o.name: o for o in a.index.of_kind(GW, "HTTPRoute")}
    for r in routes.values():  # every (listener, route, rule) is programmed, with or without policy
        for parent in r.spec["parentRefs"]:
            for listener in ([parent["sectionName"]] if "sectionName" in parent else LISTENERS):
                for k in range(len(r.spec["rules"])):
                    out[(listener, r.name, k)] = set()
    for target, per_path in a._effective_by_target().items():
        if target.kind != "Service" or target.section != "http":
            continue
        for node, pairs in per_path.items():
            levels = list(node.levels)
            listener = next((l.section for l in levels if l.kind == "Gateway" and l.section), None)
            route = next((l for l in levels if l.kind == "HTTPRoute"), None)
            if listener is None or route is None:
                continue
            rule_names = [r["name"] for r in routes[route.name].spec["rules"]]
            rule = next((l.section for l in levels if l.kind == "HTTPRoute" and l.section), None)
            eff = {k.kind: res.spec for k, res in pairs if k.group == pc.GROUP}
            lines = {l for l in policies.location_directives(eff).lines if POLICY_LINE.match(l)}
            for k, name in enumerate(rule_names):
                if rule is None or rule == name:
                    if routes[route.name].spec["rules"][k]["backendRefs"][0]["name"] == target.name:
                        out.setdefault((listener, route.name, k), set()).update(lines)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=PHASES)
@given(placements())
def test_each_paths_nginx_settings_equal_the_engines_effective_policy(objs: list[dict[str, Any]]) -> None:
    a = analyse(policy_manifests() + objs, now="2026-01-01T00:00:00Z", kind_checks=pc.kind_checks())
    dp = dataplane.build_dataplane(a, dataplane.DataPlaneConfig(**TEST_ENDPOINTS, addresses={Ref(GW, "Gateway", NS, "gw"): "127.0.39.100"}))
    files = render_mod.render(dp)
    rendered = _rendered(files["servers.conf"].decode())
    expected = _expected(a)
    assert rendered.keys() == expected.keys()
    for key in expected:
        assert rendered[key] == expected[key], key
