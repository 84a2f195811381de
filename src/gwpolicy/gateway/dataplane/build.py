"""Building the data plane model from the engine's analysis and the facts.

One topology, not a second model: which listeners a route is attached to comes from the
analysis' paths, and each location and backend carries the effective policy of its own exact
engine path (GatewayClass > Gateway > listener > route > rule > Service > port). Which listeners
and routes are served is the facts' verdict (gateway/facts.py), never decided again here.
"""

from __future__ import annotations

from typing import Any

from gwpolicy.engine import names
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.topology import PathNode
from gwpolicy.gateway import grpcroute, nginxproxy, pathregex, policyconf
from gwpolicy.gateway.dataplane.addresses import gateway_addresses, listen_addresses, reserved, route_hostnames
from gwpolicy.gateway.dataplane.backends import (
    BackendResolver,
    backend_ref,
    child_node,
    family_suffix,
    listener_of,
    not_served,
    service_port,
)
from gwpolicy.gateway.dataplane.cache import BuildCache, RouteEntry, without_gc
from gwpolicy.gateway.dataplane.model import (
    BACKEND_NOT_FOUND,
    BUDGET_EXCEEDED,
    INVALID_KIND,
    NO_ENDPOINTS,
    PORT_UNAVAILABLE,
    REF_NOT_PERMITTED,
    REGULAR_EXPRESSION,
    SOCKET_DIR,
    STREAM_MODULE,
    UNSUPPORTED_PROTOCOL,
    Action,
    DataPlane,
    DataPlaneConfig,
    DataPlaneError,
    ListenerFact,
    MatchRule,
    PassthroughBackend,
    PassthroughRoute,
    PassthroughServer,
    RouteFact,
    Server,
    Upstream,
    VirtualHost,
    action_id,
    address_key,
    client_ca_path,
    server_id,
    slug,
    tls_upstream_name,
)
from gwpolicy.gateway.dataplane.order import place_locations
from gwpolicy.gateway.facts import (
    SUPPORTED_FILTERS,
    Cond,
    ListenerFacts,
    class_acceptance,
    gateway_acceptance,
    listener_verdicts,
    redirect_problem,
)


def build_dataplane(analysis: Any, config: DataPlaneConfig | None = None, cache: "BuildCache | None" = None) -> DataPlane:
    """The data plane for every Gateway of our GatewayClasses in the analysis. With `cache` (one
    per sequence of in-place updates of one analysis, see BuildCache), what a route gave last time
    is reused while everything it was built from is the same objects."""
    with without_gc():
        return _Builder(analysis, config or DataPlaneConfig(), cache).build()


def as_dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


_NONE: dict[Any, Any] = {}


def _copy_fact(f: "RouteFact") -> "RouteFact":
    return RouteFact(set(f.listeners), list(f.unresolved), list(f.unsupported))


def _server_key(s: "Server | None") -> tuple[Any, ...] | None:
    return None if s is None else (s.id, s.listener, s.address, s.port, s.protocol, s.hostname, s.certificate, s.family)


def as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


class _Builder(BackendResolver):
    def __init__(self, analysis: Any, config: DataPlaneConfig, cache: BuildCache | None = None) -> None:
        self.a = analysis
        self.cache = cache
        self._recording: dict[str, bytes] | None = None  # secrets the route being built adds
        self._new_actions: dict[str, Action] = {}  # and its actions
        self.index = analysis.index
        self.topo = analysis.topology
        self.config = config
        self.grants = ReferenceGrants(self.index)
        self.upstreams: dict[str, Upstream] = {}
        self.stream_upstreams: dict[str, Upstream] = {}  # TLS passthrough backends
        self.actions: dict[str, Action] = {}
        self.secrets: dict[str, bytes] = {}
        self.listener_facts: dict[Ref, ListenerFact] = {}
        self.route_facts: dict[Ref, RouteFact] = {}
        self.warnings: list[str] = []
        self.unserved: dict[Ref, str] = {}  # Gateway -> why none of its listeners is served
        self._slices: dict[tuple[str, str], tuple[Any, ...]] | None = None
        self._grants_by_ns: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] | None = None
        #: what the route being built reads by reference, of EndpointSlices and of ReferenceGrants
        #: (see BuildCache); None while no route is recorded
        self._objects_read: dict[Ref, Any] | None = None
        self._slices_read: dict[tuple[str, str], tuple[Any, ...]] | None = None
        self._grants_read: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] | None = None
        self._effective = analysis._effective_by_target()
        self.analysis_outcomes = analysis.outcomes
        self._folded: dict[Any, tuple[Any, Any]] = {}
        self._at: dict[int, dict[str, dict[str, Any]]] = {}  # path node -> effective_at (nodes live in the analysis)
        self._specs: dict[int, tuple[Any, Any]] = {}  # id(Result) -> (Result, Effective)
        self._gateway_addresses: frozenset[str] = frozenset()  # never endpoints (see endpoint_problem)
        #: the IP family of the server whose routes are being built: the EndpointSlices they use
        self._family = "dual"
        #: Service (namespace, name) -> why endpoint addresses of its slices were not used
        self._refused: dict[tuple[str, str], list[str]] = {}
        self.over_budget: dict[Ref, tuple[str, str]] = {}

    # -- gateways and listeners ---------------------------------------------------------------

    def _our_gateways(self) -> list[tuple[Any, "Cond"]]:
        """The Gateways of our GatewayClasses, each with its class' Accepted condition (as status
        says it: a Gateway of a class that is not accepted is served nothing); why each other
        Gateway is not ours goes to `unserved`."""

        out = []
        for gw in self.index.of_kind(GATEWAY_GROUP, "Gateway"):
            class_name = str(as_dict(gw.spec).get("gatewayClassName", ""))
            cls = self.index.by_ref.get(Ref(GATEWAY_GROUP, "GatewayClass", None, class_name))
            if cls is None:
                self.unserved[gw.ref] = f"GatewayClass {class_name!r} does not exist"
                continue
            controller = as_dict(cls.spec).get("controllerName")
            if self.config.controller_name is not None and controller != self.config.controller_name:
                self.unserved[gw.ref] = (f"GatewayClass {class_name} belongs to controller {controller!r}, "
                                         f"not {self.config.controller_name!r}")
                continue
            out.append((gw, class_acceptance(cls, self.index)))
        return out

    def build(self) -> DataPlane:
        ours = self._our_gateways()
        gateways = [gw for gw, _ in ours]
        families = {gw.ref: nginxproxy.ip_family(nginxproxy.effective(gw, self.index)) for gw in gateways}
        addresses = gateway_addresses(gateways, self.config, families)
        listen = {gw.ref: listen_addresses(gw, addresses[gw.ref], families[gw.ref]) for gw in gateways}
        self._gateway_addresses = frozenset(a for addrs in listen.values() for a in addrs)
        if self.cache is not None and self.cache.gateway_addresses != self._gateway_addresses:
            self.cache.routes.clear()  # the endpoints routes were built with may be a Gateway's address now
            self.cache.gateway_addresses = self._gateway_addresses
        servers: list[Server] = []
        owner: dict[tuple[str, int], Ref] = {}  # address:port -> the Gateway serving it
        for gw, class_ok in sorted(ours, key=lambda g: g[0].age_key):  # the older Gateway keeps a shared address:port
            groups: dict[Ref, list[Server]] = {}
            for srv in self._gateway_servers(gw, class_ok, listen[gw.ref], families[gw.ref]):
                groups.setdefault(srv.listener, []).append(srv)
            for lref, group in groups.items():  # a listener is served on all its addresses, or on none
                why = None
                for srv in group:
                    at = f"{srv.address}:{srv.port - self.config.port_offset}"
                    held = reserved(self.config.reserved, srv.address, srv.port)
                    first = owner.get((srv.address, srv.port), gw.ref)
                    if held is not None:
                        why = f"{at} is held by {held}"
                    elif first != gw.ref:  # two Gateways on one address:port would make NGINX refuse everything
                        why = f"{at} is already served for Gateway {first.namespace}/{first.name}"
                    if why is not None:
                        break
                if why is not None:
                    self.listener_facts[lref] = ListenerFact(False, PORT_UNAVAILABLE, why)
                    continue
                for srv in group:
                    owner[(srv.address, srv.port)] = gw.ref
                servers += group
        if len({s.id for s in servers}) != len(servers):  # server_id: cannot be, short of a digest collision
            raise DataPlaneError("two listeners got one server id: " + ", ".join(sorted(s.id for s in servers)))
        passthrough = [s for s in servers if s.protocol == "TLS"]
        servers = [s for s in servers if s.protocol != "TLS"]
        by_listener: dict[Ref, Server] = {}
        for s in servers:  # a listener's first address; the others share its virtual hosts
            by_listener.setdefault(s.listener, s)
        self._attach_routes(by_listener)
        for s in servers:
            s.vhosts = by_listener[s.listener].vhosts
        for s in servers:
            s.vhosts.sort(key=lambda v: (v.hostname == "", v.hostname))
        streams = self._attach_tls_routes(passthrough)
        by_port = {(p.address, p.port): p for p in streams}
        for s in servers:  # HTTPS on a passthrough port: behind the stream server, on a unix socket
            shared = by_port.get((s.address, s.port)) if s.protocol == "HTTPS" else None
            if shared is not None:
                shared.https_socket = s.socket = f"{SOCKET_DIR}/h_{address_key(s.address)}_{s.port}.sock"
                if s.hostname not in shared.https_names:
                    shared.https_names.append(s.hostname)
        return DataPlane(servers, dict(sorted(self.upstreams.items())), self.actions, dict(sorted(self.secrets.items())),
                         addresses, self.listener_facts, self.route_facts, self.config, self.warnings,
                         streams, dict(sorted(self.stream_upstreams.items())), self.unserved, self.over_budget,
                         *self._proxies(gateways), listen)

    def _proxies(self, gateways: list[Any]) -> tuple[dict[Ref, Any], dict[Ref, tuple[str, ...]]]:
        """Gateway -> the telemetry exporter of its NginxProxy (its class's, overridden by its own),
        and Gateway -> the server lines it gives (error log level, real_ip)."""
        exporters, lines = {}, {}
        for gw in gateways:
            spec = nginxproxy.effective(gw, self.index)
            exp = nginxproxy.exporter(spec, gw)
            if exp is not None:
                exporters[gw.ref] = exp
            if nginxproxy.server_lines(spec):
                lines[gw.ref] = nginxproxy.server_lines(spec)
        return exporters, lines

    def _gateway_servers(self, gw: Any, class_ok: "Cond", addresses: tuple[str, ...], family: str) -> list[Server]:
        """A Server per servable listener of the Gateway and address it is served on (the first
        address' server keeps the listener's id, the others add their position)."""
        # which listeners are served is status' verdict (facts.listener_verdicts: the one rule,
        # conflicts included); only what needs the data plane itself (the stream module, the
        # certificate file, address:port ownership across Gateways) is decided here on top

        verdicts = listener_verdicts(gw, self.index, self.grants)
        gateway_ok = gateway_acceptance(gw, verdicts, class_ok, self.config.any_address, self.index)
        if not gateway_ok.status:
            self.unserved[gw.ref] = f"it is not accepted ({gateway_ok.reason}): {gateway_ok.message}"
        out = []
        for name, lf in verdicts.items():
            lref = gw.ref.with_section(name)
            if not gateway_ok.status:
                self.listener_facts[lref] = ListenerFact(False, gateway_ok.reason, f"Gateway {gw.namespace}/{gw.name} is "
                                                                                   f"not accepted: {gateway_ok.message}")
                continue
            if not lf.servable:
                # the reference's reason first (InvalidCertificateRef, ...), as the data plane said before
                why = lf.conflicted if lf.conflicted.status else next(c for c in (lf.resolved_refs, lf.accepted) if not c.status)
                self.listener_facts[lref] = ListenerFact(False, why.reason, why.message)
                continue
            assert lf.port is not None  # servable listeners have a port
            port, protocol, hostname = lf.port, lf.protocol, (lf.hostname or "").lower()
            if protocol == "TLS" and self.config.stream_module is None:
                self.listener_facts[lref] = ListenerFact(False, UNSUPPORTED_PROTOCOL,
                                                         f"TLS passthrough needs NGINX's stream module ({STREAM_MODULE}, "
                                                         "Debian package libnginx-mod-stream), which is not installed")
                continue
            cert, client_ca, client_mode = None, None, ""
            if protocol == "HTTPS":  # the certificate and client CAs status resolved (servable: all of them)
                cert = self._certificate(lf)
                if lf.client_cas:  # a listener whose validation has a problem is not servable (fail closed)
                    client_ca = client_ca_path(gw.namespace or "", gw.name, port)
                    client_mode = lf.client_mode
                    self.secrets[client_ca] = lf.client_bundle
            if lref in self.config.left_out:
                self.listener_facts[lref] = ListenerFact(False, *self.config.left_out[lref])
                continue
            sid = server_id(gw.namespace, gw.name, name)
            out += [Server(f"{sid}_{i}" if i else sid, gw.ref, lref, address, port + self.config.port_offset, protocol,
                           hostname, cert, client_ca=client_ca, client_mode=client_mode, family=family)
                    for i, address in enumerate(addresses)]
            self.listener_facts[lref] = ListenerFact(True)
        return out

    def _certificate(self, lf: "ListenerFacts") -> str:
        """The file of a servable HTTPS listener's certificate: its first certificateRef, as status
        resolved it (facts.certificate_secret, the one check of a certificate Secret)."""
        if not lf.certificates:  # status leaves an HTTPS listener without a certificate unservable
            raise DataPlaneError(f"listener {lf.name}: servable HTTPS listener without a resolved certificate")
        cert = lf.certificates[0]
        path = f"secrets/{cert.secret.namespace}_{cert.secret.name}.pem"
        self.secrets[path] = cert.pem
        return path

    # -- TLS passthrough ----------------------------------------------------------------------

    def _attach_tls_routes(self, listeners: list[Server]) -> list[PassthroughServer]:
        """One stream server per address:port of passthrough listeners; each TLSRoute attached to a
        listener (the engine's paths) serves its hostnames intersected with the listener's. Of two
        routes claiming one name on one port, the older route keeps it (as for HTTPRoute rules)."""
        streams: dict[tuple[str, int], PassthroughServer] = {}
        by_listener: dict[Ref, list[Server]] = {}
        for l in listeners:
            key = (l.address, l.port)
            if key not in streams:
                streams[key] = PassthroughServer(f"t{len(streams)}_{slug(l.address)}_{l.port}", l.gateway, l.address, l.port, [])
            streams[key].listeners.append(l.listener)
            by_listener.setdefault(l.listener, []).append(l)
        if not listeners:
            return []
        for route in sorted(self.index.of_kind(GATEWAY_GROUP, "TLSRoute"), key=lambda o: o.age_key):
            if route.ref in self.config.left_out:
                continue
            attached = [l for lref in map(listener_of, self.topo.paths.get(route.ref, {}))
                        if lref is not None and lref in by_listener for l in by_listener[lref]]
            if not attached:
                continue
            fact = self.route_facts.setdefault(route.ref, RouteFact())
            families = {l.family for l in attached}  # one family for every Gateway: its endpoints only
            self._family = families.pop() if len(families) == 1 else "dual"
            target = PassthroughRoute(route.ref, self._tls_backends(route, fact))
            self._family = "dual"
            hostnames = as_list(as_dict(route.spec).get("hostnames"))
            for l in attached:
                fact.listeners.add(l.listener)
                hosts = streams[(l.address, l.port)].hosts
                for host in route_hostnames(l.hostname, hostnames):
                    hosts.setdefault(host or l.hostname, target)
        return [streams[k] for k in sorted(streams)]

    def _tls_backends(self, route: Any, fact: RouteFact) -> list[PassthroughBackend]:
        out = []
        rules = [r for r in as_list(as_dict(route.spec).get("rules")) if isinstance(r, dict)]
        for ri, rule in enumerate(rules):
            for bi, b in enumerate(as_list(rule.get("backendRefs"))):
                if not isinstance(b, dict):
                    continue
                weight, ref, port = backend_ref(b, route)
                group, kind, ns, name = ref.group, ref.kind, ref.namespace, ref.name
                pb = PassthroughBackend(ref, weight, None)
                where = f"TLSRoute {route.namespace}/{route.name} spec.rules[{ri}].backendRefs[{bi}]"
                bad_name = names.reference_problem("Service", ns, name)
                svc = self.index.by_ref.get(ref) if (group, kind) == (CORE_GROUP, "Service") and bad_name is None else None
                sport = service_port(svc, port) if svc is not None else None
                if (group, kind) != (CORE_GROUP, "Service"):
                    pb.error, pb.message = INVALID_KIND, f"{where}: kind {group or 'core'}/{kind} is not supported (Service is)"
                elif bad_name is not None:
                    pb.error, pb.message = BACKEND_NOT_FOUND, f"{where}: Service {bad_name}"
                elif ns is not None and ns != route.namespace and not self.grants.allows(route.group, route.kind, route.namespace or "", CORE_GROUP, "Service", ns, name):
                    pb.error, pb.message = REF_NOT_PERMITTED, f"{where}: Service {ns}/{name} is in another namespace and no ReferenceGrant allows the reference"
                elif svc is None:
                    pb.error, pb.message = BACKEND_NOT_FOUND, f"{where}: Service {ns}/{name} does not exist"
                elif sport is None:
                    pb.error, pb.message = BACKEND_NOT_FOUND, f"{where}: Service {ns}/{name} has no port {port!r}"
                else:
                    endpoints = self._endpoints(svc, sport)
                    if not endpoints:
                        pb.error, pb.message = NO_ENDPOINTS, f"{where}: {self._no_endpoints(ns, name, port)}"
                    else:
                        uname = tls_upstream_name(ns or "", name, int(port)) + family_suffix(self._family)
                        was = self.stream_upstreams.get(uname)
                        if was is not None and (was.service, was.port) != (ref, int(port)):
                            raise DataPlaneError(f"Service {ns}/{name} port {port} and Service {was.service.namespace}/"
                                                 f"{was.service.name} port {was.port} got one upstream name {uname}")
                        self.stream_upstreams[uname] = Upstream(uname, ref, int(port), endpoints)
                        pb.upstream = uname
                if pb.error and pb.error != NO_ENDPOINTS and not any(u[:2] == (ri, bi) for u in fact.unresolved):
                    fact.unresolved.append((ri, bi, pb.error, pb.message))
                out.append(pb)
        return out

    # -- routes ---------------------------------------------------------------------------------

    def _attach_routes(self, by_listener: dict[Ref, Server]) -> None:
        vhosts: dict[tuple[str, str], VirtualHost] = {}
        rules_of: dict[tuple[str, str], list[MatchRule]] = {}
        # GRPCRoutes as the HTTPRoutes they are served as (grpcroute.py); one virtual host serves one
        # kind, the older route's (status says the same: grpcroute.conflict); one that cannot be
        # served as written is not (status: Accepted=False/UnsupportedValue)
        routes = sorted([r for r in self.index.of_kind(GATEWAY_GROUP, "HTTPRoute") if r.ref not in self.config.left_out]
                        + [grpcroute.as_http(r) for r in self.index.of_kind(GATEWAY_GROUP, grpcroute.KIND)
                           if r.ref not in self.config.left_out and grpcroute.problem(r.spec) is None],
                        key=lambda o: o.age_key)
        kind_of: dict[tuple[str, str], str] = {}
        if self.config.namespace_budget is not None:
            routes = self._within_budget(routes, self.config.namespace_budget)
        for route in routes:
            nodes = list(self.topo.paths.get(route.ref, {}))
            servers = [by_listener.get(lref) if lref is not None else None for lref in map(listener_of, nodes)]
            entry, inputs = self._cached(route, nodes, servers) if self.cache is not None else (None, None)
            if entry is not None:
                self.route_facts[route.ref] = _copy_fact(entry.fact)
                self.actions.update(entry.actions)
                for name, u in entry.upstreams.items():
                    self.upstreams.setdefault(name, u)
                self.secrets.update(entry.secrets)
                built = entry.matches
            else:
                built = [None] * len(nodes)
                self._recording = {}
                self._new_actions = {}
                self._objects_read, self._slices_read, self._grants_read = {}, {}, {}
            fact = self.route_facts.setdefault(route.ref, RouteFact())
            spec = as_dict(route.spec)
            for i, (node, server) in enumerate(zip(nodes, servers)):
                if server is None:
                    continue
                fact.listeners.add(server.listener)
                matches = built[i]
                for host in route_hostnames(server.hostname, as_list(spec.get("hostnames"))):
                    key = (server.id, host)
                    if kind_of.setdefault(key, route.kind) != route.kind:
                        continue
                    if key not in vhosts:
                        vh = VirtualHost(f"{len(vhosts)}", host)
                        vhosts[key] = vh
                        server.vhosts.append(vh)
                    if matches is None:
                        self._family = server.family
                        matches = built[i] = self._match_rules(route, node, server, fact)
                        self._family = "dual"
                    rules_of.setdefault(key, []).extend(matches)
            if entry is None and self.cache is not None:
                actions = self._new_actions
                used = {b.upstream for a in actions.values() for b in a.backends if b.upstream is not None}
                used.update(m.upstream for a in actions.values() for m in a.mirrors if m.upstream is not None)
                self.cache.routes[route.ref] = RouteEntry(
                    inputs if inputs is not None else self._inputs(route, nodes, servers),
                    [_server_key(sv) for sv in servers], built,
                    _copy_fact(fact), actions, {n: self.upstreams[n] for n in used}, self._recording or {},
                    self._objects_read or {}, self._slices_read or {}, self._grants_read or {})
            self._recording = None
            self._objects_read = self._slices_read = self._grants_read = None
        # actions are shared by every vhost of a listener: build once per (listener, route); the
        # loop above rebuilt them per hostname, so de-duplicate by id
        for key, rules in rules_of.items():
            seen: dict[tuple[str, int], MatchRule] = {}
            for r in rules:
                seen.setdefault((r.action.id, r.action.match), r)
            place_locations(vhosts[key], list(seen.values()))

    def _within_budget(self, routes: list[Any], budget: int) -> list[Any]:
        """The routes (oldest first) whose namespace's budget holds them: each namespace's routes
        count, in age order, until the next one would take it over; that one and every newer one of
        the namespace are left out (a route created later can never push an older one out)."""
        used: dict[str, int] = {}
        full: set[str] = set()
        out = []
        for r in routes:
            ns = r.namespace or ""
            cost = route_cost(r.spec)
            if ns not in full and used.get(ns, 0) + cost <= budget:
                used[ns] = used.get(ns, 0) + cost
                out.append(r)
                continue
            full.add(ns)
            self.over_budget[r.ref] = (BUDGET_EXCEEDED, (
                f"over the budget of namespace {ns}: {budget} route matches (older routes of {ns}: {used.get(ns, 0)}, "
                f"this route: {cost}; a match counts once per hostname); this route and the newer ones of {ns} are "
                "not served (gwpolicy gateway --namespace-match-budget)"))
        return out

    def _inputs(self, route: Any, nodes: list[PathNode], servers: list[Server | None]) -> list[Any]:
        """The objects a route's part of the data plane is built from (see BuildCache)."""
        out: list[Any] = [route]
        eff = self._effective
        for node, server in zip(nodes, servers):
            out.append(node)
            if server is None:
                continue
            stack = [node]
            while stack:
                n = stack.pop()
                out.append(n)
                out.append(eff.get(n.levels[-1], _NONE).get(n))
                if n.children:
                    stack.extend(n.children.values())
        return out

    def _cached(self, route: Any, nodes: list[PathNode],
                servers: list[Server | None]) -> tuple[RouteEntry | None, list[Any] | None]:
        """The route's entry when it may be reused, else None; and the route's inputs where they
        were made for the comparison (building the route reads nothing they are made of, so a new
        entry records them as they are)."""
        assert self.cache is not None
        entry = self.cache.routes.get(route.ref)
        inputs = None
        if entry is not None and entry.servers == [_server_key(sv) for sv in servers]:
            inputs = self._inputs(route, nodes, servers)
            if (len(inputs) == len(entry.inputs) and all(x is y for x, y in zip(inputs, entry.inputs))
                    and self._same_reads(entry)):
                self.cache.hits += 1
                return entry, inputs
        self.cache.misses += 1
        return None, inputs

    def _same_reads(self, entry: RouteEntry) -> bool:
        """Are the Services, ConfigMaps, EndpointSlices and ReferenceGrants the entry was built
        from still the index's objects?"""
        by_ref = self.index.by_ref
        if any(by_ref.get(ref) is not obj for ref, obj in entry.objects.items()):
            return False
        for key, was in entry.slices.items():
            now = self._slices_of(*key)
            if len(now) != len(was) or any(x is not y for x, y in zip(now, was)):
                return False
        for (ns, referrer), was in entry.grants.items():
            now = self._grants_in(ns, referrer)
            if len(now) != len(was) or any(x is not y for x, y in zip(now, was)):
                return False
        return True

    def _match_rules(self, route: Any, node: PathNode, server: Server, fact: RouteFact) -> list[MatchRule]:
        out: list[MatchRule] = []
        rules = [r for r in as_list(as_dict(route.spec).get("rules")) if isinstance(r, dict)]
        for ri, rule in enumerate(rules):
            rule_node = node
            if isinstance(rule.get("name"), str):
                rule_node = child_node(node, route.ref.with_section(rule["name"])) or node
            matches = [m for m in as_list(rule.get("matches")) if isinstance(m, dict)] or [{}]
            backends = None
            for mi, m in enumerate(matches):
                path = as_dict(m.get("path"))
                ptype = path.get("type") or "PathPrefix"
                raw_value = path.get("value")
                pvalue = raw_value if isinstance(raw_value, str) else "/"
                aid = action_id(server.id, route.ref, ri, mi)
                if aid in self.actions:
                    action = self.actions[aid]
                    if action.route != route.ref or action.listener != server.listener:
                        raise DataPlaneError(f"{route.kind} {route.namespace}/{route.name} and {action.route.kind} "
                                             f"{action.route.namespace}/{action.route.name} got one action id {aid}")
                else:
                    if backends is None:
                        backends = self._backends(route, rule, ri, rule_node, fact, server)
                    action = Action(aid, route.ref, ri, mi, server.listener, server.protocol.lower(),
                                    server.port - self.config.port_offset, ptype, pvalue,
                                    tuple(f for f in as_list(rule.get("filters")) if isinstance(f, dict)),
                                    backends, policyconf.with_route_fields(self.effective_at(rule_node.levels[-1], rule_node), rule),
                                    tuple(rule_node.levels))
                    self._check_action(action, fact)
                    action.mirrors = self._mirrors(route, rule, ri, fact)
                    self.actions[aid] = self._new_actions[aid] = action
                if ptype == REGULAR_EXPRESSION:
                    why = pathregex.problem(pvalue)
                    if why is not None:  # never reaches NGINX (status: Accepted=False/UnsupportedValue)
                        not_served(fact, ri, f"rule {ri} match {mi}: path value {pvalue!r} is not served: {why}")
                        continue
                elif ptype not in ("Exact", "PathPrefix") or not pvalue.startswith("/"):
                    not_served(fact, ri, f"rule {ri} match {mi}: path type {ptype!r} value {pvalue!r} is not supported "
                                          "(Exact, PathPrefix and RegularExpression are)")
                    continue
                if ptype == "PathPrefix" and len(pvalue) > 1:
                    action.path_value = pvalue = pvalue.rstrip("/") or "/"
                bad = pathregex.condition_problem(m)
                if bad is not None:  # never reaches NGINX (status: Accepted=False/UnsupportedValue)
                    not_served(fact, ri, f"rule {ri} match {mi}: {bad[0]} is not served: {bad[1]}")
                    continue
                method = m.get("method") if isinstance(m.get("method"), str) else None
                out.append(MatchRule(action, method, _conditions(m.get("headers"), lower=True),
                                     _conditions(m.get("queryParams"), lower=False), route.created,
                                     f"{route.namespace}/{route.name}"))
        return out

    def _check_action(self, action: Action, fact: RouteFact) -> None:
        for f in action.filters:
            if f.get("type") not in SUPPORTED_FILTERS:
                action.error = f"filter type {f.get('type')!r} is not supported by this data plane"
                not_served(fact, action.rule, action.error)
            if f.get("type") == "URLRewrite" or f.get("type") == "RequestRedirect":
                conf = as_dict(f.get("urlRewrite") if f.get("type") == "URLRewrite" else f.get("requestRedirect"))
                why = redirect_problem(conf) if f.get("type") == "RequestRedirect" else None
                if why is not None:
                    action.error = why
                    not_served(fact, action.rule, why)
                p = as_dict(conf.get("path"))
                if p.get("type") == "ReplacePrefixMatch" and action.path_type != "PathPrefix":
                    action.error = "ReplacePrefixMatch needs a PathPrefix match"
                    fact.unsupported.append((action.rule, action.error))


def route_cost(spec: Any) -> int:
    """What an HTTPRoute counts against its namespace's budget: its matches (a rule without one
    counts one), times its hostnames (at least one): roughly the locations and map entries it adds."""
    spec = as_dict(spec)
    matches = sum(max(1, len(as_list(as_dict(r).get("matches")))) for r in as_list(spec.get("rules"))) or 1
    return matches * max(1, len(as_list(spec.get("hostnames"))))


def _conditions(items: Any, *, lower: bool) -> tuple[tuple[str, str, str], ...]:
    out: list[tuple[str, str, str]] = []
    names: set[str] = set()
    for h in as_list(items):
        if not isinstance(h, dict) or not isinstance(h.get("name"), str):
            continue
        name = h["name"].lower() if lower else h["name"]
        if name in names:
            continue  # the spec: only the first entry of an equivalent name counts
        names.add(name)
        out.append((str(h.get("type") or "Exact"), name, str(h.get("value", ""))))
    return tuple(out)
