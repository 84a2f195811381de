"""Backends: the Services, EndpointSlices, ReferenceGrants and BackendTLSPolicies a route's
backendRefs and mirrors resolve to, and the upstreams they become. Every object read by
reference is recorded for the route being built (BuildCache compares them on the next build)."""

from __future__ import annotations

import hashlib
from typing import Any

from gwpolicy.engine import names
from gwpolicy.engine.grants import ReferenceGrants, grant_from_key
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.topology import PathNode, namespace_ref
from gwpolicy.gateway import backendtls, ngfpolicies, policies, policyconf
from gwpolicy.gateway.dataplane.cache import memo, programmable
from gwpolicy.gateway.dataplane.model import (
    BACKEND_NOT_FOUND,
    BACKEND_TLS_INVALID,
    ENDPOINTSLICE_CONTROLLER,
    INVALID_KIND,
    MANAGED_BY_LABEL,
    NO_ENDPOINTS,
    REF_NOT_PERMITTED,
    SERVICE_NAME_LABEL,
    UNSUPPORTED_VALUE,
    Backend,
    DataPlaneConfig,
    DataPlaneError,
    Endpoint,
    Mirror,
    RouteFact,
    Server,
    Upstream,
    as_dict,
    as_list,
    endpoint_problem,
    spec_key,
    upstream_base,
)
from gwpolicy.gateway.nginxproxy import family_allows


def not_served(fact: Any, ri: int, msg: str) -> None:
    """A rule's match the data plane leaves out, said once in the route's fact (its status says why)."""
    if (ri, msg) not in fact.unsupported:
        fact.unsupported.append((ri, msg))


def mirror_share(conf: dict[str, Any]) -> float:
    """The share of requests a RequestMirror copies: `percent`, else `fraction`, else all."""
    percent = conf.get("percent")
    if isinstance(percent, int) and not isinstance(percent, bool):
        return max(0.0, min(1.0, percent / 100))
    fraction = as_dict(conf.get("fraction"))
    num, den = fraction.get("numerator"), fraction.get("denominator", 100)
    if isinstance(num, int) and isinstance(den, int) and den > 0:
        return max(0.0, min(1.0, num / den))
    return 1.0


def backend_ref(b: dict[str, Any], route: Any) -> tuple[int, Ref, Any]:
    """(weight, the object referred to, port) of a route's backendRef, with the API's defaults: weight
    1 (also for a weight that is not a non-negative integer), core Service, the route's namespace."""
    weight = b.get("weight", 1)
    weight = weight if isinstance(weight, int) and not isinstance(weight, bool) and weight >= 0 else 1
    ref = Ref(b.get("group") or CORE_GROUP, b.get("kind") or "Service", b.get("namespace") or route.namespace,
              str(b.get("name", "")))
    return weight, ref, b.get("port")


def service_port(svc: Any, port: Any) -> dict[str, Any] | None:
    for p in as_list(as_dict(svc.spec).get("ports")):
        if isinstance(p, dict) and p.get("port") == port:
            return p
    return None


def listener_of(node: PathNode) -> Ref | None:
    for level in reversed(node.levels):
        if level.kind == "Gateway" and level.group == GATEWAY_GROUP and level.section is not None:
            return level
    return None


def child_node(node: PathNode | None, ref: Ref) -> PathNode | None:
    if node is None or node.children is None:
        return None
    return node.children.get(ref)


def descend(node: PathNode, ref: Ref) -> PathNode | None:
    """topology.extend without creating anything: the node one level down, if it exists."""
    ns = ref.namespace
    if ns is not None and ref.section is None and ns not in node.namespaces:
        in_namespace = child_node(node, namespace_ref(ns))
        if in_namespace is None:
            return None
        node = in_namespace
    return child_node(node, ref)


def family_suffix(family: str) -> str:
    """What an upstream's name adds for the endpoints of one IP family only ("" for both)."""
    return "" if family == "dual" else f"_{family}"


class BackendResolver:
    """The part of the builder that resolves backends and mirrors into upstreams (mixed into
    build._Builder, which sets these attributes)."""

    index: Any
    config: DataPlaneConfig
    grants: ReferenceGrants
    upstreams: dict[str, Upstream]
    secrets: dict[str, bytes]
    warnings: list[str]
    _recording: dict[str, bytes] | None
    _slices: dict[tuple[str, str], tuple[Any, ...]] | None
    _grants_by_ns: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] | None
    _objects_read: dict[Ref, Any] | None
    _slices_read: dict[tuple[str, str], tuple[Any, ...]] | None
    _grants_read: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] | None
    _effective: Any
    _at: dict[int, dict[str, dict[str, Any]]]
    _specs: dict[int, tuple[Any, Any]]
    _gateway_addresses: frozenset[str]
    _family: str  # the IP family whose EndpointSlices are used (build._Builder._family)
    _refused: dict[tuple[str, str], list[str]]
    analysis_outcomes: Any  # policy Ref -> its TargetOutcomes (the analysis')
    _folded: dict[Any, tuple[Any, Any]]  # see _with_ngf

    def get(self, ref: Ref) -> Any:
        """The object `ref` names in the index (None: absent), recorded for the route being built:
        what backendtls.resolve looks its ConfigMaps up with."""
        obj = self.index.by_ref.get(ref.object)
        if self._objects_read is not None:
            self._objects_read[ref.object] = obj
        return obj

    def _service(self, ref: Ref) -> Any:
        """The Service a backend or mirror names (None: absent), recorded for the route being built."""
        return self.get(ref)

    def _allows(self, route: Any, to_ns: str, to_name: str) -> bool:
        """May the route refer to the Service `to_ns`/`to_name` in another namespace (a
        ReferenceGrant there allows it)? The grants there that could, those whose `from` names the
        route's kind and namespace, are recorded for the route being built."""
        if self._grants_read is not None:
            referrer = (route.group, route.kind, route.namespace or "")
            self._grants_read[(to_ns, referrer)] = self._grants_in(to_ns, referrer)
        return self.grants.allows(route.group, route.kind, route.namespace or "", CORE_GROUP, "Service", to_ns, to_name)

    def _grants_in(self, namespace: str, referrer: tuple[str, str, str]) -> tuple[Any, ...]:
        """The ReferenceGrants of a namespace whose `from` names `referrer` (group, kind,
        namespace), in the index's order: the only ones that can let it refer there (grouped once
        per build). A grant created, changed or deleted that names it changes this tuple; one that
        does not (before and after) leaves it as it was."""
        if self._grants_by_ns is None:
            grouped: dict[tuple[str, tuple[str, str, str]], list[Any]] = {}
            for g in self.index.of_kind(GATEWAY_GROUP, "ReferenceGrant"):
                spec = g.spec if isinstance(g.spec, dict) else {}
                for key in {grant_from_key(f) for f in as_list(spec.get("from")) if isinstance(f, dict)} - {None}:
                    grouped.setdefault((g.namespace or "", key), []).append(g)  # type: ignore[arg-type]
            self._grants_by_ns = {k: tuple(v) for k, v in grouped.items()}
        return self._grants_by_ns.get((namespace, referrer), ())

    def _slices_of(self, namespace: str, name: str) -> tuple[Any, ...]:
        """The EndpointSlices of a Service (by their `kubernetes.io/service-name` label) the gateway
        trusts (those the EndpointSlice controller manages, unless the configuration allows every
        one), in the index's order; recorded for the route being built."""
        if self._slices is None:
            grouped: dict[tuple[str, str], list[Any]] = {}
            unmanaged = self.config.allow_unmanaged_endpointslices
            for es in self.index.of_kind("discovery.k8s.io", "EndpointSlice"):
                label = es.labels.get(SERVICE_NAME_LABEL)
                if label and (unmanaged or es.labels.get(MANAGED_BY_LABEL) == ENDPOINTSLICE_CONTROLLER):
                    grouped.setdefault((es.namespace or "", label), []).append(es)
            self._slices = {k: tuple(v) for k, v in grouped.items()}
        got = self._slices.get((namespace, name), ())
        if self._slices_read is not None:
            self._slices_read[(namespace, name)] = got
        return got

    def _mirrors(self, route: Any, rule: dict[str, Any], ri: int, fact: RouteFact) -> tuple[Mirror, ...]:
        """The rule's RequestMirror filters as NGINX sends them (see Mirror). The engine's paths do
        not include mirror targets, so no policy applies to the copies; a Service with a
        BackendTLSPolicy gets no copy rather than one in plain HTTP (fail closed)."""
        out = []
        for fi, f in enumerate(as_list(rule.get("filters"))):
            if not isinstance(f, dict) or f.get("type") != "RequestMirror":
                continue
            conf = as_dict(f.get("requestMirror"))
            share = mirror_share(conf)
            b = as_dict(conf.get("backendRef"))
            _, ref, port = backend_ref(b, route)
            m = Mirror(ref, port if isinstance(port, int) else None, share, None)
            where = f"rule {ri} filters[{fi}] requestMirror.backendRef"
            if share <= 0:
                m.error, m.message = UNSUPPORTED_VALUE, f"{where}: percent or fraction of 0 mirrors nothing"
            elif (ref.group, ref.kind) != (CORE_GROUP, "Service"):
                m.error, m.message = INVALID_KIND, f"{where}: kind {ref.group or 'core'}/{ref.kind} is not supported (Service is)"
            elif names.reference_problem("Service", ref.namespace, ref.name) is not None:
                m.error, m.message = BACKEND_NOT_FOUND, f"{where}: Service {names.reference_problem('Service', ref.namespace, ref.name)}"
            elif ref.namespace != route.namespace and not self._allows(route, ref.namespace or "", ref.name):
                m.error, m.message = REF_NOT_PERMITTED, f"{where}: Service {ref.namespace}/{ref.name} is in another namespace and no ReferenceGrant allows the reference"
            else:
                svc = self._service(ref)
                sport = service_port(svc, port) if svc is not None else None
                if svc is None or sport is None:
                    m.error, m.message = BACKEND_NOT_FOUND, f"{where}: Service {ref.namespace}/{ref.name} port {port!r} does not exist"
                elif self._backend_tls_targets(ref):
                    m.error, m.message = BACKEND_TLS_INVALID, (f"{where}: Service {ref.namespace}/{ref.name} has a BackendTLSPolicy, "
                                                               "which this data plane does not apply to mirrored requests: none is sent")
                else:
                    endpoints = self._endpoints(svc, sport)
                    if not endpoints:
                        m.error, m.message = NO_ENDPOINTS, f"{where}: {self._no_endpoints(ref.namespace, ref.name, port)}"
                    else:
                        m.upstream = self._upstream(ref, int(port), endpoints, {})
            if m.error is not None and m.error != NO_ENDPOINTS:
                not_served(fact, ri, m.message)
            out.append(m)
        return tuple(out)

    def _backend_tls_targets(self, svc: Ref) -> bool:
        """Does a BackendTLSPolicy target this Service (any port)?"""
        group, kind = backendtls.KIND
        for p in self.index.of_kind(group, kind):
            for t in as_list(as_dict(p.spec).get("targetRefs")):
                if (isinstance(t, dict) and (t.get("group") or CORE_GROUP) == CORE_GROUP and (t.get("kind") or "Service") == "Service"
                        and p.namespace == svc.namespace and t.get("name") == svc.name):
                    return True
        return False

    def _backends(self, route: Any, rule: dict[str, Any], ri: int, rule_node: PathNode, fact: RouteFact,
                  server: Server) -> list[Backend]:
        out: list[Backend] = []
        record = not any(u[0] == ri for u in fact.unresolved)
        for bi, b in enumerate(as_list(rule.get("backendRefs"))):
            if not isinstance(b, dict):
                continue
            weight, ref, port = backend_ref(b, route)
            group, kind, ns, name = ref.group, ref.kind, ref.namespace, ref.name
            filters = tuple(f for f in as_list(b.get("filters")) if isinstance(f, dict))
            backend = Backend(ref, weight, None, filters=filters)
            bad_name = names.reference_problem("Service", ns, name)
            if (group, kind) != (CORE_GROUP, "Service"):
                backend.error, backend.message = INVALID_KIND, f"backendRefs[{bi}] of rule {ri}: kind {group or 'core'}/{kind} is not supported (Service is)"
            elif bad_name is not None:
                backend.error, backend.message = BACKEND_NOT_FOUND, f"backendRefs[{bi}] of rule {ri}: Service {bad_name}"
            elif ns is not None and ns != route.namespace and not self._allows(route, ns, name):
                backend.error, backend.message = REF_NOT_PERMITTED, f"backendRefs[{bi}] of rule {ri}: Service {ns}/{name} is in another namespace and no ReferenceGrant allows the reference"
            else:
                svc = self._service(ref)
                sport = service_port(svc, port) if svc is not None else None
                if svc is None:
                    backend.error, backend.message = BACKEND_NOT_FOUND, f"backendRefs[{bi}] of rule {ri}: Service {ns}/{name} does not exist"
                elif sport is None:
                    backend.error, backend.message = BACKEND_NOT_FOUND, f"backendRefs[{bi}] of rule {ri}: Service {ns}/{name} has no port {port!r}"
                else:
                    bnode = descend(rule_node, ref)
                    pnode = child_node(bnode, ref.with_section(sport["name"])) if bnode is not None and sport.get("name") else None
                    target_node = pnode or bnode
                    eff = self.effective_at(target_node.levels[-1], target_node) if target_node is not None else {}
                    # the rule's own fields (timeouts, retry) merged in as the kinds' fieldMappings say
                    eff = policyconf.with_route_fields(eff, rule)
                    backend.effective = eff
                    backend.path = tuple(target_node.levels) if target_node is not None else ()
                    endpoints = self._endpoints(svc, sport)
                    tls = self._tls(target_node)
                    if isinstance(tls, backendtls.TLSFailure):
                        backend.error, backend.message = BACKEND_TLS_INVALID, f"Service {ns}/{name} port {port}: {tls.message}"
                    elif not endpoints:
                        backend.error, backend.message = NO_ENDPOINTS, self._no_endpoints(ns, name, port)
                    else:
                        backend.tls = tls
                        backend.upstream = self._upstream(ref, int(port), endpoints, eff, tls)
            if backend.error and backend.error not in (NO_ENDPOINTS, BACKEND_TLS_INVALID) and record:
                fact.unresolved.append((ri, bi, backend.error, backend.message))
            out.append(backend)
        return out

    def effective_at(self, target: Ref, node: PathNode) -> dict[str, dict[str, Any]]:
        """Kind -> effective spec of exactly this path (what POL's policyconf translates)."""
        got = self._at.get(id(node))
        if got is not None:
            return got
        got = self._at[id(node)] = self._effective_at(target, node)
        return got

    def _effective_at(self, target: Ref, node: PathNode) -> dict[str, dict[str, Any]]:
        pairs = self._effective.get(target, {}).get(node, ())
        out = {spec_key(k.group, k.kind): self._spec_of(res)
               for k, res in pairs if res.leaves}
        if any(k.group == ngfpolicies.GROUP for k, res in pairs if res.leaves):
            out = self._with_ngf(node, {k.key: res for k, res in pairs if res.leaves}, out)
        return out

    def _with_ngf(self, node: PathNode, results: dict[tuple[str, str], Any], out: dict[str, Any]) -> dict[str, Any]:
        """NGF's kinds folded into ours of the same name (gateway/ngfpolicies.py's precedence), one
        folded spec per distinct (results, levels their sources target): shared as Results are."""
        depth = ngfpolicies.depth_on(node.levels, self.analysis_outcomes)
        ids = tuple(sorted((k, id(v)) for k, v in results.items()))
        depths = tuple(depth(s.get("policy")) for _, v in sorted(results.items()) for s in v.sources)
        key = (ids, depths)
        got = self._folded.get(key)
        if got is None or any(got[0].get(k) is not v for k, v in results.items()):
            got = self._folded[key] = (results, ngfpolicies.fold(out, results, depth))
        folded: dict[str, Any] = got[1]
        return folded

    def _spec_of(self, result: Any) -> Any:
        """policyconf.Effective of an engine Result (knows its overrides and sources), one per Result:
        results are shared by every path with the same ladder, and so are these (memo keys)."""
        got = self._specs.get(id(result))
        if got is None or got[0] is not result:
            got = self._specs[id(result)] = (result, policyconf.Effective.of(result))
        return got[1]

    def _tls(self, node: PathNode | None) -> Any:
        """The BackendTLSPolicy of this backend path (POL's backendtls), from the engine's Result."""
        if node is None:
            return None
        pairs = self._effective.get(node.levels[-1], {}).get(node, ())
        results = {k.key: res for k, res in pairs if k.key == backendtls.KIND and res.leaves}
        if not results:
            return None
        tls = backendtls.for_backend(results, self)  # its ConfigMaps looked up through self.get: recorded
        if isinstance(tls, backendtls.TLSProfile):
            files = tls.files()
            self.secrets.update(files)
            if self._recording is not None:
                self._recording.update(files)
        return tls

    def _upstream(self, svc: Ref, port: int, endpoints: tuple[Endpoint, ...], eff: dict[str, dict[str, Any]],
                  tls: Any = None) -> str:
        u = upstream_for(svc, port, endpoints, eff, tls, self._family)
        was = self.upstreams.get(u.name)
        if was is None:
            self.upstreams[u.name] = u
        elif not same_upstream(was, u):
            raise DataPlaneError(f"Service {svc.namespace}/{svc.name} port {port} and Service {was.service.namespace}/"
                                 f"{was.service.name} port {was.port} (or their settings) got one upstream name {u.name}")
        return u.name

    # -- endpoints ------------------------------------------------------------------------------

    def _endpoints(self, svc: Any, sport: dict[str, Any]) -> tuple[Endpoint, ...]:
        out: dict[Endpoint, None] = {}
        pname = sport.get("name") or ""
        for es in self._slices_of(svc.namespace or "", svc.name):
            address_type = es.raw.get("addressType", "IPv4")
            if address_type not in ("IPv4", "IPv6") or not family_allows(self._family, address_type.lower()):
                continue  # FQDN slices, and with an NginxProxy ipFamily the other family's
            ports = [p for p in as_list(es.raw.get("ports")) if isinstance(p, dict)]
            if ports:
                match = [p for p in ports if (p.get("name") or "") == pname and isinstance(p.get("port"), int)]
                if not match:
                    continue
                number = match[0]["port"]
            else:
                tp = sport.get("targetPort")
                number = tp if isinstance(tp, int) else sport.get("port")
            for ep in as_list(es.raw.get("endpoints")):
                if not isinstance(ep, dict):
                    continue
                ready = as_dict(ep.get("conditions")).get("ready")
                if ready is False:
                    continue
                for addr in as_list(ep.get("addresses")):
                    why, text = endpoint_problem(addr, address_type, self.config, self._gateway_addresses)
                    if why is None and isinstance(number, int) and (text, number) in self.config.own_endpoints:
                        why = f"{text}:{number} is the gateway's own health and metrics endpoint"
                    if why is not None:
                        refused = self._refused.setdefault((svc.namespace or "", svc.name), [])
                        if why not in refused:
                            refused.append(why)
                            self.warnings.append(f"EndpointSlice {es.namespace}/{es.name} of Service "
                                                 f"{svc.namespace}/{svc.name}: endpoint {why}: not used")
                        continue
                    out[Endpoint(text, int(number))] = None
        return tuple(sorted(out, key=lambda e: (e.address, e.port)))

    def _no_endpoints(self, ns: str | None, name: str, port: Any) -> str:
        """The message of a Service port without a usable endpoint, with the addresses refused."""
        refused = self._refused.get((ns or "", name))
        return (f"Service {ns}/{name} port {port} has no ready endpoints"
                + (f" of family {'IPv4' if self._family == 'ipv4' else 'IPv6'} (the Gateway's NginxProxy ipFamily)"
                   if self._family != "dual" else "")
                + (f" (not used: {'; '.join(refused)})" if refused else ""))


def upstream_for(svc: Ref, port: int, endpoints: tuple[Endpoint, ...], eff: dict[str, dict[str, Any]],
                 tls: Any = None, family: str = "dual") -> Upstream:
    """The upstream of a Service port with the effective policies `eff` of a backend's path: its
    settings (UpstreamSettingsPolicy), how often it lists each endpoint (RetryPolicy), the IP family
    of its endpoints (NginxProxy ipFamily) and its TLS profile; named by all four, so that paths
    with different settings get upstreams of their own."""
    base = upstream_base(svc.namespace or "", svc.name, port)
    usable = programmable(eff)
    if usable:
        copies = memo("copies", usable, lambda: policies.retry_peer_copies(usable))
        conf = memo("upstream", usable, lambda: policies.upstream_directives(base, usable, peer_copies=copies), base)
    else:  # no policy of a kind this data plane enforces: nothing to ask policyconf
        copies, conf = 1, policies.PLAIN_UPSTREAM
    variant = (conf.lines, conf.server_params, copies)
    name = base if variant == (policies.PLAIN_UPSTREAM.lines, "", 1) else f"{base}_{hashlib.sha1(repr(variant).encode()).hexdigest()[:8]}"
    name += family_suffix(family)  # the endpoints of one family: not the same upstream as both's
    if tls is not None:
        name = f"{name}_tls{tls.key}"
    # NGINX compares every new upstream's name with all earlier ones (quadratic); names that
    # differ in their first characters make each comparison stop at once: with names sharing
    # the prefix `<namespace>_svc_...`, 20k upstreams cost 7.8 s of `nginx -t`, like this 3.1 s
    name = f"u{hashlib.sha1(name.encode()).hexdigest()[:5]}_{name}"
    lines = tuple(l.replace(f"zone {base} ", f"zone {name} ") for l in conf.lines)
    return Upstream(name, svc, port, endpoints, lines, conf.server_params, copies, conf.keepalive, tls, conf.close)


def same_upstream(a: Upstream, b: Upstream) -> bool:
    """Do two upstreams of one name say the same (Service port, settings, endpoints' copies, TLS)?"""
    if (a.service, a.port, a.lines, a.server_params, a.peer_copies) != (b.service, b.port, b.lines, b.server_params, b.peer_copies):
        return False
    return (a.tls is None) == (b.tls is None) and (a.tls is None or a.tls.key == b.tls.key)
