"""A value NGINX 1.22 cannot read is refused on its own object, before anything is rendered: each of
the freezing objects (tests/freezing.py) leaves a configuration `nginx -t` accepts, serving every
other route, and the object's status names the field. Also each policy field's bounds, the zone
units, and the certificate checks, one by one. Offline: the gateway's controller without NGINX,
then `nginx -t` on what it renders (no traffic; 127.0.53.0/24 is only written)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freezing import Case, base_objects, freezing_objects
from gateway_kit import TEST_ENDPOINTS, have_nginx, key_pair
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policies
from gwpolicy.gateway import policyconf as pc
from gwpolicy.gateway.controller import GatewayController, GatewayOptions, Renderer
from gwpolicy.gateway.policies import values as pv
from gwpolicy.gateway.state import object_key
from helpers import set_dotted
from test_gateway_inplace import kind_of
from test_gateway_policies import policy_manifests
from test_gateway_render import nginx_t

OPTS = GatewayOptions(address_pool="127.0.53.0/24", port_offset=20000, **TEST_ENDPOINTS)
ENDPOINTS = {"tenant-a": ("127.0.53.200", 18081), "tenant-b": ("127.0.53.201", 18082)}
A_CERT = key_pair("a.example")
OTHER = key_pair("other.example")
CASES = freezing_objects(OTHER, A_CERT)


def cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    objs = {object_key(o): o for o in policy_manifests() + base_objects(80, 443, A_CERT, ENDPOINTS)}
    for o in extra:
        objs[object_key(o)] = o  # a Secret replaced, or a new object
    return [dict(o, metadata={"generation": 1, "creationTimestamp": "2024-01-01T00:00:00Z", **o["metadata"]})
            for o in objs.values()]


def controller(objs: list[dict[str, Any]]) -> GatewayController:
    async def go() -> GatewayController:
        c = GatewayController(OPTS)
        for raw in objs:
            await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
        await c.reconcile()
        return c
    return asyncio.run(go())


def condition(c: GatewayController, case: Case) -> dict[str, Any]:
    group = {"HTTPRoute": "gateway.networking.k8s.io", "Gateway": "gateway.networking.k8s.io",
             "BackendTLSPolicy": "gateway.networking.k8s.io"}.get(case.kind, "gwpolicy.io")
    status = c.desired(Ref(group, case.kind, case.namespace, case.object_name))
    assert status is not None, case.name
    if case.section is not None:
        conds = next(l for l in status["listeners"] if l["name"] == case.section)["conditions"]
    else:
        entries = status.get("parents") or status.get("ancestors") or []
        assert entries, (case.name, status)
        conds = entries[0]["conditions"]
    return next(x for x in conds if x["type"] == case.condition)


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_value_nginx_cannot_read_is_refused_on_its_object_and_the_rest_loads(case: Case, tmp_path: Path) -> None:
    c = controller(cluster(*case.objects))
    got = condition(c, case)
    assert (got["status"], got["reason"]) == ("False", case.reason), got
    assert case.says in got["message"], got["message"]
    _, files = Renderer(OPTS).build(c.state.analysis)
    result = nginx_t(tmp_path, files)
    assert result.returncode == 0, result.stderr
    maps = files["maps.conf"].decode()
    assert "b.example" in maps and "a.example" in maps  # tenant-b's route and tenant-a's others are served


def test_the_healthy_cluster_is_all_accepted() -> None:
    c = controller(cluster())
    for name, ns in (("a-route", "tenant-a"), ("b-route", "tenant-b")):
        status = c.desired(Ref("gateway.networking.k8s.io", "HTTPRoute", ns, name))
        assert status is not None
        assert all(x["status"] == "True" for x in status["parents"][0]["conditions"]), status


# ------------------------------------------------------------------------------------ policy bounds

NUMERIC = [(kind, f, info.bounds) for kind, fields in pc.FIELDS.items() for f, info in fields.items()
           if info.bounds is not None]


def _spec(kind: str, fname: str, value: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"requests": 5} if kind == pc.RATELIMIT and fname != "requests" else {}
    if kind == pc.RETRY and fname != "attempts":
        spec["attempts"] = 2
    if kind == pc.UPSTREAM and fname.startswith("keepAlive.") and fname != "keepAlive.connections":
        spec["keepAlive"] = {"connections": 8}
    return set_dotted(spec, fname, value)


def _text(bounds: pv.Bounds, n: int) -> Any:
    if bounds.kind == pv.DURATION:  # a Gateway API duration: at most 5 digits a part
        return "".join(f"{q}{u}" for q, u in ((n // 3_600_000, "h"), (n // 1000 % 3600, "s"), (n % 1000, "ms")) if q) or "0s"
    return n  # bytes and counts as numbers


@pytest.mark.parametrize("kind, fname, bounds", NUMERIC, ids=[f"{k}.{f}" for k, f, _ in NUMERIC])
def test_every_numeric_field_takes_its_range_and_refuses_what_is_outside_naming_it(kind: str, fname: str,
                                                                                   bounds: pv.Bounds) -> None:
    for inside in (bounds.minimum, bounds.maximum):
        assert pc.invalid_message(kind, _spec(kind, fname, _text(bounds, inside))) is None, (fname, inside)
    outside = [bounds.maximum + 1] + ([bounds.minimum - 1] if bounds.minimum > 0 else [])
    for value in outside:
        message = pc.invalid_message(kind, _spec(kind, fname, _text(bounds, value)))
        assert message is not None and fname in message and bounds.describe() in message, (fname, value, message)


def test_zone_sizes_are_written_in_k_and_m_and_gibibytes_become_megabytes() -> None:
    assert policies.rate_zone({"requests": 1, "zoneSize": "1Mi"}).size == "1m"
    assert policies.rate_zone({"requests": 1, "zoneSize": 40000}).size == "40k"  # rounded up to a KiB
    assert pv.zone_size(pv.GIB) == "1024m"
    assert pc.invalid_message(pc.RATELIMIT, {"requests": 1, "zoneSize": "1Gi"}) is not None  # above the cap
    assert "zone u 16m;" in policies.upstream_directives("u", {pc.UPSTREAM: {"zoneSize": "16Mi"}}).lines


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(NUMERIC), st.integers(min_value=0, max_value=2**64), st.sampled_from(["", "k", "m", "g", "Gi", "ms", "h"]))
def test_whatever_a_policy_field_holds_nginx_reads_what_the_translation_accepts(tmp_path_factory: Any, field: Any,
                                                                                number: int, unit: str) -> None:
    kind, fname, bounds = field
    value: Any = f"{number}{unit}" if unit else number
    spec = _spec(kind, fname, value)
    if pc.invalid_message(kind, spec) is not None:
        return  # refused: NGINX never sees it
    lines = (policies.upstream_directives("u_x", {kind: spec}).lines if kind == pc.UPSTREAM
             else policies.location_directives({kind: spec}).lines)
    zones = [] if kind == pc.UPSTREAM else [z.directive for z in policies.location_directives({kind: spec}).zones]
    tmp = tmp_path_factory.mktemp("conf")
    upstream = "\n".join(["upstream u_x {", "    server 127.0.53.9:80;", *(f"    {l}" for l in lines), "}"]) \
        if kind == pc.UPSTREAM else "upstream u_x {\n    server 127.0.53.9:80;\n}"
    location = "" if kind == pc.UPSTREAM else "\n".join(f"            {l}" for l in lines)
    conf = (f"pid ../run/p;\nevents {{}}\nhttp {{\n    {' '.join(zones)}\n    {upstream}\n"
            f"    server {{\n        listen 127.0.53.9:18080;\n        location / {{\n{location}\n"
            f"            proxy_pass http://u_x;\n        }}\n    }}\n}}\n")
    result = nginx_t(tmp, {"nginx.conf": conf.encode()})
    assert result.returncode == 0, (kind, fname, value, result.stderr, conf)


def test_a_client_ca_bundle_that_does_not_parse_leaves_its_listener_unserved_and_says_so() -> None:
    objs = cluster()
    gw = next(o for o in objs if o["kind"] == "Gateway")
    gw["spec"]["tls"] = {"frontend": {"default": {"validation": {"caCertificateRefs": [
        {"group": "", "kind": "ConfigMap", "name": "client-ca"}]}}}}
    objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "client-ca", "namespace": "infra"},
                 "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}})
    c = controller(objs)
    status = c.desired(Ref("gateway.networking.k8s.io", "Gateway", "infra", "shared"))
    assert status is not None
    https = {x["type"]: x for x in next(l for l in status["listeners"] if l["name"] == "https")["conditions"]}
    assert https["ResolvedRefs"]["reason"] == "InvalidCACertificateRef"
    assert "is not a valid X.509 certificate" in https["ResolvedRefs"]["message"]
    assert https["Programmed"]["status"] == "False"
    _, files = Renderer(OPTS).build(c.state.analysis)
    assert "ssl_client_certificate" not in files["servers.conf"].decode()
