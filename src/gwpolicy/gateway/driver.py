"""The gateway's data plane, as the controller drives it: `Renderer` builds and renders the
configuration (gateway/dataplane.py, render.py), `DataPlaneDriver` also has NGINX validate, load
and verify it (gateway/nginx.py), all on one thread; and the addresses they place Gateways on."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from gwpolicy.engine.refs import Ref
from gwpolicy.gateway.options import GatewayOptions

log = logging.getLogger("gwpolicy.gateway")


class Renderer:
    """Builds and renders the configuration (gateway/dataplane.py, render.py), reusing what the
    previous build made of each route and location while the analysis is updated in place."""

    def __init__(self, opts: GatewayOptions) -> None:
        from gwpolicy.gateway.dataplane import BuildCache
        from gwpolicy.gateway.render import RenderCache

        self.opts = opts
        self.build_cache = BuildCache()
        self.render_cache = RenderCache()
        #: address:port the gateway holds itself -> what (its health endpoint): no listener is put there
        self.reserved: dict[tuple[str, int], str] = {}
        #: this process' health and metrics endpoint (address, port): never an endpoint of a route
        self.own_endpoints: frozenset[tuple[str, int]] = frozenset()

    def config(self, left_out: Any = None) -> Any:
        from gwpolicy.gateway.dataplane import DataPlaneConfig

        kw: dict[str, Any] = {"controller_name": self.opts.controller_name, "port_offset": self.opts.port_offset,
                              "worker_processes": self.opts.worker_processes, "reserved": dict(self.reserved),
                              "allow_unmanaged_endpointslices": self.opts.allow_unmanaged_endpointslices,
                              "allow_loopback_endpoints": self.opts.allow_loopback_endpoints,
                              "own_addresses": pod_addresses(), "own_endpoints": self.own_endpoints,
                              "left_out": dict(left_out or {}), "namespace_budget": self.opts.namespace_budget}
        if self.opts.address_pool:
            kw["address_pool"] = self.opts.address_pool
        if self.opts.pod_addresses:
            kw["addresses"] = EVERY_ADDRESS
            kw["any_address"] = True
        return DataPlaneConfig(**kw)

    def build(self, analysis: Any, epoch: Any = None, left_out: Any = None) -> tuple[Any, dict[str, bytes]]:
        """The data plane and its files; `epoch` (GatewayState.epoch) says whether what the last
        build made of each route may be reused (None: build everything afresh); `left_out`: the
        routes and listeners to leave out (DataPlaneConfig.left_out)."""
        from gwpolicy.gateway.dataplane import build_dataplane
        from gwpolicy.gateway.render import render

        if epoch is None:
            dp = build_dataplane(analysis, self.config(left_out))
            return dp, render(dp)
        if epoch != self.build_cache.epoch:
            self.render_cache.clear()
        dp = build_dataplane(analysis, self.config(left_out), self.build_cache.use(epoch))
        return dp, render(dp, self.render_cache)


class _EveryAddress(Mapping[Ref, str]):
    """DataPlaneConfig.addresses that binds every Gateway on all addresses (0.0.0.0): every
    replica renders the same files whatever its pod's address."""

    def __getitem__(self, ref: Ref) -> str:
        return "0.0.0.0"

    def __contains__(self, ref: object) -> bool:
        return True

    def __iter__(self) -> Iterator[Ref]:
        return iter(())

    def __len__(self) -> int:
        return 0


EVERY_ADDRESS = _EveryAddress()


def spec_addresses(gw: dict[str, Any]) -> list[str]:
    """The values of a Gateway's spec.addresses (IPAddress and Hostname)."""
    spec = gw.get("spec")
    if not isinstance(spec, dict):
        return []
    return [a["value"] for a in spec.get("addresses") or []
            if isinstance(a, dict) and isinstance(a.get("value"), str) and a.get("type", "IPAddress") in ("IPAddress", "Hostname")]


def pod_addresses() -> frozenset[str]:
    """The addresses of the gateway's own pod (the downward API's status.podIPs in POD_IPS, or
    POD_IP), which no route may send to."""
    raw = os.environ.get("POD_IPS") or os.environ.get("POD_IP") or ""
    return frozenset(a.strip() for a in raw.split(",") if a.strip())


def address_order(address: str) -> tuple[int, int | str]:
    import ipaddress

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (2, address)
    return (ip.version, int(ip))


def cannot_listen(address: str, port: int, why: str) -> str:
    if why == "Address already in use":
        why = "another process holds that address and port (Address already in use)"
    elif why == "Permission denied":
        why = "Permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE; see --port-offset)"
    return f"NGINX could not listen on {address}:{port}: {why or 'bind() failed'}"


def port_free(address: str, port: int) -> bool:
    """Could NGINX bind this address and port now (no other process holds it)? Unknown: yes."""
    if not address or not port:
        return True
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def own_endpoints(listen: str, port: int) -> frozenset[tuple[str, int]]:
    """The addresses and port the health and metrics server answers on (every loopback and pod
    address when --listen names no host or an unspecified one)."""
    import ipaddress

    host = listen.rpartition(":")[0].strip("[]")
    try:
        specific = not ipaddress.ip_address(host).is_unspecified
    except ValueError:
        specific = False
    hosts = {host} if specific else {"127.0.0.1", "::1", *pod_addresses()}
    return frozenset((h, port) for h in hosts)


class DataPlaneDriver(Renderer):
    """Builds, renders and applies the configuration: gateway/dataplane.py, render.py, nginx.py."""

    def __init__(self, opts: GatewayOptions) -> None:
        from gwpolicy.gateway.nginx import Nginx

        super().__init__(opts)
        self.state_dir = opts.state_dir or tempfile.mkdtemp(prefix="gwpolicy-gateway-")
        # checks the version (NginxError says what is missing) and adopts the NGINX an earlier
        # gateway process on this state directory left serving
        self.nginx: Nginx | None = Nginx(self.state_dir, binary=opts.nginx, outlive=True, sidecar=opts.nginx_sidecar)
        self.applied: dict[str, bytes] | None = None
        self.lock = threading.Lock()  # apply and stop come from different threads
        from gwpolicy.gateway.spanrelay import SpanRelay

        #: receives what NGINX logs of traced requests and exports the spans (gateway/spanrelay.py)
        self.relay = SpanRelay().start()
        self.traces: dict[str, Any] = {}  # the traced routes of the last build (tracing.table)

    def config(self, left_out: Any = None) -> Any:
        import dataclasses

        return dataclasses.replace(super().config(left_out), trace_relay=self.relay.target)

    def build(self, analysis: Any, epoch: Any = None, left_out: Any = None) -> tuple[Any, dict[str, bytes]]:
        from gwpolicy.gateway import tracing

        dp, files = super().build(analysis, epoch, left_out)
        self.traces = tracing.table(dp)
        return dp, files

    def start(self) -> None:
        """Say what was found: an NGINX adopted (it serves on; the first configuration is compared
        with what it serves and reloaded only when it differs), else one starts with the first
        configuration `apply` gets."""
        nginx = self.nginx
        if nginx is not None and nginx.adopted is not None:
            pid, gen = nginx.adopted
            log.info("adopted the running NGINX (master pid %d, generation %d, %s) in %s", pid, gen, nginx.digest,
                     self.state_dir)
        elif nginx is not None and nginx.not_adopted:
            log.warning("%s", nginx.not_adopted)

    @property
    def digest(self) -> str | None:
        """files_digest of the configuration NGINX serves, None while it serves none."""
        nginx = self.nginx
        return nginx.digest if nginx is not None and nginx.pid is not None else None

    def apply(self, files: dict[str, bytes]) -> str | None:
        """Validate, load and verify; None when NGINX serves `files`, else why not (the last good
        configuration keeps serving)."""
        with self.lock:
            if self.nginx is None:  # stopped when we lost the lease; a new master for the new term
                from gwpolicy.gateway.nginx import Nginx

                self.nginx = Nginx(self.state_dir, binary=self.opts.nginx, outlive=True,
                                   sidecar=self.opts.nginx_sidecar)
            result = self.nginx.apply(files)
            if result.ok:
                self.applied = files
                self.relay.update(self.traces)
                return None
            return result.error or "NGINX did not take the configuration"

    def check(self, files: dict[str, bytes]) -> str | None:
        """`nginx -t` of `files`, loading nothing: None when NGINX would take them, else its messages."""
        with self.lock:
            if self.nginx is None:
                from gwpolicy.gateway.nginx import Nginx

                self.nginx = Nginx(self.state_dir, binary=self.opts.nginx, outlive=True,
                                   sidecar=self.opts.nginx_sidecar)
            return self.nginx.check(files) or None

    @property
    def serving(self) -> bool:
        """Does NGINX run (and so serve the last configuration it took)?"""
        return self.nginx is not None and self.nginx.pid is not None and self.nginx.generation > 0

    def stop(self) -> None:
        """Stop NGINX (it no longer holds the Gateways' addresses); `apply` starts a new one. The
        sidecar's NGINX is left serving: it stops with its own container."""
        if self.opts.nginx_sidecar:
            self.release()
            return
        with self.lock:
            if self.nginx is not None:
                self.nginx.stop()
                self.nginx = None
            self.applied = None

    def release(self) -> None:
        """Leave NGINX serving the last configuration, for the next gateway process to adopt."""
        with self.lock:
            if self.nginx is not None:
                self.nginx.release()
                self.nginx = None
            self.applied = None

