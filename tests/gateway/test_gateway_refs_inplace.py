"""Secret, ConfigMap and ReferenceGrant changes are taken in place and recompute only what reads them.

A listener's certificate Secret swapped for another valid one, for an invalid one, deleted, created
later; a CA bundle (a BackendTLSPolicy's, a Gateway's frontend client-certificate validation's)
changed, made invalid, deleted, created; a Secret or ConfigMap no one reads; a ReferenceGrant (for
cross-namespace backends, for a listener's certificate in another namespace) deleted, created,
narrowed: the gateway's state (gateway/state.py) recomputes only the facts that read them, the
data plane's BuildCache rebuilds only the routes that read them. The property test holds the
result (files byte for byte, status, queued writes) to a gateway that analysed everything afresh,
after any sequence of such edits mixed with the route, policy, Service, EndpointSlice and Gateway
edits of test_gateway_inplace; the example tests count what was rebuilt; one test sends real TLS
handshakes through NGINX on loopback and sees the new certificate after a swap.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import hashlib
import random
import socket
import ssl
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gwconformance as gc
from gateway_kit import TEST_ENDPOINTS, free_port_offset, have_nginx
from gwpolicy.gateway.controller import Renderer
from gwpolicy.gateway.state import key_ref, object_key
from test_gateway_inplace import CHANGES, base_cluster, certificate, change, check, kind_of, run, started, write_queued

GW = "gateway.networking.k8s.io"
LISTENER_SECRET = ("", "Secret", "infra", "wildcard-example-com")
TEAM_SECRET = "team-cert"  # in the shared-auth namespace, for gw-000's listener `team` (by a grant)
REF_CHANGES = ["secret-swap", "secret-invalid", "secret-delete", "secret-create",
               "ca-change", "ca-invalid", "ca-delete", "ca-create",
               "grant-delete", "grant-create", "grant-narrow", "grant-to"]


@functools.lru_cache(maxsize=1)
def other_certificate() -> tuple[bytes, bytes]:
    """A second valid certificate for *.example.com (another key, another serial)."""
    return gc.make_cert(["*.example.com"])


def tls_secret(name: str, ns: str, pair: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": {"name": name, "namespace": ns},
            "data": {"tls.crt": base64.b64encode(pair[0]).decode(), "tls.key": base64.b64encode(pair[1]).decode()}}


def ca_map(name: str, ns: str, pem: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"ca.crt": pem}}


def shared_namespace(objs: list[dict[str, Any]]) -> str:
    return next(o["metadata"]["namespace"] for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "shared-auth")


def refs_cluster(routes: int, seed: int) -> list[dict[str, Any]]:
    """test_gateway_inplace's cluster, plus what reads Secrets, ConfigMaps and grants in more ways:
    gw-001 validates client certificates against ConfigMap infra/client-ca; gw-000 has an HTTPS
    listener `team` whose certificate is a Secret in another namespace, allowed by a ReferenceGrant
    there; every tenth route from the second (in the other namespace) also sends to shared-auth
    and route-000003 mirrors to svc-000000 (both by the grant routes-to-auth, which allows those
    two; the engine's paths have no mirrors, so only the data plane's record of the grants sees a
    grant change for the mirror); and a Secret and a ConfigMap no one reads."""
    objs = [o for o in base_cluster(routes, seed) if o["kind"] != "ReferenceGrant"]
    ns = shared_namespace(objs)
    for o in objs:
        if o["kind"] == "HTTPRoute" and int(o["metadata"]["name"].rsplit("-", 1)[1]) % 10 == 1:
            o["spec"]["rules"][0]["backendRefs"].append({"name": "shared-auth", "namespace": ns, "port": 8080})
        if o["kind"] == "HTTPRoute" and o["metadata"]["name"] == "route-000003":
            o["spec"]["rules"][1]["filters"] = [{"type": "RequestMirror", "requestMirror": {
                "backendRef": {"name": "svc-000000", "namespace": ns, "port": 8080}}}]
        if o["kind"] == "Gateway" and o["metadata"]["name"] == "gw-001":
            o["spec"]["tls"] = {"frontend": {"default": {"validation": {
                "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "client-ca"}]}}}}
        if o["kind"] == "Gateway" and o["metadata"]["name"] == "gw-000":
            o["spec"]["listeners"].append({"name": "team", "port": 8443, "protocol": "HTTPS", "hostname": "team.example.com",
                                           "tls": {"certificateRefs": [{"name": TEAM_SECRET, "namespace": ns}]},
                                           "allowedRoutes": {"namespaces": {"from": "All"}}})
    namespaces = sorted({o["metadata"]["namespace"] for o in objs if o["kind"] == "HTTPRoute"})
    objs += list(grants_of(ns, namespaces).values())
    objs += [ca_map("client-ca", "infra", certificate()[0].decode()),
             tls_secret(TEAM_SECRET, ns, other_certificate()),
             tls_secret("unread", "infra", certificate()),
             ca_map("unread", "infra", certificate()[0].decode())]
    return objs


def grants_of(ns: str, namespaces: list[str]) -> dict[str, dict[str, Any]]:
    """The two grants of refs_cluster in namespace `ns`, as first made (what `grant-create` makes
    again): HTTPRoutes of `namespaces` to Services shared-auth and svc-000000; Gateways of infra to
    Secrets."""
    return {"routes-to-auth": {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant",
                               "metadata": {"name": "routes-to-auth", "namespace": ns},
                               "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": n} for n in namespaces],
                                        "to": [{"group": "", "kind": "Service", "name": "shared-auth"},
                                               {"group": "", "kind": "Service", "name": "svc-000000"}]}},
            "gateways-to-certs": {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant",
                                  "metadata": {"name": "gateways-to-certs", "namespace": ns},
                                  "spec": {"from": [{"group": GW, "kind": "Gateway", "namespace": "infra"}],
                                           "to": [{"group": "", "kind": "Secret"}]}}}


def ref_change(objects: dict[Any, dict[str, Any]], what: str, rnd: random.Random) -> tuple[str, dict[str, Any]] | None:
    """One Secret, ConfigMap or ReferenceGrant edit: the watch event it makes, or None when there is
    nothing to edit. Deleting what is absent or creating what is present is no edit."""
    ns = next(k[2] for k in objects if k[1] == "Service" and k[3] == "shared-auth")
    if what.startswith("secret-"):
        name, sns = rnd.choice([("wildcard-example-com", "infra"), (TEAM_SECRET, ns), ("unread", "infra")])
        key = ("", "Secret", sns, name)
        old = objects.get(key)
        if what == "secret-delete":
            if old is None:
                return None
            objects.pop(key)
            return "DELETED", old
        if what == "secret-create" and old is not None:
            return None
        new = tls_secret(name, sns, rnd.choice([certificate(), other_certificate()]))
        if what == "secret-invalid":
            new["data"] = rnd.choice([{"tls.crt": base64.b64encode(b"not a certificate").decode(), "tls.key": new["data"]["tls.key"]},
                                      {"tls.crt": "%%% not base64", "tls.key": "x"}, {}])
    elif what.startswith("ca-"):
        choices = [("client-ca", "infra"), ("unread", "infra")]
        choices += [(k[3], k[2]) for k in sorted(objects) if k[1] == "ConfigMap" and k[3] == "auth-ca"] * 3  # when it is there
        name, cns = rnd.choice(choices)
        key = ("", "ConfigMap", cns, name)
        old = objects.get(key)
        if what == "ca-delete":
            if old is None:
                return None
            objects.pop(key)
            return "DELETED", old
        if what == "ca-create" and old is not None:
            return None
        pem = rnd.choice([certificate(), other_certificate()])[0].decode()
        if what == "ca-change" and rnd.random() < 0.5:
            pem = certificate()[0].decode() + other_certificate()[0].decode()  # a bundle of two
        new = ca_map(name, cns, pem if what != "ca-invalid" else rnd.choice(["not a certificate", ""]))
    else:
        name = rnd.choice(["routes-to-auth", "routes-to-auth", "gateways-to-certs"])
        key = (GW, "ReferenceGrant", ns, name)
        old = objects.get(key)
        if what == "grant-delete":
            if old is None:
                return None
            objects.pop(key)
            return "DELETED", old
        if what == "grant-create":
            if old is not None:
                return None
            new = grants_of(ns, sorted({k[2] for k in objects if k[1] == "HTTPRoute"} | {ns}))[name]
        else:
            if old is None:
                return None
            new = copy.deepcopy(old)
            if what == "grant-narrow":  # fewer namespaces (or kinds) it admits references from
                frm = new["spec"]["from"]
                if len(frm) > 1:
                    frm.pop(rnd.randrange(len(frm)))
                else:
                    frm[0]["kind"] = rnd.choice(["TLSRoute", "Gateway", "HTTPRoute"])
            else:  # what it admits references to
                new["spec"]["to"] = [rnd.choice([{"group": "", "kind": "Service", "name": "shared-auth"},
                                                 {"group": "", "kind": "Service", "name": "svc-000000"},
                                                 {"group": "", "kind": "Service", "name": "other"},
                                                 {"group": "", "kind": "Secret"}, {"group": "", "kind": "Secret", "name": "nope"}])]
    objects[object_key(new)] = new
    return ("MODIFIED" if old is not None else "ADDED"), new


def any_change(objects: dict[Any, dict[str, Any]], what: str, rnd: random.Random) -> tuple[str, dict[str, Any]] | None:
    return ref_change(objects, what, rnd) if what in REF_CHANGES else change(objects, what, rnd)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routes=st.integers(3, 10), seed=st.integers(1, 4),
       steps=st.lists(st.tuples(st.sampled_from(REF_CHANGES * 3 + CHANGES), st.integers(0, 10**6), st.booleans()),
                      min_size=1, max_size=8))
@example(routes=5, seed=2, steps=[("ca-invalid", 0, False)])  # the BackendTLSPolicy's CA bundle (its conditions read it)
def test_ref_edits_in_place_render_what_a_full_pass_does(routes: int, seed: int, steps: list[tuple[str, int, bool]]) -> None:
    run(routes, seed, steps, any_change, refs_cluster)


# ---------------------------------------------------------------------------------------------
# what each edit rebuilds


async def edit_in_place(c: Any, renderer: Renderer, objects: dict[Any, dict[str, Any]], event: str,
                        raw: dict[str, Any], epoch_kept: bool = True) -> tuple[dict[str, bytes], tuple[int, int]]:
    """One watch event applied and reconciled off the full pass, the facts object kept (and `epoch`,
    unless told); status written, the data plane built again; the files and (routes rebuilt,
    routes reused), once checked against a full pass."""
    epoch, facts = c.state.epoch, c.state.facts
    if event == "DELETED":
        objects.pop(object_key(raw))
    else:
        objects[object_key(raw)] = raw
    await c.on_event(event, kind_of(raw), copy.deepcopy(raw))
    await c.reconcile()
    assert c.state.full_passes == 1, c.state.last_fallback
    assert c.state.facts is facts
    assert (c.state.epoch == epoch) is epoch_kept
    write_queued(c)
    _, files = renderer.build(c.state.analysis, c.state.epoch)
    counts = renderer.build_cache.misses, renderer.build_cache.hits
    await check(c, renderer)
    return files, counts


def status_of(c: Any, key: tuple[str, str, str, str]) -> dict[str, Any]:
    return c.desired(key_ref(key)) or {}


def listener_condition(c: Any, gw: str, listener: str, type_: str) -> dict[str, Any]:
    st_ = status_of(c, (GW, "Gateway", "infra", gw))
    l = next(x for x in st_["listeners"] if x["name"] == listener)
    return next(x for x in l["conditions"] if x["type"] == type_)


def test_a_certificate_swap_rebuilds_no_route_and_serves_the_new_file() -> None:
    """The listener certificate every Gateway's HTTPS listeners use (cert-manager renewing it) is
    swapped for another valid one: no route is rebuilt, the PEM file holds the new certificate.
    A Secret no one reads, created and changed: nothing rebuilt, the files the same bytes."""
    async def go() -> None:
        objects = {object_key(o): o for o in refs_cluster(40, 1)}
        c, renderer = await started(objects)
        files, counts = await edit_in_place(c, renderer, objects, "MODIFIED", tls_secret("wildcard-example-com", "infra", other_certificate()))
        assert counts == (0, 40)
        assert files["secrets/infra_wildcard-example-com.pem"].startswith(other_certificate()[0].rstrip(b"\n"))
        for unread in (tls_secret("nobody", "infra", certificate()), tls_secret("nobody", "infra", other_certificate())):
            before = files
            files, counts = await edit_in_place(c, renderer, objects, "MODIFIED" if object_key(unread) in objects else "ADDED", unread)
            assert counts == (0, 40) and files == before
        assert c.state.in_place == 3
    asyncio.run(go())


def test_an_invalid_or_deleted_certificate_unserves_the_listener_and_comes_back() -> None:
    """The certificate made invalid: every HTTPS listener naming it says ResolvedRefs=False
    (InvalidCertificateRef) and is not served: the routes attached to those listeners are rebuilt
    (here all), a listener no route uses losing its certificate rebuilds none; deleted, then created
    again: served again, as a full pass says after each."""
    async def go() -> None:
        objects = {object_key(o): o for o in refs_cluster(40, 2)}
        c, renderer = await started(objects)
        bad = tls_secret("wildcard-example-com", "infra", certificate())
        bad["data"]["tls.crt"] = base64.b64encode(b"garbage").decode()
        files, counts = await edit_in_place(c, renderer, objects, "MODIFIED", bad)
        assert listener_condition(c, "gw-001", "https", "ResolvedRefs")["reason"] == "InvalidCertificateRef"
        assert "secrets/infra_wildcard-example-com.pem" not in files
        assert counts == (40, 0)  # every route of the cluster is attached to an `https` listener
        # gw-000's `team` listener (no route attached) loses its certificate in another namespace: nothing rebuilt
        ns = next(k[2] for k in objects if k[1] == "Service" and k[3] == "shared-auth")
        _, counts = await edit_in_place(c, renderer, objects, "DELETED", copy.deepcopy(objects[("", "Secret", ns, TEAM_SECRET)]))
        assert counts == (0, 40)
        assert listener_condition(c, "gw-000", "team", "ResolvedRefs")["reason"] == "InvalidCertificateRef"
        _, counts = await edit_in_place(c, renderer, objects, "DELETED", copy.deepcopy(objects[LISTENER_SECRET]))
        assert listener_condition(c, "gw-001", "https", "ResolvedRefs")["status"] == "False"
        files, counts = await edit_in_place(c, renderer, objects, "ADDED", tls_secret("wildcard-example-com", "infra", certificate()))
        assert listener_condition(c, "gw-001", "https", "ResolvedRefs")["status"] == "True"
        assert files["secrets/infra_wildcard-example-com.pem"].startswith(certificate()[0].rstrip(b"\n"))
    asyncio.run(go())


def test_a_backend_ca_bundle_change_rebuilds_the_routes_its_policy_covers() -> None:
    """seed 2: shared-auth's BackendTLSPolicy verifies against ConfigMap auth-ca. A new bundle:
    only the routes sending to shared-auth (every twentieth) are rebuilt and the new bundle is
    the CA file; made invalid: the policy says NoValidCACertificate, those routes answer 500."""
    async def go() -> None:
        objects = {object_key(o): o for o in refs_cluster(40, 2)}
        c, renderer = await started(objects)
        key = next(k for k in objects if k[1] == "ConfigMap" and k[3] == "auth-ca")
        policy = next(k for k in objects if k[1] == "BackendTLSPolicy")
        sharing = sum(1 for k, o in objects.items() if k[1] == "HTTPRoute"
                      and any(b.get("name") == "shared-auth" for r in o["spec"]["rules"] for b in r.get("backendRefs", [])))
        assert sharing == 6
        files, counts = await edit_in_place(c, renderer, objects, "MODIFIED", ca_map("auth-ca", key[2], other_certificate()[0].decode()))
        assert counts == (sharing, 40 - sharing)
        assert any(v.startswith(other_certificate()[0].rstrip(b"\n")) for k, v in files.items() if k.startswith("tls/ca-"))
        _, counts = await edit_in_place(c, renderer, objects, "MODIFIED", ca_map("auth-ca", key[2], "no pem here"))
        assert counts == (sharing, 40 - sharing)
        assert "NoValidCACertificate" in str(status_of(c, policy))
        _, counts = await edit_in_place(c, renderer, objects, "MODIFIED", ca_map("unread", "infra", "still nothing anyone reads"))
        assert counts == (0, 40)
    asyncio.run(go())


def test_a_client_ca_made_invalid_unaccepts_the_listeners_in_place() -> None:
    """gw-001's frontend validation CA made invalid: its HTTPS listeners are not accepted
    (NoValidCACertificate), the routes attached there lose them; in place (a new `epoch`, as for
    a Gateway edit), and back when the CA is valid again."""
    async def go() -> None:
        objects = {object_key(o): o for o in refs_cluster(12, 3)}
        c, renderer = await started(objects)
        _, counts = await edit_in_place(c, renderer, objects, "MODIFIED", ca_map("client-ca", "infra", "nothing"), epoch_kept=False)
        assert listener_condition(c, "gw-001", "https", "Accepted")["reason"] == "NoValidCACertificate"
        _, counts = await edit_in_place(c, renderer, objects, "MODIFIED", ca_map("client-ca", "infra", other_certificate()[0].decode()),
                            epoch_kept=False)
        assert listener_condition(c, "gw-001", "https", "Accepted")["status"] == "True"
        # a new valid bundle for a listener that stays accepted: only the CA file changes
        files, counts = await edit_in_place(c, renderer, objects, "MODIFIED", ca_map("client-ca", "infra", certificate()[0].decode()))
        assert counts == (0, 12)
        assert any(k.startswith("tls/clientca_infra_gw_001") and v.startswith(certificate()[0].rstrip(b"\n")) for k, v in files.items())
    asyncio.run(go())


def test_a_grant_change_rebuilds_only_the_routes_it_can_cover() -> None:
    """routes-to-auth deleted: the four routes sending to shared-auth from another namespace say
    RefNotPermitted and only they and route-000003, whose mirror goes through the grant, are
    rebuilt (not the two in its namespace); created again, they resolve; narrowed to other
    namespaces, the same five. gateways-to-certs deleted: gw-000's `team`
    listener says RefNotPermitted, no route of another listener is rebuilt."""
    async def go() -> None:
        objects = {object_key(o): o for o in refs_cluster(40, 1)}
        c, renderer = await started(objects)
        ns = next(k[2] for k in objects if k[1] == "Service" and k[3] == "shared-auth")
        grant = (GW, "ReferenceGrant", ns, "routes-to-auth")
        _, counts = await edit_in_place(c, renderer, objects, "DELETED", copy.deepcopy(objects[grant]))
        assert counts == (5, 35)
        route = next(k for k, o in objects.items() if k[1] == "HTTPRoute" and k[2] != ns
                     and any(b.get("name") == "shared-auth" for r in o["spec"]["rules"] for b in r.get("backendRefs", [])))
        assert "RefNotPermitted" in str(status_of(c, route))
        namespaces = sorted({k[2] for k in objects if k[1] == "HTTPRoute"})
        _, counts = await edit_in_place(c, renderer, objects, "ADDED", grants_of(ns, namespaces)["routes-to-auth"])
        assert counts == (5, 35)
        assert "RefNotPermitted" not in str(status_of(c, route))
        narrowed = copy.deepcopy(objects[grant])
        narrowed["spec"]["from"] = [f for f in narrowed["spec"]["from"] if f["namespace"] == ns]
        _, counts = await edit_in_place(c, renderer, objects, "MODIFIED", narrowed)
        assert counts == (5, 35) and "RefNotPermitted" in str(status_of(c, route))
        certs = (GW, "ReferenceGrant", ns, "gateways-to-certs")
        _, counts = await edit_in_place(c, renderer, objects, "DELETED", copy.deepcopy(objects[certs]))
        assert listener_condition(c, "gw-000", "team", "ResolvedRefs")["reason"] == "RefNotPermitted"
        assert counts == (0, 40)
    asyncio.run(go())


# ---------------------------------------------------------------------------------------------
# through NGINX

ADDRESS_POOL = "127.0.46.0/24"
OURS = "gwpolicy.io/gateway-controller"


def free_offset() -> int:
    """A port offset at which the listeners' ports are free on the first Gateways' addresses."""
    return free_port_offset(("127.0.46.1", "127.0.46.2"), (80, 443, 8080, 9443))


def peer_fingerprint(address: str, port: int, sni: str) -> str | None:
    """SHA-256 of the certificate a fresh TLS connection is shown (None: no handshake)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((address, port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=sni) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return hashlib.sha256(der).hexdigest() if der else None


def der_fingerprint(pem: bytes) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.decode())).hexdigest()


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
def test_a_replaced_certificate_is_shown_to_new_connections(tmp_path) -> None:
    """20 routes through real NGINX on loopback: the listeners' certificate Secret is replaced
    (a new key and serial, made with `cryptography`); in place, no route rebuilt, and new TLS
    connections to an HTTPS listener are then shown the new certificate. Made invalid, the
    listener is not served (no handshake); valid again, it is. A Secret no one reads, created:
    the data plane is not built at all."""
    from gwpolicy.gateway.controller import DataPlaneDriver, GatewayController, GatewayOptions

    first, second = gc.make_cert(["*.example.com"]), gc.make_cert(["*.example.com"])
    objs = base_cluster(20, 1)
    for i, o in enumerate(objs):
        if o["kind"] == "Secret":
            objs[i] = tls_secret("wildcard-example-com", "infra", first)
    opts = GatewayOptions(controller_name=OURS, address_pool=ADDRESS_POOL, port_offset=free_offset(),
                          state_dir=str(tmp_path / "state"), leader_election=False, **TEST_ENDPOINTS)
    driver = DataPlaneDriver(opts)
    c = GatewayController(opts, driver)

    async def go() -> None:
        for raw in objs:
            await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
        await c.reconcile()
        assert c.error is None, c.error
        dp, _ = driver.build(c.state.analysis, c.state.epoch)
        srv = next(s for s in dp.servers if s.listener.section == "https" and s.socket is None)
        where = (srv.address, srv.port, "route-000001.example.com")
        assert peer_fingerprint(*where) == der_fingerprint(first[0])

        async def secret(raw: dict[str, Any], event: str = "MODIFIED") -> None:
            await c.on_event(event, kind_of(raw), copy.deepcopy(raw))
            await c.reconcile()
            assert c.error is None and c.state.full_passes == 1, (c.error, c.state.last_fallback)

        builds = []
        build = driver.build
        driver.build = lambda *a: builds.append(a) or build(*a)  # type: ignore[method-assign]
        await secret(tls_secret("nobody-reads-it", "infra", second), "ADDED")
        assert builds == []  # a Secret no one names: the data plane is not even built again

        await secret(tls_secret("wildcard-example-com", "infra", second))
        assert (driver.build_cache.misses, driver.build_cache.hits) == (0, 20)
        assert until(lambda: peer_fingerprint(*where) == der_fingerprint(second[0]))
        bad = tls_secret("wildcard-example-com", "infra", second)
        bad["data"]["tls.key"] = base64.b64encode(b"no key").decode()
        await secret(bad)
        assert until(lambda: peer_fingerprint(*where) is None)
        await secret(tls_secret("wildcard-example-com", "infra", first))
        assert until(lambda: peer_fingerprint(*where) == der_fingerprint(first[0]))

    try:
        asyncio.run(go())
    finally:
        driver.stop()
        c.nginx_thread.shutdown(wait=True)


def until(ok: Any, limit: float = 20.0) -> bool:
    """Poll (NGINX's old workers finish their connections after a reload) for at most `limit` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if ok():
            return True
        time.sleep(0.1)
    return False
