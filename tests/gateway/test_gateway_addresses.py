"""Gateway addresses from the pool: one Gateway, one address, even when statuses disagree."""

from __future__ import annotations

from types import SimpleNamespace

from gwpolicy.gateway.dataplane import DataPlaneConfig, gateway_addresses
from gwpolicy.refs import Ref


def _gw(name: str, status_address: str | None) -> SimpleNamespace:
    raw = {"status": {"addresses": [{"type": "IPAddress", "value": status_address}]}} if status_address else {}
    return SimpleNamespace(ref=Ref("gateway.networking.k8s.io", "Gateway", "ns", name), spec={}, raw=raw)


def test_a_status_address_another_gateway_holds_is_not_taken_twice():
    """A Gateway's status can carry an address from an allocation that has moved on (its status was
    written before another Gateway's, each from a different pass; seen against kube-apiserver, whose
    equal creationTimestamps order Gateways by name): the data plane's holder keeps it, the other
    Gateway gets a free one."""
    a, b, c = _gw("a", None), _gw("b", "127.0.23.130"), _gw("c", "127.0.23.130")
    cfg = DataPlaneConfig(address_pool="127.0.23.128/25", addresses={c.ref: "127.0.23.130"})
    got = gateway_addresses([a, b, c], cfg)
    assert got[c.ref] == "127.0.23.130"
    assert len(set(got.values())) == 3, got


def test_two_statuses_with_one_address_give_two_addresses():
    b, c = _gw("b", "127.0.23.130"), _gw("c", "127.0.23.130")
    got = gateway_addresses([b, c], DataPlaneConfig(address_pool="127.0.23.128/25"))
    assert got[b.ref] == "127.0.23.130" and got[c.ref] != "127.0.23.130" and got[c.ref].startswith("127.0.23.")
