"""What the data plane is built from, and what status says about it: the facts of the objects the
gateway serves (GatewayClass, Gateway and its listeners, HTTPRoute and TLSRoute parents naming one
of our Gateways, their backends), and what this data plane supports.

Pure: `gateway_facts(index)` says, from the objects alone, what is valid, what attaches where and
why not (route attachment is the engine's, `topology.parent_listeners`); `dataplane_objects`
trims the objects to what the facts accept, so that the data plane serves exactly what status
says. Both the data plane model (gateway/dataplane/) and GEP-1364 status (gateway/status.py) read
these facts; neither is read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from gwpolicy.engine import names
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.status import condition, find_condition
from gwpolicy.engine.topology import parent_gateway, parent_listeners
from gwpolicy.gateway import frontendtls, grpcroute, nginxproxy, pathregex, policyconf, routevalues
from gwpolicy.gateway.listeners import Candidate, tls_pem, tls_problem, valid_hostname
from gwpolicy.gateway.listeners import conflicts as listener_conflicts

GATEWAY_CONTROLLER = "gwpolicy.io/gateway-controller"
#: Gateway API bundle versions (CRD annotation) this controller is written against
SUPPORTED_BUNDLE_PREFIXES = ("v1.", "v0.0.0-dev")
BUNDLE_ANNOTATION = "gateway.networking.k8s.io/bundle-version"

#: listener protocols this data plane serves
SUPPORTED_PROTOCOLS = ("HTTP", "HTTPS", "TLS")
#: route kinds this data plane serves, per protocol (TLS: passthrough only)
SUPPORTED_ROUTE_KINDS: dict[str, tuple[str, ...]] = {"HTTP": ("HTTPRoute", "GRPCRoute"), "HTTPS": ("HTTPRoute", "GRPCRoute"),
                                                      "TLS": ("TLSRoute",)}
#: the route kinds whose status this gateway writes, in the order facts list them
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute")


def route_objects(index: ObjectIndex) -> list[Obj]:
    """Every route of a kind this gateway serves, in the order facts list them."""
    return [r for kind in ROUTE_KINDS for r in index.of_kind(GATEWAY_GROUP, kind)]


#: HTTPRoute filter types the data plane renders; anything else makes the route
#: Accepted=False/UnsupportedValue
SUPPORTED_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite", "CORS",
                     "RequestMirror")
#: the schemes a RequestRedirect may name (the API's enum)
REDIRECT_SCHEMES = ("http", "https")


def redirect_problem(conf: dict[str, Any]) -> str | None:
    """Why a requestRedirect cannot be served (None: it can); the data plane and status say the same."""
    scheme = conf.get("scheme")
    if scheme is not None and scheme not in REDIRECT_SCHEMES:
        return f"requestRedirect.scheme {scheme!r} is not one of {', '.join(REDIRECT_SCHEMES)}"
    return None
SUPPORTED_PATH_TYPES = frozenset({"Exact", "PathPrefix", "RegularExpression"})

#: Gateway API features (conformance names) this gateway claims in GatewayClass.status.supportedFeatures;
#: the conformance harness checks that every case needing only these passes (tests/gateway_conformance)
SUPPORTED_FEATURES = (
    "BackendTLSPolicy", "GRPCRoute", "Gateway", "GatewayFrontendClientCertificateValidation", "HTTPRoute",
    "HTTPRoute303RedirectStatusCode", "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendRequestHeaderModification", "HTTPRouteBackendRequestRedirect", "HTTPRouteCORS", "HTTPRouteHostRewrite", "HTTPRouteMethodMatching",
    "HTTPRoutePathRedirect", "HTTPRoutePortRedirect", "HTTPRouteSchemeRedirect", "ReferenceGrant", "TLSRoute",
)

#: the condition types this controller owns on Gateways and GatewayClasses (others' are kept)
GATEWAY_CONDITION_TYPES = ("Accepted", "Programmed", "ResolvedRefs", "SupportedVersion", "InsecureFrontendValidationMode")


@dataclass(frozen=True)
class Cond:
    """A condition before it gets its generation and transition time."""

    type: str
    status: bool
    reason: str
    message: str

    def to_json(self, generation: int | None, previous: Any, now: str) -> dict[str, Any]:
        return condition(self.type, "True" if self.status else "False", self.reason, self.message,
                         generation, find_condition(previous, self.type), now)


@dataclass(frozen=True)
class Certificate:
    """A certificate Secret that resolved: its reference and the PEM file (certificate, then key)
    that `listeners.tls_pem` read from it, which is what the data plane serves."""

    secret: Ref
    pem: bytes


@dataclass(frozen=True)
class SecretProblem:
    """Why a Secret reference is unusable as a certificate: `kind` is InvalidKind, RefNotPermitted,
    NotFound or Malformed; `message` names the field and the Secret."""

    kind: str
    message: str


@dataclass
class ListenerFacts:
    name: str
    port: int | None
    protocol: str
    hostname: str | None
    supported_kinds: list[dict[str, str]]
    accepted: Cond
    resolved_refs: Cond
    conflicted: Cond
    #: HTTPS: every certificateRef resolved (the data plane serves the first); empty unless all resolve
    certificates: list[Certificate] = field(default_factory=list)
    client_cas: list[Ref] = field(default_factory=list)  # ConfigMaps with ca.crt for client validation
    client_mode: str = ""  # frontendtls.ALLOW_VALID_ONLY | ALLOW_INSECURE_FALLBACK when client_cas
    client_bundle: bytes = b""  # their ca.crt, concatenated: what NGINX verifies clients against
    attached_routes: int = 0

    @property
    def servable(self) -> bool:
        """Can the data plane program it: accepted, references resolved, no conflict."""
        return self.accepted.status and self.resolved_refs.status and not self.conflicted.status


@dataclass
class GatewayFacts:
    ref: Ref
    obj: Obj
    gateway_class: Ref
    listeners: dict[str, ListenerFacts]
    accepted: Cond
    resolved_refs: Cond | None  # only when spec.tls.backend is set
    requested_addresses: list[dict[str, Any]]
    #: why spec.addresses names an address the Gateway does not listen on (its NginxProxy's
    #: ipFamily excludes the address' family): Programmed=False, reason AddressNotUsable
    unusable_addresses: str | None = None

    @property
    def servable(self) -> bool:
        return self.accepted.status


@dataclass
class BackendFacts:
    """One backendRef of one rule: what it resolves to, or why it does not (requests get 500)."""

    rule: int
    index: int
    ref: Ref | None
    port: int | None
    weight: int
    problem: Cond | None  # ResolvedRefs=False reason


@dataclass
class ParentFacts:
    parent_ref: dict[str, Any]  # as declared, with group/kind/namespace filled in
    gateway: Ref
    listeners: list[str]  # names of the listeners it attached to
    accepted: Cond


@dataclass
class RouteFacts:
    ref: Ref
    obj: Obj
    parents: list[ParentFacts]  # only parentRefs naming our Gateways
    backends: list[BackendFacts]
    resolved_refs: Cond
    unsupported: str | None  # why the route as a whole cannot be served


@dataclass
class Facts:
    controller: str
    classes: dict[Ref, Cond]  # our GatewayClasses -> Accepted
    class_versions: dict[Ref, Cond]  # SupportedVersion
    gateways: dict[Ref, GatewayFacts]
    routes: dict[Ref, RouteFacts]
    #: Gateways are served on every address of the gateway's pods (`gwpolicy gateway --pod-addresses`):
    #: spec.addresses names where clients reach them (a load balancer's IP address or hostname),
    #: not an address NGINX binds, so any IPAddress or Hostname is accepted, not only loopback ones
    any_address: bool = False

    def attached(self, gateway: Ref, listener: str) -> list[RouteFacts]:
        """Routes attached to one listener (Accepted for that parent), in a stable order."""
        return [r for r in self.routes.values()
                for p in r.parents if p.gateway == gateway and listener in p.listeners and p.accepted.status]


# ---------------------------------------------------------------- facts

def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def our_classes(index: ObjectIndex, controller: str) -> dict[Ref, Obj]:
    return {gc.ref: gc for gc in index.of_kind(GATEWAY_GROUP, "GatewayClass")
            if _dict(gc.spec).get("controllerName") == controller}


def gateway_facts(index: ObjectIndex, controller: str = GATEWAY_CONTROLLER,
                  grants: ReferenceGrants | None = None, *, any_address: bool = False) -> Facts:
    """Everything status needs to know about our objects, from the objects alone (`any_address`:
    see Facts)."""
    grants = grants if grants is not None else ReferenceGrants(index)
    classes = our_classes(index, controller)
    facts = Facts(controller, {}, {}, {}, {}, any_address)
    version = _bundle_version(index)
    for ref, gc in classes.items():
        facts.classes[ref] = class_acceptance(gc, index)
        facts.class_versions[ref] = version
    for gw in index.of_kind(GATEWAY_GROUP, "Gateway"):
        gc_ref = Ref(GATEWAY_GROUP, "GatewayClass", None, str(_dict(gw.spec).get("gatewayClassName", "")))
        if gc_ref in classes:
            facts.gateways[gw.ref] = gateway_fact(gw, gc_ref, facts, index, grants)
    for route in route_objects(index):
        rf = route_fact(route, facts, index, grants)
        if rf is not None:
            facts.routes[route.ref] = rf
    for gf in facts.gateways.values():
        for lf in gf.listeners.values():
            lf.attached_routes = len(facts.attached(gf.ref, lf.name))
    return facts


def class_acceptance(gc: Obj, index: ObjectIndex | None = None) -> Cond:
    """A GatewayClass of ours' Accepted condition (its Gateways are served only when it is True:
    status and the data plane both ask here): its parametersRef must name an NginxProxy that
    resolves and that this gateway can read (gateway/nginxproxy.py)."""
    params = _dict(gc.spec).get("parametersRef")
    if isinstance(params, dict):
        spec, why = nginxproxy.class_parameters(gc, index if index is not None else ObjectIndex())
        if why is not None:
            return Cond("Accepted", False, "InvalidParameters", why)
        return Cond("Accepted", True, "Accepted", "Handled by the gwpolicy NGINX gateway."
                    + nginxproxy.accepted_note(spec, "spec.parametersRef"))
    return Cond("Accepted", True, "Accepted", "Handled by the gwpolicy NGINX gateway.")


def gateway_fact(gw: Obj, gc_ref: Ref, facts: Facts, index: ObjectIndex, grants: ReferenceGrants) -> GatewayFacts:
    """One Gateway of ours (its class `gc_ref` in `facts.classes`), as gateway_facts makes it; its
    listeners' `attached_routes` are left at 0 (they count routes, which the caller knows)."""
    return _gateway(gw, gc_ref, facts.classes[gc_ref], index, grants, facts.any_address)


def gateway_references(gw: Obj) -> set[Ref]:
    """Every object a Gateway's facts (and its servers in the data plane) may read by reference:
    its listeners' `tls.certificateRefs` (Secrets), `spec.tls.backend.clientCertificateRef` (a
    Secret) and `spec.tls.frontend`'s `caCertificateRefs` (ConfigMaps, default and perPort), with
    the API's defaults for group, kind and namespace. The gateway's state recomputes a Gateway's
    facts when one of these changes (gateway/state.py); whatever kind an entry names is listed,
    so a reference to a wrong kind is found too."""
    spec = _dict(gw.spec)
    out: set[Ref] = set()

    def add(ref: Any, kind: str) -> None:
        if isinstance(ref, dict):
            out.add(Ref(ref.get("group") or CORE_GROUP, ref.get("kind") or kind, ref.get("namespace") or gw.namespace or "",
                        str(ref.get("name", ""))))

    for l in spec.get("listeners") or []:
        for r in _dict(_dict(l).get("tls")).get("certificateRefs") or []:
            add(r, "Secret")
    tls = _dict(spec.get("tls"))
    add(_dict(tls.get("backend")).get("clientCertificateRef"), "Secret")
    frontend = _dict(tls.get("frontend"))
    validations = [_dict(frontend.get("default")).get("validation")]
    validations += [_dict(_dict(pp).get("tls")).get("validation") for pp in frontend.get("perPort") or []]
    for v in validations:
        refs = _dict(v).get("caCertificateRefs")
        for r in refs if isinstance(refs, list) else []:
            add(r, "ConfigMap")
    return out


def _bundle_version(index: ObjectIndex) -> Cond:
    crd = index.crds.get((GATEWAY_GROUP, "Gateway"))
    if crd is None:
        return Cond("SupportedVersion", True, "SupportedVersion", "No Gateway API CRD seen; assuming a supported version.")
    version = (crd.metadata.get("annotations") or {}).get(BUNDLE_ANNOTATION)
    if not isinstance(version, str) or version.startswith(SUPPORTED_BUNDLE_PREFIXES):
        return Cond("SupportedVersion", True, "SupportedVersion", f"Gateway API {version or '(unannotated)'} is supported.")
    return Cond("SupportedVersion", False, "UnsupportedVersion",
                f"Gateway API {version} is not supported (want {', '.join(SUPPORTED_BUNDLE_PREFIXES)}*).")


def listener_verdicts(gw: Obj, index: ObjectIndex, grants: ReferenceGrants) -> dict[str, ListenerFacts]:
    """Listener name -> what status says of it (conflicts included): THE rule of which listeners
    are served. The data plane serves exactly the `servable` ones (gateway/dataplane.py asks here),
    so status and `gwpolicy render` cannot disagree on objects read from files (no CRD validation).
    Names used by more than one listener (the CRD forbids it) make every one of them not Accepted:
    status has one entry per name and could not say which one it describes."""
    raw = [l for l in _dict(gw.spec).get("listeners") or [] if isinstance(l, dict) and isinstance(l.get("name"), str)]
    uses: dict[str, int] = {}
    for l in raw:
        uses[l["name"]] = uses.get(l["name"], 0) + 1
    listeners: dict[str, ListenerFacts] = {}
    http1_only = _http1_only(gw, index)
    for l in raw:
        if l["name"] in listeners:
            continue
        lf = listeners[l["name"]] = _listener(gw, l, index, grants, http1_only)
        if uses[l["name"]] > 1:
            lf.accepted = Cond("Accepted", False, "UnsupportedValue",
                               f"{uses[l['name']]} listeners are named {l['name']!r}; listener names must be unique, "
                               "so none of them is served.")
    _conflicts([l for l in raw if uses[l["name"]] == 1], listeners)
    return listeners


def gateway_acceptance(gw: Obj, listeners: dict[str, ListenerFacts], gateway_class: Cond,
                       any_address: bool = False, index: ObjectIndex | None = None) -> Cond:
    """The Gateway's Accepted condition from its GatewayClass' (`class_acceptance`), its spec and
    its listeners' verdicts (the data plane serves nothing of a Gateway that is not accepted)."""
    if not gateway_class.status:
        return Cond("Accepted", False, "Pending",
                    f"GatewayClass {str(_dict(gw.spec).get('gatewayClassName', ''))} is not accepted: {gateway_class.message}")
    spec = _dict(gw.spec)
    accepted = Cond("Accepted", True, "Accepted", "Accepted by the gwpolicy NGINX gateway.")
    addresses = [a for a in spec.get("addresses") or [] if isinstance(a, dict)]
    bad_addresses = [a for a in addresses if not _usable_address(a, any_address)]
    invalid = [n for n, lf in listeners.items() if not lf.accepted.status]
    params, why = nginxproxy.gateway_parameters(gw, index if index is not None else ObjectIndex())
    if why is not None:
        accepted = Cond("Accepted", False, "InvalidParameters", why)
    elif bad_addresses:
        a = bad_addresses[0]
        accepted = Cond("Accepted", False, "UnsupportedAddress",
                        f"spec.addresses: {a.get('type') or 'IPAddress'} {a.get('value')!r} is not an IP address or a "
                        "hostname (where clients reach the gateway's pods)" if any_address else
                        f"spec.addresses: {a.get('type') or 'IPAddress'} {a.get('value')!r} is not a loopback IP address "
                        "(this gateway serves on 127.0.0.0/8 only)")
    elif listeners and len(invalid) == len(listeners):
        accepted = Cond("Accepted", False, "ListenersNotValid", f"No listener is valid: {_named(invalid, listeners)}.")
    elif invalid:  # the CRD: say which listeners are conflicted (not valid) and which are accepted
        valid = [n for n in listeners if n not in invalid]
        accepted = Cond("Accepted", True, "ListenersNotValid", f"Some listeners are not valid: {_named(invalid, listeners)}; "
                                                              f"accepted: {', '.join(valid)}.")
    return accepted


def params_note(gw: Obj, index: ObjectIndex) -> str:
    """What a Gateway's accepted condition says of its own NginxProxy ("" without one)."""
    return nginxproxy.accepted_note(nginxproxy.gateway_parameters(gw, index)[0], "spec.infrastructure.parametersRef")


def _gateway(gw: Obj, gc_ref: Ref, gateway_class: Cond, index: ObjectIndex, grants: ReferenceGrants,
             any_address: bool = False) -> GatewayFacts:
    spec = _dict(gw.spec)
    listeners = listener_verdicts(gw, index, grants)
    accepted = gateway_acceptance(gw, listeners, gateway_class, any_address, index)
    if accepted.status and params_note(gw, index):
        accepted = Cond(accepted.type, True, accepted.reason, accepted.message + params_note(gw, index))
    addresses = [a for a in spec.get("addresses") or [] if isinstance(a, dict)]

    resolved = None
    backend = _dict(_dict(spec.get("tls")).get("backend"))
    if isinstance(backend.get("clientCertificateRef"), dict):
        got = certificate_secret(gw, backend["clientCertificateRef"], index, grants, "spec.tls.backend.clientCertificateRef")
        if isinstance(got, Certificate):  # resolved, but said plainly: NGINX does not present it (not in supportedFeatures)
            resolved = Cond("ResolvedRefs", True, "ResolvedRefs",
                            "The backend client certificate is resolved, but this data plane does not present client "
                            "certificates to backends (GatewayBackendClientCertificate is not supported).")
        else:
            reason = "RefNotPermitted" if got.kind == "RefNotPermitted" else "InvalidClientCertificateRef"
            resolved = Cond("ResolvedRefs", False, reason, got.message)
    return GatewayFacts(gw.ref, gw, gc_ref, listeners, accepted, resolved, addresses,
                        unusable_addresses(gw, index) if accepted.status else None)


def unusable_addresses(gw: Obj, index: ObjectIndex) -> str | None:
    """The message of a Gateway whose spec.addresses names IP addresses of a family its
    NginxProxy's `ipFamily` excludes (None: there are none): NGINX does not listen on them."""
    family = nginxproxy.ip_family(nginxproxy.effective(gw, index))
    if family == "dual":
        return None
    other = [str(a.get("value")) for a in _dict(gw.spec).get("addresses") or [] if isinstance(a, dict)
             and (a.get("type") or "IPAddress") == "IPAddress"
             and not nginxproxy.family_allows(family, nginxproxy.address_family(a.get("value")))]
    if not other:
        return None
    return (f"spec.addresses {', '.join(other)}: not {'IPv4' if family == 'ipv4' else 'IPv6'}, and the Gateway's "
            f"NginxProxy sets ipFamily {family}, so NGINX does not listen there; remove the address or set "
            f"ipFamily to dual")


def _named(names: list[str], listeners: dict[str, ListenerFacts]) -> str:
    """Listener names, each with the reason it is not accepted."""
    return ", ".join(f"{n} ({listeners[n].accepted.reason})" for n in names)


def _usable_address(a: dict[str, Any], any_address: bool) -> bool:
    """A spec.addresses entry this gateway can stand for: a loopback IP address it binds, or with
    `any_address` any IP address or hostname (the CRD checks a hostname's form)."""
    kind, value = a.get("type") or "IPAddress", a.get("value")
    if not any_address:
        return kind == "IPAddress" and _is_loopback(value)
    if kind == "Hostname":
        return isinstance(value, str) and bool(value)
    return kind == "IPAddress" and is_ip_address(value)


def is_ip_address(value: Any) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        return False
    return True


def _is_loopback(value: Any) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(str(value)).is_loopback
    except ValueError:
        return False


def _http1_only(gw: Obj, index: ObjectIndex) -> bool:
    """Does the Gateway's NginxProxy set disableHTTP2 (no listener of it speaks HTTP/2)?"""
    return nginxproxy.effective(gw, index).get("disableHTTP2") is True


def served_kinds(protocol: str, http1_only: bool = False) -> tuple[str, ...]:
    """The route kinds a listener of `protocol` serves; `http1_only` (its Gateway's NginxProxy sets
    disableHTTP2): GRPCRoute needs HTTP/2, so it is not among them."""
    kinds = SUPPORTED_ROUTE_KINDS.get(protocol, ())
    return tuple(k for k in kinds if k != grpcroute.KIND) if http1_only else kinds


def _listener(gw: Obj, l: dict[str, Any], index: ObjectIndex, grants: ReferenceGrants,
              http1_only: bool = False) -> ListenerFacts:
    raw_protocol, raw_port, raw_hostname = l.get("protocol"), l.get("port"), l.get("hostname")
    protocol = raw_protocol if isinstance(raw_protocol, str) else ""
    port = raw_port if isinstance(raw_port, int) else None
    hostname = raw_hostname if isinstance(raw_hostname, str) else None
    ok_accepted = Cond("Accepted", True, "Accepted", "Listener is valid.")
    ok_refs = Cond("ResolvedRefs", True, "ResolvedRefs", "All references are resolved.")
    no_conflict = Cond("Conflicted", False, "NoConflicts", "No conflicts.")
    if protocol not in SUPPORTED_PROTOCOLS:
        return ListenerFacts(l["name"], port, protocol, hostname, [],
                             Cond("Accepted", False, "UnsupportedProtocol",
                                  f"Protocol {protocol!r} is not supported (this gateway serves {', '.join(SUPPORTED_PROTOCOLS)})."),
                             ok_refs, no_conflict)
    lf = ListenerFacts(l["name"], port, protocol, hostname, [], ok_accepted, ok_refs, no_conflict)
    if port is None or isinstance(port, bool) or not 1 <= port <= 65535:
        lf.port = None  # takes part in no conflict
        lf.accepted = Cond("Accepted", False, "UnsupportedValue", f"port {l.get('port')!r} is not a port number (1-65535).")
        return lf
    if hostname is not None and not valid_hostname(hostname):
        lf.accepted = Cond("Accepted", False, "UnsupportedValue", f"hostname {hostname!r} is not a hostname.")
        return lf
    # supportedKinds: the kinds asked for that we serve; none asked means all we serve for the protocol
    allowed = _dict(l.get("allowedRoutes"))
    kinds = allowed.get("kinds")
    serveable = served_kinds(protocol, http1_only)
    if isinstance(kinds, list) and kinds:
        bad = []
        for k in kinds:
            k = _dict(k)
            group = k.get("group") if k.get("group") is not None else GATEWAY_GROUP
            if group == GATEWAY_GROUP and k.get("kind") in serveable:
                if {"group": GATEWAY_GROUP, "kind": k["kind"]} not in lf.supported_kinds:
                    lf.supported_kinds.append({"group": GATEWAY_GROUP, "kind": k["kind"]})
            else:
                bad.append(f"{group}/{k.get('kind')}")
        if bad:
            lf.resolved_refs = Cond("ResolvedRefs", False, "InvalidRouteKinds",
                                    f"Route kinds not supported on a {protocol} listener: {', '.join(bad)}"
                                    + (" (the Gateway's NginxProxy sets disableHTTP2, and gRPC needs HTTP/2)."
                                       if http1_only and f"{GATEWAY_GROUP}/{grpcroute.KIND}" in bad else "."))
    else:
        lf.supported_kinds = [{"group": GATEWAY_GROUP, "kind": k} for k in serveable]
    if protocol == "TLS":
        mode = _dict(l.get("tls")).get("mode") or "Terminate"
        if mode != "Passthrough":
            lf.accepted = Cond("Accepted", False, "UnsupportedValue",
                               f"tls.mode {mode!r} is not supported on a TLS listener (Passthrough is: this gateway "
                               "forwards TLS connections by SNI without terminating them).")
        return lf
    if protocol == "HTTPS" and lf.resolved_refs.status:
        tls = _dict(l.get("tls"))
        if (tls.get("mode") or "Terminate") != "Terminate":
            lf.accepted = Cond("Accepted", False, "UnsupportedValue", f"tls.mode {tls.get('mode')!r} is not supported on HTTPS.")
            return lf
        refs = [r for r in tls.get("certificateRefs") or [] if isinstance(r, dict)]
        if not refs:
            lf.resolved_refs = Cond("ResolvedRefs", False, "InvalidCertificateRef", "tls.certificateRefs is empty.")
        for i, ref in enumerate(refs):
            got = certificate_secret(gw, ref, index, grants, f"tls.certificateRefs[{i}]")
            if isinstance(got, SecretProblem):
                reason = "RefNotPermitted" if got.kind == "RefNotPermitted" else "InvalidCertificateRef"
                lf.resolved_refs = Cond("ResolvedRefs", False, reason, got.message)
                lf.certificates = []
                break
            lf.certificates.append(got)
        # frontend client certificate validation (gateway/frontendtls.py, shared with the data plane)
        validation = frontendtls.listener_validation(gw, port, index, grants) if lf.resolved_refs.status else None
        if validation is not None:
            lf.client_cas = list(validation.cas)
            lf.client_mode = validation.mode
            lf.client_bundle = validation.bundle
            if validation.problems:
                reason, msg = validation.problems[0]
                lf.resolved_refs = Cond("ResolvedRefs", False, reason, msg)
                if not validation.cas or reason == "UnsupportedValue":
                    lf.accepted = Cond("Accepted", False, frontendtls.NO_VALID_CA if reason != "UnsupportedValue" else reason, msg)
                    lf.client_cas = []
                    lf.client_bundle = b""
    return lf


def certificate_secret(owner: Obj, ref: dict[str, Any], index: ObjectIndex, grants: ReferenceGrants,
                       where: str) -> Certificate | SecretProblem:
    """A Secret reference of a Gateway, resolved to the certificate the data plane serves, or why
    it is unusable: the one place that decides (the data plane takes `ListenerFacts.certificates`)."""
    group = ref.get("group") or CORE_GROUP
    kind = ref.get("kind") or "Secret"
    ns = ref.get("namespace") or owner.namespace or ""
    name = str(ref.get("name", ""))
    if group != CORE_GROUP or kind != "Secret":
        return SecretProblem("InvalidKind", f"{where}: {group + '/' if group else ''}{kind} is not a Secret.")
    bad_name = names.reference_problem("Secret", ns, name)
    if bad_name is not None:  # no such Secret can exist (and its name is part of a file name NGINX reads)
        return SecretProblem("NotFound", f"{where}: Secret {bad_name}.")
    if ns != owner.namespace and not grants.allows(GATEWAY_GROUP, "Gateway", owner.namespace or "", CORE_GROUP, "Secret", ns, name):
        return SecretProblem("RefNotPermitted", f"{where}: Secret {ns}/{name} is in another namespace and no ReferenceGrant allows it.")
    secret_ref = Ref(CORE_GROUP, "Secret", ns, name)
    secret = index.by_ref.get(secret_ref)
    if secret is None:
        return SecretProblem("NotFound", f"{where}: Secret {ns}/{name} does not exist.")
    pem = tls_pem(secret)  # `data` or `stringData`
    if pem is None:
        return SecretProblem("Malformed", f"{where}: Secret {ns}/{name} has no PEM certificate and key in tls.crt and tls.key.")
    problem = tls_problem(secret)
    if problem is not None:  # NGINX would refuse the whole configuration for it
        return SecretProblem("Malformed", f"{where}: Secret {ns}/{name}: {problem}.")
    return Certificate(secret_ref, pem)


def _conflicts(raw: list[dict[str, Any]], listeners: dict[str, ListenerFacts]) -> None:
    """Conflicted listeners (gateway/listeners.py, the data plane's rule too): every listener of a
    conflict, none picked as the winner, is Conflicted and not Accepted."""
    found = listener_conflicts(Candidate(lf.name, lf.port, lf.protocol, lf.hostname or "")
                               for lf in (listeners[l["name"]] for l in raw) if lf.accepted.status and lf.port is not None)
    for name, conflict in found.items():
        lf = listeners[name]
        lf.conflicted = Cond("Conflicted", True, conflict.reason, conflict.message)
        lf.accepted = Cond("Accepted", False, conflict.reason, conflict.message)


def route_fact(route: Obj, facts: Facts, index: ObjectIndex, grants: ReferenceGrants) -> RouteFacts | None:
    spec = _dict(route.spec)
    parents: list[ParentFacts] = []
    if route.kind == grpcroute.KIND:
        unsupported = grpcroute.problem(spec) or _unsupported(grpcroute.http_spec(spec))
    else:
        unsupported = _unsupported(spec)
    mixed = route.kind in _MIXED and bool(index.of_kind(GATEWAY_GROUP, _MIXED[route.kind]))
    for pref in spec.get("parentRefs") or []:
        if not isinstance(pref, dict):
            continue
        gw_ref = parent_gateway(route, pref)
        if gw_ref is None or gw_ref not in facts.gateways:
            continue  # not ours (another class, or no such Gateway): we say nothing about it
        gf = facts.gateways[gw_ref]
        full = dict(pref)
        full["group"] = GATEWAY_GROUP
        full["kind"] = "Gateway"
        full["namespace"] = gw_ref.namespace
        declared = [l for l in _dict(gf.obj.spec).get("listeners") or []
                    if isinstance(l, dict) and l.get("name") in gf.listeners]
        attached, why = parent_listeners(route, pref, gf.obj, declared, index)
        conflicted = ""
        if why is None:  # attached only to listeners that are not valid: no usable parent
            attached = [l for l in attached if gf.listeners[l["name"]].accepted.status]
            why = None if attached else "NoMatchingParent"
            served = [l for l in attached if route.kind in SUPPORTED_ROUTE_KINDS.get(gf.listeners[l["name"]].protocol, ())]
            if attached and not served:  # e.g. allowedRoutes.kinds names HTTPRoute on a TLS listener
                why = "NotAllowedByListeners"
            attached = served
            if mixed and attached:  # an HTTPRoute and a GRPCRoute on one hostname of a listener: the older keeps it
                verdicts = [(l, grpcroute.conflict(route, gf, l, index, lambda o, g, l: _attaches(o, g, l, index)))
                            for l in attached]
                lost = [c for _, c in verdicts if c]
                attached = [l for l, c in verdicts if c is None]
                if lost and not attached:
                    why, conflicted = "Conflicted", lost[0]
        if unsupported is not None:
            accepted = Cond("Accepted", False, "UnsupportedValue", unsupported)
            attached = []
        elif not gf.accepted.status:
            accepted = Cond("Accepted", False, "NoMatchingParent",
                            f"Gateway {gw_ref.namespace}/{gw_ref.name} is not accepted: {gf.accepted.message}")
            attached = []
        elif route.kind == grpcroute.KIND and _http1_only(gf.obj, index):
            accepted = Cond("Accepted", False, "NotAllowedByListeners",
                            f"Gateway {gw_ref.namespace}/{gw_ref.name}: its NginxProxy sets disableHTTP2, and gRPC "
                            "needs HTTP/2: no listener of the Gateway lists GRPCRoute in its supportedKinds")
            attached = []
        elif why is not None:
            accepted = Cond("Accepted", False, why, conflicted if why == "Conflicted" else _why(why, pref, gf))
        else:
            names = ", ".join(l["name"] for l in attached)
            accepted = Cond("Accepted", True, "Accepted",
                            f"Accepted by listener{'s' if len(attached) > 1 else ''} {names}.{_route_notes(spec)}"
                            f"{_mirror_notes(route, spec, index)}")
        parents.append(ParentFacts(full, gw_ref, [l["name"] for l in attached], accepted))
    if not parents:
        return None
    backends = _backends(route, spec, index, grants)
    problems = [b.problem for b in backends if b.problem is not None] + _mirror_problems(route, spec, index, grants)
    resolved = problems[0] if problems else Cond("ResolvedRefs", True, "ResolvedRefs", "All references are resolved.")
    return RouteFacts(route.ref, route, parents, backends, resolved, unsupported)


#: the route kind each of HTTPRoute and GRPCRoute may conflict with on a listener's hostname
_MIXED = {"HTTPRoute": grpcroute.KIND, grpcroute.KIND: "HTTPRoute"}


def _attaches(other: Obj, gf: GatewayFacts, listener: dict[str, Any], index: ObjectIndex) -> bool:
    """Does `other` (a route) attach to that listener of that Gateway and get served there (its
    kind allowed, nothing unsupported in it)? The conflict rule between HTTPRoute and GRPCRoute."""
    lf = gf.listeners.get(listener.get("name", ""))
    if lf is None or other.kind not in SUPPORTED_ROUTE_KINDS.get(lf.protocol, ()):
        return False
    spec = _dict(other.spec)
    if (grpcroute.problem(spec) or _unsupported(grpcroute.http_spec(spec))) if other.kind == grpcroute.KIND \
            else _unsupported(spec):
        return False
    declared = [l for l in _dict(gf.obj.spec).get("listeners") or [] if isinstance(l, dict) and l.get("name") in gf.listeners]
    for pref in spec.get("parentRefs") or []:
        if isinstance(pref, dict) and parent_gateway(other, pref) == gf.ref:
            got, why = parent_listeners(other, pref, gf.obj, declared, index)
            if why is None and any(l.get("name") == listener.get("name") for l in got):
                return True
    return False


def _route_notes(spec: dict[str, Any]) -> str:
    """The route's own fields NGINX honours only approximately (or not at all), and how
    (policyconf.route_field_notes): said in the Accepted message, which stays True."""
    notes = [f"{f}: {how}" for i, rule in enumerate(r for r in spec.get("rules") or [] if isinstance(r, dict))
             for f, how in policyconf.route_field_notes(rule, f"spec.rules[{i}]")]
    return (" " + "; ".join(notes) + ".") if notes else ""


def _why(reason: str, pref: dict[str, Any], gf: GatewayFacts) -> str:
    if reason == "NoMatchingParent":
        what = []
        if pref.get("sectionName") is not None:
            what.append(f"sectionName {pref['sectionName']!r}")
        if pref.get("port") is not None:
            what.append(f"port {pref['port']}")
        return f"Gateway {gf.ref.namespace}/{gf.ref.name} has no valid listener with {' and '.join(what) or 'any name'}."
    if reason == "NotAllowedByListeners":
        return "No listener's allowedRoutes admits this route (its namespace or kind)."
    return "No listener hostname intersects the route's hostnames."


def _unsupported(spec: dict[str, Any]) -> str | None:
    for i, rule in enumerate(r for r in spec.get("rules") or [] if isinstance(r, dict)):
        for m_i, m in enumerate(x for x in rule.get("matches") or [] if isinstance(x, dict)):
            ptype = _dict(m.get("path")).get("type") or "PathPrefix"
            if m.get("path") is not None and ptype not in SUPPORTED_PATH_TYPES:
                return f"spec.rules[{i}].matches[{m_i}].path.type {ptype} is not supported by this data plane."
            if ptype == "RegularExpression":  # the data plane's own check (pathregex): it leaves such a match out
                value = _dict(m.get("path")).get("value")
                why = pathregex.problem(value if isinstance(value, str) else "/")  # the data plane's default too
                if why is not None:
                    return f"spec.rules[{i}].matches[{m_i}].path.value: {why}."
            bad = pathregex.condition_problem(m)  # header and query regexes: the same dialect
            if bad is not None:
                return f"spec.rules[{i}].matches[{m_i}].{bad[0]}: {bad[1]}."
        filters = list(rule.get("filters") or [])
        for b in rule.get("backendRefs") or []:
            filters += list(_dict(b).get("filters") or [])
        for f in filters:
            ftype = _dict(f).get("type")
            if ftype not in SUPPORTED_FILTERS:
                ext = _dict(_dict(f).get("extensionRef"))
                if ftype == "ExtensionRef" and (ext.get("group"), ext.get("kind")) == ("gateway.nginx.org", "SnippetsFilter"):
                    return (f"spec.rules[{i}]: SnippetsFilter {ext.get('name')} is refused: it writes raw NGINX "
                            "configuration, which tenants may not do on this gateway.")
                return f"spec.rules[{i}]: filter type {ftype} is not supported by this data plane."
            why = redirect_problem(_dict(_dict(f).get("requestRedirect"))) if ftype == "RequestRedirect" else None
            if why is not None:
                return f"spec.rules[{i}]: {why}."
    for name, why in routevalues.problems(spec)[:1]:  # a value NGINX 1.22 could not read
        return f"{name}: {why}."
    return None


def _backends(route: Obj, spec: dict[str, Any], index: ObjectIndex, grants: ReferenceGrants) -> list[BackendFacts]:
    out = []
    for ri, rule in enumerate(r for r in spec.get("rules") or [] if isinstance(r, dict)):
        for bi, b in enumerate(x for x in rule.get("backendRefs") or [] if isinstance(x, dict)):
            out.append(_backend(route, ri, bi, b, index, grants))
    return out


def _mirror_problems(route: Obj, spec: dict[str, Any], index: ObjectIndex, grants: ReferenceGrants) -> list[Cond]:
    """ResolvedRefs problems of RequestMirror backendRefs (Gateway API: such a mirror is dropped and
    the route says ResolvedRefs=False; the requests themselves are still served)."""
    out = []
    for ri, rule in enumerate(r for r in spec.get("rules") or [] if isinstance(r, dict)):
        for fi, f in enumerate(rule.get("filters") or []):
            if isinstance(f, dict) and f.get("type") == "RequestMirror":
                b = _dict(_dict(f.get("requestMirror")).get("backendRef"))
                got = _backend(route, ri, fi, b, index, grants, f"spec.rules[{ri}].filters[{fi}].requestMirror.backendRef")
                if got.problem is not None:
                    out.append(got.problem)
    return out


def _mirror_notes(route: Obj, spec: dict[str, Any], index: ObjectIndex) -> str:
    """Mirrors the data plane does not send although they resolve (said in Accepted, which stays
    True): to a Service with a BackendTLSPolicy (no policy applies to mirrored copies, and a
    copy in plain HTTP to a TLS backend would be wrong)."""
    mirrors = [(ri, fi, _dict(_dict(f.get("requestMirror")).get("backendRef")))
               for ri, rule in enumerate(r for r in spec.get("rules") or [] if isinstance(r, dict))
               for fi, f in enumerate(rule.get("filters") or []) if isinstance(f, dict) and f.get("type") == "RequestMirror"]
    if not mirrors:  # the common case: no look at the policies
        return ""
    tls_services = {(p.namespace, t.get("name")) for p in index.of_kind(GATEWAY_GROUP, "BackendTLSPolicy")
                    for t in _dict(p.spec).get("targetRefs") or [] if isinstance(t, dict)
                    and (t.get("group") or CORE_GROUP) == CORE_GROUP and (t.get("kind") or "Service") == "Service"}
    notes = [f"spec.rules[{ri}].filters[{fi}]: no request is mirrored to Service {b.get('name')}: it has a "
             "BackendTLSPolicy, which this data plane does not apply to mirrored requests"
             for ri, fi, b in mirrors if (b.get("namespace") or route.namespace, b.get("name")) in tls_services]
    return (" " + "; ".join(notes) + ".") if notes else ""


def _backend(route: Obj, ri: int, bi: int, b: dict[str, Any], index: ObjectIndex, grants: ReferenceGrants,
             where: str = "") -> BackendFacts:
    group = b.get("group") or CORE_GROUP
    kind = b.get("kind") or "Service"
    ns = b.get("namespace") or route.namespace or ""
    name = str(b.get("name", ""))
    raw_port, raw_weight = b.get("port"), b.get("weight")
    port = raw_port if isinstance(raw_port, int) else None
    weight = raw_weight if isinstance(raw_weight, int) else 1
    where = where or f"spec.rules[{ri}].backendRefs[{bi}]"
    ref = Ref(group, kind, ns, name)
    if group != CORE_GROUP or kind != "Service":
        return BackendFacts(ri, bi, None, port, weight, Cond("ResolvedRefs", False, "InvalidKind",
                                                             f"{where}: {group + '/' if group else ''}{kind} is not a supported backend kind (Service)."))
    bad_name = names.reference_problem("Service", ns, name)
    if bad_name is not None:
        return BackendFacts(ri, bi, None, port, weight, Cond("ResolvedRefs", False, "BackendNotFound", f"{where}: Service {bad_name}."))
    if ns != route.namespace and not grants.allows(GATEWAY_GROUP, route.kind, route.namespace or "", CORE_GROUP, "Service", ns, name):
        return BackendFacts(ri, bi, None, port, weight, Cond("ResolvedRefs", False, "RefNotPermitted",
                                                             f"{where}: Service {ns}/{name} is in another namespace and no ReferenceGrant allows it."))
    svc = index.by_ref.get(ref)
    if svc is None:
        return BackendFacts(ri, bi, None, port, weight, Cond("ResolvedRefs", False, "BackendNotFound",
                                                             f"{where}: Service {ns}/{name} does not exist."))
    ports = [p.get("port") for p in _dict(svc.spec).get("ports") or [] if isinstance(p, dict)]
    if port is None or port not in ports:
        return BackendFacts(ri, bi, None, port, weight, Cond("ResolvedRefs", False, "BackendNotFound",
                                                             f"{where}: Service {ns}/{name} has no port {port}."))
    return BackendFacts(ri, bi, ref, port, weight, None)


def dataplane_objects(raws: Iterable[dict[str, Any]], facts: Facts) -> list[dict[str, Any]]:
    """The objects the data plane is built from, so that it serves exactly what status says: our
    Gateways keep only the listeners status accepts (none when the Gateway is not accepted), and
    routes keep only the parentRefs to our Gateways that status accepts (a route that is not
    accepted is not served: its requests get the 404 of no route)."""
    out = []
    for raw in raws:
        meta = raw.get("metadata") or {}
        kind = raw.get("kind")
        spec = raw.get("spec")
        if kind == "Gateway" and isinstance(spec, dict):
            gf = facts.gateways.get(Ref(GATEWAY_GROUP, "Gateway", meta.get("namespace"), str(meta.get("name", ""))))
            if gf is not None:
                keep = [l for l in spec.get("listeners") or [] if isinstance(l, dict)
                        and gf.accepted.status and l.get("name") in gf.listeners and gf.listeners[l["name"]].accepted.status]
                if len(keep) != len(spec.get("listeners") or []):
                    raw = dict(raw, spec=dict(spec, listeners=keep))
        elif kind in ROUTE_KINDS and isinstance(spec, dict):
            ref = Ref(GATEWAY_GROUP, kind, meta.get("namespace") or "default", str(meta.get("name", "")))
            rf = facts.routes.get(ref)
            if rf is not None:
                verdicts = iter(rf.parents)  # in parentRef order, ours only (see route_fact)
                route = Obj(raw, ref, "", "")
                keep = []
                for p in spec.get("parentRefs") or []:
                    gw = parent_gateway(route, p) if isinstance(p, dict) else None
                    if gw is not None and gw in facts.gateways:
                        if next(verdicts).accepted.status:
                            keep.append(p)
                    else:
                        keep.append(p)
                if len(keep) != len(spec.get("parentRefs") or []):
                    raw = dict(raw, spec=dict(spec, parentRefs=keep))
        out.append(raw)
    return out
