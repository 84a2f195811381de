"""One place decides whether an HTTPS listener's certificate is usable (`status.certificate_secret`,
through `status.listener_verdicts`); the data plane serves the certificate that rule resolved and
refuses nothing status accepts, except for what needs the data plane itself (NGINX's stream module
for TLS, an address:port an older Gateway holds). Before, `dataplane._Builder._certificate` made
every check again by rules of its own, and disagreed on `tls.mode: null` (status: Terminate, the
API's default; the data plane: "mode None is not supported")."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.refs import GATEWAY_GROUP, Ref
from test_gateway_listener_verdicts import GW, KEY, PEM, PEM_TEXT, _cond, _objects, _served, _status, listener

#: the property's Gateways, each listener's tls.mode drawn again with `mode: null` and "" among them
modes = st.sampled_from([None, "Terminate", "Passthrough", "null", "null", ""])
gateway_any_mode = st.fixed_dictionaries({
    "listeners": st.lists(st.tuples(listener, modes).map(lambda t: dict(t[0], mode=t[1])), min_size=1, max_size=5),
    "address": st.sampled_from([None, None, None, "10.0.0.1"]),
})


def _objects_with_modes(gateways: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`_objects`, where a drawn mode "null" is an explicit `mode: null` and "" an empty string."""
    objs = _objects([dict(g, listeners=[dict(l, mode=None if l["mode"] in ("null", "") else l["mode"]) for l in g["listeners"]])
                     for g in gateways])
    for gi, g in enumerate(gateways):
        gw = next(o for o in objs if o["kind"] == "Gateway" and o["metadata"]["name"] == f"g{gi}")
        for spec, drawn in zip(gw["spec"]["listeners"], g["listeners"]):
            if "tls" in spec and drawn["mode"] in ("null", ""):
                spec["tls"]["mode"] = None if drawn["mode"] == "null" else ""
    return objs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gateway_any_mode, min_size=1, max_size=2), st.booleans())
def test_the_data_plane_refuses_no_listener_status_accepts(gateways: list[dict[str, Any]], with_stream: bool) -> None:
    """Every listener status calls Accepted, ResolvedRefs and not Conflicted, of a Gateway it
    accepts, is Programmed and has its server block, unless it is TLS without the stream module or
    its address:port is an older Gateway's (PortUnavailable)."""
    desired, files = _status(_objects_with_modes(gateways), "/usr/lib/nginx/modules/ngx_stream_module.so" if with_stream else None)
    served = _served(files)
    for gi, g in enumerate(gateways):
        status = desired.get(Ref(GATEWAY_GROUP, "Gateway", "a", f"g{gi}"))
        if status is None or _cond(status["conditions"], "Accepted") != "True":
            continue
        for ls in status["listeners"]:
            conds = {c["type"]: c for c in ls["conditions"]}
            if not (conds["Accepted"]["status"] == "True" and conds["ResolvedRefs"]["status"] == "True"
                    and conds["Conflicted"]["status"] == "False"):
                continue
            spec = next(l for l in g["listeners"] if l["name"] == ls["name"])
            if (spec["protocol"] == "TLS" and not with_stream) or "already served" in conds["Programmed"]["message"]:
                assert conds["Programmed"]["status"] == "False"
                continue
            assert conds["Programmed"]["status"] == "True", (ls, spec)
            assert served.get(("a", f"g{gi}", ls["name"])), (ls, spec)


def _https_gateway(tls: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": GW, "kind": "Gateway", "metadata": {"name": "web", "namespace": "a", "generation": 1},
            "spec": {"gatewayClassName": "ours", "listeners": [{"name": "s", "port": 443, "protocol": "HTTPS", "tls": tls}]}}


def test_an_https_listener_with_tls_mode_null_is_served_with_its_certificate() -> None:
    """`mode: null` is the API's default, Terminate, for status and now for NGINX too (before: status
    said Accepted/ResolvedRefs and the data plane refused it, so Programmed=False with
    "tls.mode None is not supported")."""
    objs = _objects([]) + [_https_gateway({"mode": None, "certificateRefs": [{"name": "good"}]})]
    desired, files = _status(objs, None)
    ls = desired[Ref(GATEWAY_GROUP, "Gateway", "a", "web")]["listeners"][0]
    assert _cond(ls["conditions"], "Programmed") == "True", ls["conditions"]
    assert _served(files)[("a", "web", "s")] == [("127.0.1.1:443", '""')]
    assert "ssl_certificate secrets/a_good.pem;" in files["servers.conf"].decode()
    pem = files["secrets/a_good.pem"]
    assert pem.startswith(base64.b64decode(PEM).rstrip(b"\n")) and base64.b64decode(KEY).rstrip(b"\n") in pem


def test_the_served_certificate_is_the_first_ref_status_resolved() -> None:
    """Two refs that both resolve (one `data`, one `stringData`): status resolves both, NGINX serves
    the first one's file, and only that one is written."""
    objs = _objects([]) + [_https_gateway({"certificateRefs": [{"name": "strings"}, {"name": "good"}]})]
    desired, files = _status(objs, None)
    ls = desired[Ref(GATEWAY_GROUP, "Gateway", "a", "web")]["listeners"][0]
    assert _cond(ls["conditions"], "ResolvedRefs") == "True" and _cond(ls["conditions"], "Programmed") == "True"
    assert "ssl_certificate secrets/a_strings.pem;" in files["servers.conf"].decode()
    assert [k for k in files if k.startswith("secrets/")] == ["secrets/a_strings.pem"]
    assert files["secrets/a_strings.pem"].startswith(PEM_TEXT.encode().rstrip(b"\n"))
