"""`python -m gwpolicy.bench.gateway_edit` on a small cluster, through real NGINX on loopback
(127.0.44.0/24, backends on 127.0.45.1 and .2): the policy, route, EndpointSlice and Service
edits reach traffic (the EndpointSlice's: requests then reach the endpoint it added), in place,
rebuilding one route of 20; the listener certificate's Secret renewed reaches new TLS handshakes
rebuilding none, a Secret no one reads builds nothing, a listener's new hostname rebuilds exactly
the routes that were on it; through the full pass, everything."""

from __future__ import annotations

import pytest

from gateway_kit import free_port_offset, have_nginx
from gwpolicy.bench import gateway_edit
from gwpolicy.bench.gateway import gateway_cluster

pytestmark = pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")


def free_offset() -> int:
    """A port offset at which the listeners' ports (80, 443, 8080) are free on the Gateways' addresses."""
    return free_port_offset(("127.0.44.1", "127.0.44.2"), (80, 443, 8080))


def routes_on_gw001_http(routes: int) -> int:
    """How many routes of the cluster are attached to gw-001's plain HTTP listener (the Gateway edit's)."""
    return sum(1 for o in gateway_cluster(routes) if o["kind"] == "HTTPRoute"
               and any(p["name"] == "gw-001" and p.get("sectionName") == "http" for p in o["spec"]["parentRefs"]))


@pytest.mark.parametrize("full", [False, True])
def test_edits_reach_traffic(tmp_path, full: bool) -> None:
    row = gateway_edit.measure(20, tmp_path, free_offset(), full)
    on_listener = routes_on_gw001_http(20)
    assert 1 < on_listener < 20  # route-000000 and at least one more; not all
    for label in gateway_edit.EDITS:
        e = row[label]
        assert e["in_place"] is not full, label
        assert e["to_traffic_s"] < 30
        if full:
            assert e["build_misses"] == 20 and e["build_hits"] == 0
        elif label == "secret_edit":  # the certificate is the listener's: no route is rebuilt
            assert (e["build_misses"], e["build_hits"]) == (0, 20), label
        elif label == "unread_secret_edit":  # a Secret no one names: nothing built at all
            assert not e["built"], label
        elif label == "listener_hostname_edit":  # the routes that leave the listener, and no other
            assert (e["build_misses"], e["build_hits"]) == (on_listener, 20 - on_listener), label
        else:
            assert (e["build_misses"], e["build_hits"]) == (1, 19), label
    assert row["endpoint_edit"]["answered_by"] == ["bench-b-x-y", "bench-c-x-y"]  # the old endpoint and the new
    assert "| 20 |" in gateway_edit.report([row])
