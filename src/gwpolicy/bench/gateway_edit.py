"""`python -m gwpolicy.bench.gateway_edit`: how long an edit takes to reach traffic through the
gateway's own reconcile (GatewayController.reconcile with NGINX, in one process, no API server).

On the synthetic cluster of `gwpolicy bench gateway` with the gateway's policy kinds attached
(`bench.gateway_policies`), every GatewayClass ours: the first full pass and NGINX start, then a
policy edit (route-000000's TimeoutPolicy gets an override `readTimeout: 1s`: the first request
NGINX cuts with 504 ends it), a route edit (route-000000 sends to svc-edit: the first answer
from the new backend ends it) and an EndpointSlice edit (svc-edit's slice gains an endpoint, a
third echo server on 127.0.45.2: the first answer from it ends it) and a Service edit (svc-edit's
port renamed, so no slice port matches it: the first 500 ends it), a Secret edit (the listeners'
certificate Secret replaced by a new certificate, as cert-manager renews one: the first TLS
handshake with gw-001's HTTPS listener that shows the new certificate ends it), a Secret no one
reads created (nothing to show: its cost is the reconcile's) and a Gateway edit (gw-001's plain
HTTP listener, which route-000000 and every tenth route are on, gets the hostname
`edited.example.com`, so they all leave it: the first 404 for route-000000 there ends it), each
applied in place; then the
same edits through a full pass (`--full`: the state invalidated first, `nginx -t` before the
reload, as before this path existed). Per edit: the reconcile's steps (CPU and wall), NGINX's CPU
for the reload, wall time from the event to the first request that shows the change. Loopback
only: Gateways in 127.0.44.0/24, backends on 127.0.45.1 and .2, listener ports + --port-offset.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import os
import resource
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gwpolicy.bench import procfs
from gwpolicy.bench.gateway import (
    EDIT_SERVICE,
    ROUTE0,
    ROUTE0_HOST,
    first_request_showing,
    gateway_cluster,
    print_report,
    request,
    route0_server,
    self_signed_cert,
    sizes_of,
    sizes_parser,
    table_head,
    with_edit_backend,
)
from gwpolicy.bench.gateway_policies import gateway_policies, policy_kinds
from gwpolicy.kube.certs import make_ca, make_serving

ADDRESS_POOL = "127.0.44.0/24"
BACKEND = "127.0.45.1"
BACKEND_ADDED = "127.0.45.2"  # the endpoint the EndpointSlice edit adds
EDITS = ("policy_edit", "route_edit", "endpoint_edit", "service_edit", "secret_edit", "unread_secret_edit",
         "listener_hostname_edit")
#: the hostname the Gateway edit gives gw-001's plain HTTP listener (no route's hostname is under it)
EDITED_LISTENER_HOSTNAME = "edited.example.com"
OURS = "gwpolicy.io/gateway-controller"


def peer_fingerprint(server: tuple[str, int], sni: str) -> str | None:
    """SHA-256 of the certificate a fresh TLS handshake is shown (None: no handshake)."""
    import hashlib
    import socket
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(server, timeout=10) as raw, ctx.wrap_socket(raw, server_hostname=sni) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return hashlib.sha256(der).hexdigest() if der else None


def listen_ports(objs: list[dict[str, Any]], port_offset: int) -> list[tuple[str, int]]:
    """Where NGINX will listen: each Gateway's address (the pool's, in Gateway order, as none has
    one of its own here) and its listeners' ports plus the offset."""
    import ipaddress

    hosts = ipaddress.ip_network(ADDRESS_POOL).hosts()
    gateways = sorted((o for o in objs if o["kind"] == "Gateway"), key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
    return [(str(addr), l["port"] + port_offset) for gw, addr in zip(gateways, hosts) for l in gw["spec"]["listeners"]]


def wait_for_free(endpoints: list[tuple[str, int]], limit: float = 30.0) -> None:
    """Wait (at most `limit` s) until NGINX could bind every address:port: a probe binds each as
    NGINX does, with SO_REUSEADDR, so connections of an earlier run in TIME_WAIT do not count and a
    socket still listening there (an NGINX still stopping) does. RuntimeError naming the port if
    one stays taken."""
    import socket

    deadline = time.monotonic() + limit
    for addr, port in endpoints:
        while True:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((addr, port))
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{addr}:{port} stays taken ({e.strerror}): another process listens "
                                           "there; pick another --port-offset") from None
            time.sleep(0.2)


def _cpu_of(pid: int | None) -> float:
    """CPU seconds a live process used so far (the NGINX master parses the configuration on SIGHUP)."""
    return (procfs.cpu_seconds(pid) or 0.0) if pid is not None else 0.0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cluster(routes: int, workdir: Path, echo_a: Any, echo_b: Any) -> list[dict[str, Any]]:
    base = with_edit_backend(list(gateway_cluster(routes, self_signed_cert(workdir), echo={"svc-000000": (echo_a.address, echo_a.port)})),
                             echo_b.address, echo_b.port)
    objs = base + policy_kinds() + gateway_policies(base)
    for o in objs:
        if o["kind"] == "GatewayClass":
            o["spec"]["controllerName"] = OURS
    return objs


def measure(routes: int, workdir: Path, port_offset: int, full: bool) -> dict[str, Any]:
    from gwpolicy.engine.kinds import split_api_version
    from gwpolicy.gateway.controller import DataPlaneDriver, GatewayController, GatewayOptions
    from gwpolicy.gateway.echo import EchoServer
    from gwpolicy.kube.client import Kind

    def kind_of(raw: dict[str, Any]) -> Kind:
        group, version = split_api_version(raw.get("apiVersion", ""))
        return Kind(group, version, raw["kind"], raw["kind"].lower() + "s", bool(raw["metadata"].get("namespace")))

    echo_a = EchoServer("bench-a-x-y", "bench", address=BACKEND).start()
    echo_b = EchoServer("bench-b-x-y", "bench", address=BACKEND).start()
    echo_c = EchoServer("bench-c-x-y", "bench", address=BACKEND_ADDED, port=echo_b.port).start()  # a slice has one port
    state_dir = tempfile.mkdtemp(prefix=f"gwedit{routes}-", dir=workdir)
    opts = GatewayOptions(controller_name=OURS, address_pool=ADDRESS_POOL, port_offset=port_offset,
                          state_dir=state_dir, leader_election=False,
                          # its backends: EndpointSlices it writes, on loopback
                          allow_unmanaged_endpointslices=True, allow_loopback_endpoints=True)
    driver = DataPlaneDriver(opts)
    assert driver.nginx is not None
    builds = [0]  # the controller does not build what no change it took can alter
    build = driver.build

    def counted(analysis: Any, epoch: Any = None, left_out: Any = None) -> tuple[Any, dict[str, bytes]]:
        builds[0] += 1
        return build(analysis, epoch, left_out)

    driver.build = counted  # type: ignore[method-assign]
    driver.nginx.verify_timeout = 300
    c = GatewayController(opts, driver)
    row: dict[str, Any] = {"routes": routes, "load_average": [os.getloadavg()[0]]}
    objs = cluster(routes, workdir, echo_a, echo_b)
    row["objects"] = len(objs)
    wait_for_free(listen_ports(objs, port_offset))

    async def go() -> None:
        for raw in objs:
            await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
        t0, cpu0 = time.perf_counter(), time.process_time()
        await c.reconcile()
        if c.error:
            raise RuntimeError(f"NGINX did not start at {routes} routes: {c.error}")
        row["first_s"], row["first_cpu_s"], row["first_steps"] = time.perf_counter() - t0, time.process_time() - cpu0, c.last_reconcile
        dp, _ = driver.build(c.state.analysis, c.state.epoch)
        server, host = route0_server(dp), ROUTE0_HOST
        if request(server, host) != (200, "bench-a-x-y"):
            raise RuntimeError(f"route-000000 before the edits: {request(server, host)}")

        def edited(kind: str, name: str, fn: Any) -> dict[str, Any]:
            key = next(k for k in c.objects if k[1] == kind and k[3] == name)
            raw = copy.deepcopy(c.objects[key])
            fn(raw)
            raw["metadata"]["generation"] = raw["metadata"].get("generation", 1) + 1
            return raw

        async def edit(label: str, raw: dict[str, Any], shows: Any, event: str = "MODIFIED") -> None:
            if full:
                c.state.invalidate()
            driver.nginx.test_reloads = full  # type: ignore[union-attr]
            passes, built = c.state.full_passes, builds[0]
            nginx_cpu = _cpu_of(driver.nginx.pid)  # type: ignore[union-attr]
            children = _children_cpu()  # `nginx -t`, when it runs
            t0, cpu0 = time.perf_counter(), time.process_time()
            await c.on_event(event, kind_of(raw), copy.deepcopy(raw))
            await c.reconcile()
            applied, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            rebuilt = builds[0] > built
            if c.error:
                raise RuntimeError(f"{label}: NGINX did not take it: {c.error}")
            sent = first_request_showing(shows, t0, 120, label)  # the first request after the reconcile that shows it
            row[label] = {"applied_s": applied, "cpu_s": cpu, "to_traffic_s": sent - t0,
                          "nginx_cpu_s": _cpu_of(driver.nginx.pid) - nginx_cpu,  # type: ignore[union-attr]
                          "nginx_t_cpu_s": _children_cpu() - children,
                          "steps": c.last_reconcile, "in_place": c.state.full_passes == passes,
                          "built": rebuilt,
                          "build_hits": driver.build_cache.hits if rebuilt else 0,
                          "build_misses": driver.build_cache.misses if rebuilt else 0,
                          "render_hits": driver.render_cache.hits if rebuilt else 0,
                          "render_misses": driver.render_cache.misses if rebuilt else 0}
            row["load_average"].append(os.getloadavg()[0])

        def timeout(raw: dict[str, Any]) -> None:
            raw["spec"]["override"] = {"readTimeout": "1s"}

        def backend(raw: dict[str, Any]) -> None:
            for rule in raw["spec"]["rules"]:
                rule["backendRefs"] = [{"group": "", "kind": "Service", "name": EDIT_SERVICE, "port": 8080, "weight": 1}]

        await edit("policy_edit", edited("TimeoutPolicy", f"{ROUTE0}-timeout", timeout),
                   lambda: request(server, host, "/?delay=1500ms")[0] == 504)
        await edit("route_edit", edited("HTTPRoute", ROUTE0, backend),
                   lambda: request(server, host)[1] == "bench-b-x-y")

        def endpoint(raw: dict[str, Any]) -> None:  # a second pod of svc-edit is ready
            raw["endpoints"].append({"addresses": [echo_c.address], "conditions": {"ready": True}})

        await edit("endpoint_edit", edited("EndpointSlice", EDIT_SERVICE, endpoint),
                   lambda: request(server, host)[1] == "bench-c-x-y")
        # both endpoints serve now (NGINX's round robin over the upstream's two servers)
        row["endpoint_edit"]["answered_by"] = sorted({request(server, host)[1] for _ in range(8)})

        def port_name(raw: dict[str, Any]) -> None:  # the slices' port "http" no longer matches: no endpoints
            raw["spec"]["ports"][0]["name"] = "web"

        await edit("service_edit", edited("Service", EDIT_SERVICE, port_name), lambda: request(server, host)[0] == 500)

        https = next((s.address, s.port) for s in dp.servers if s.listener.name == "gw-001" and s.listener.section == "https")
        renewed = make_serving(make_ca("gwpolicy-bench-renewed"), ["*.example.com"])
        renewed_fp = hashlib.sha256(ssl.PEM_cert_to_DER_cert(renewed.cert_pem.decode())).hexdigest()
        if peer_fingerprint(https, host) in (None, renewed_fp):
            raise RuntimeError(f"gw-001's HTTPS listener before the Secret edit: {peer_fingerprint(https, host)}")

        def renew(raw: dict[str, Any]) -> None:  # cert-manager renewing the listeners' certificate
            raw["data"] = {"tls.crt": base64.b64encode(renewed.cert_pem).decode(),
                           "tls.key": base64.b64encode(renewed.key_pem).decode()}

        await edit("secret_edit", edited("Secret", "wildcard-example-com", renew),
                   lambda: peer_fingerprint(https, host) == renewed_fp)
        unread = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                  "metadata": {"name": "nobody-reads-it", "namespace": "infra"},
                  "data": {"tls.crt": base64.b64encode(renewed.cert_pem).decode(),
                           "tls.key": base64.b64encode(renewed.key_pem).decode()}}
        await edit("unread_secret_edit", unread, lambda: True, "ADDED")

        def listener_hostname(raw: dict[str, Any]) -> None:  # the routes on gw-001's http listener leave it
            for listener in raw["spec"]["listeners"]:
                if listener["name"] == "http":
                    listener["hostname"] = EDITED_LISTENER_HOSTNAME

        if request(server, host)[0] != 500:  # the Service edit left route-000000 without endpoints
            raise RuntimeError(f"route-000000 before the Gateway edit: {request(server, host)}")
        await edit("listener_hostname_edit", edited("Gateway", "gw-001", listener_hostname),
                   lambda: request(server, host)[0] == 404)

    try:
        asyncio.run(go())
    finally:
        driver.stop()
        c.nginx_thread.shutdown(wait=True)
        echo_a.stop()
        echo_b.stop()
        echo_c.stop()
    return row


def report(rows: list[dict[str, Any]]) -> str:
    head = ("| routes | path | edit | reconcile (CPU) | analysis | data plane + render | nginx (reload → serving) | NGINX master CPU "
            "| `nginx -t` CPU | edit → traffic | routes / locations rebuilt |")
    lines = table_head(head, "---|")
    for r in rows:
        for label in EDITS:
            e = r[label]
            s = e["steps"]
            rebuilt = f"{e['build_misses']} / {e['render_misses']}" if e.get("built", True) else "not built"
            analysis = next((k for k in s if k.startswith("analysis") and not k.endswith("cpu")), "analysis")
            lines.append(f"| {r['routes']:,} | {'in place' if e['in_place'] else 'full pass'} | {label.rsplit('_', 1)[0].replace('_', ' ')} "
                         f"| {e['applied_s']:.2f} s ({e['cpu_s']:.2f} s) | {s.get(analysis, 0):.3f} s "
                         f"| {s.get('data plane and render', 0):.3f} s | {s.get('nginx', 0):.2f} s | {e['nginx_cpu_s']:.2f} s "
                         f"| {e.get('nginx_t_cpu_s', 0):.2f} s "
                         f"| **{e['to_traffic_s']:.2f} s** | {rebuilt} |")
    lines.append("")
    lines.append("load average (1 min) at start and after each edit: "
                 + "; ".join(f"{r['routes']:,}: " + ", ".join(f"{x:.1f}" for x in r["load_average"]) for r in rows))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = sizes_parser("python -m gwpolicy.bench.gateway_edit", __doc__ or "", "1000,10000", "gwpolicy-bench-edit", 44000)
    p.add_argument("--full", action="store_true", help="also the same edits through a full pass (the path before)")
    args = p.parse_args(argv)
    workdir, sizes = sizes_of(args)
    rows = []
    for n in sizes:
        for full in ((False, True) if args.full else (False,)):
            print(f"gateway edits: {n} routes, {'full pass' if full else 'in place'}...", file=sys.stderr)
            rows.append(measure(n, workdir, args.port_offset, full))
    return print_report(rows, report(rows), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
