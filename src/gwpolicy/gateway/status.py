"""GEP-1364 status of the objects the gateway serves: GatewayClass, Gateway and its listeners, and
each HTTPRoute and TLSRoute parent that names one of our Gateways.

Pure: `gateway_facts(index)` says, from the objects alone, what is valid, what attaches where and
why not (route attachment is the engine's, `topology.parent_listeners`); `Programming` is what the
edge reports about NGINX (which objects, at which generation, the running configuration holds, and
the last failure); `desired_status` turns both into the `status` an object should carry, keeping
what other controllers wrote (their `status.parents` entries, the policy controller's
`gwpolicy.io/*Affected` conditions) where it is. Computing it over an object that already carries
it changes nothing: transition times move only when a condition's status changes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable

from gwpolicy import names
from gwpolicy.gateway import frontendtls, pathregex
from gwpolicy.gateway.dataplane import SUPPORTED_FILTERS as RENDERED_FILTERS, redirect_problem
from gwpolicy.gateway.isolate import without_paths
from gwpolicy.gateway.listeners import Candidate, conflicts as listener_conflicts, tls_pem, tls_problem, valid_hostname
from gwpolicy.grants import ReferenceGrants
from gwpolicy.model import Obj, ObjectIndex
from gwpolicy.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.status import condition, find_condition
from gwpolicy.topology import parent_gateway, parent_listeners

GATEWAY_CONTROLLER = "gwpolicy.io/gateway-controller"
#: GEP-713 "GatewayClass status Extension Types listing": the API has no field yet, so an annotation
#: on the GatewayClass lists the policy kinds this gateway enforces, as `Kind.group`, comma-separated
POLICY_KINDS_ANNOTATION = "gateway.gwpolicy.io/supported-policy-kinds"
#: Gateway API bundle versions (CRD annotation) this controller is written against
SUPPORTED_BUNDLE_PREFIXES = ("v1.", "v0.0.0-dev")
BUNDLE_ANNOTATION = "gateway.networking.k8s.io/bundle-version"

#: listener protocols this data plane serves
SUPPORTED_PROTOCOLS = ("HTTP", "HTTPS", "TLS")
#: route kinds this data plane serves, per protocol (TLS: passthrough only)
SUPPORTED_ROUTE_KINDS: dict[str, tuple[str, ...]] = {"HTTP": ("HTTPRoute",), "HTTPS": ("HTTPRoute",), "TLS": ("TLSRoute",)}
#: the route kinds whose status this gateway writes, in the order facts list them
ROUTE_KINDS = ("HTTPRoute", "TLSRoute")


def route_objects(index: ObjectIndex) -> list[Obj]:
    """Every route of a kind this gateway serves, in the order facts list them."""
    return [r for kind in ROUTE_KINDS for r in index.of_kind(GATEWAY_GROUP, kind)]


#: HTTPRoute filter types the data plane renders (its own list); anything else makes the route
#: Accepted=False/UnsupportedValue
SUPPORTED_FILTERS = frozenset(RENDERED_FILTERS)
SUPPORTED_PATH_TYPES = frozenset({"Exact", "PathPrefix", "RegularExpression"})

#: Gateway API features (conformance names) this gateway claims in GatewayClass.status.supportedFeatures;
#: the conformance harness checks that every case needing only these passes (tests/gateway_conformance)
SUPPORTED_FEATURES = (
    "BackendTLSPolicy", "Gateway", "GatewayFrontendClientCertificateValidation", "HTTPRoute",
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

    def attached(self, gateway: Ref, listener: str) -> list[RouteFacts]:
        """Routes attached to one listener (Accepted for that parent), in a stable order."""
        return [r for r in self.routes.values()
                for p in r.parents if p.gateway == gateway and listener in p.listeners and p.accepted.status]


@dataclass
class Programming:
    """What NGINX runs, as the edge saw it after its last apply.

    `generations`: each object the running configuration was built from, with its
    metadata.generation then; `error`: why the last configuration could not be applied (the previous
    one keeps serving), or None; `addresses`: Gateway -> the addresses it is served on;
    `listeners`: listener Ref -> (rendered, reason, message) as the data plane model built it (a
    listener the data plane could not render is not Programmed, whatever the rest says).
    """

    generations: dict[Ref, int | None] = field(default_factory=dict)
    error: str | None = None
    addresses: dict[Ref, list[str]] = field(default_factory=dict)
    listeners: dict[Ref, tuple[bool, str, str]] = field(default_factory=dict)
    #: routes the data plane left out (NGINX refused them, or their namespace's budget is spent):
    #: route -> (reason, message) of their parents' Accepted=False
    left_out: dict[Ref, tuple[str, str]] = field(default_factory=dict)

    def runs(self, obj: Obj) -> bool:
        return obj.ref in self.generations and self.generations[obj.ref] == obj.generation


# ---------------------------------------------------------------- facts

def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def our_classes(index: ObjectIndex, controller: str) -> dict[Ref, Obj]:
    return {gc.ref: gc for gc in index.of_kind(GATEWAY_GROUP, "GatewayClass")
            if _dict(gc.spec).get("controllerName") == controller}


def gateway_facts(index: ObjectIndex, controller: str = GATEWAY_CONTROLLER,
                  grants: ReferenceGrants | None = None) -> Facts:
    """Everything status needs to know about our objects, from the objects alone."""
    grants = grants if grants is not None else ReferenceGrants(index)
    classes = our_classes(index, controller)
    facts = Facts(controller, {}, {}, {}, {})
    version = _bundle_version(index)
    for ref, gc in classes.items():
        facts.classes[ref] = class_acceptance(gc)
        facts.class_versions[ref] = version
    for gw in index.of_kind(GATEWAY_GROUP, "Gateway"):
        gc_ref = Ref(GATEWAY_GROUP, "GatewayClass", None, str(_dict(gw.spec).get("gatewayClassName", "")))
        if gc_ref in classes:
            facts.gateways[gw.ref] = gateway_fact(gw, gc_ref, facts, index, grants)
    for route in route_objects(index):
        rf = _route(route, facts, index, grants)
        if rf is not None:
            facts.routes[route.ref] = rf
    for gf in facts.gateways.values():
        for lf in gf.listeners.values():
            lf.attached_routes = len(facts.attached(gf.ref, lf.name))
    return facts


def class_acceptance(gc: Obj) -> Cond:
    """A GatewayClass of ours' Accepted condition (its Gateways are served only when it is True:
    status and the data plane both ask here)."""
    params = _dict(gc.spec).get("parametersRef")
    if isinstance(params, dict):
        return Cond("Accepted", False, "InvalidParameters",
                    f"parametersRef {params.get('kind')}/{params.get('name')}: this gateway takes no parameters")
    return Cond("Accepted", True, "Accepted", "Handled by the gwpolicy NGINX gateway.")


def gateway_fact(gw: Obj, gc_ref: Ref, facts: Facts, index: ObjectIndex, grants: ReferenceGrants) -> GatewayFacts:
    """One Gateway of ours (its class `gc_ref` in `facts.classes`), as gateway_facts makes it; its
    listeners' `attached_routes` are left at 0 (they count routes, which the caller knows)."""
    return _gateway(gw, gc_ref, facts.classes[gc_ref], index, grants)


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
    for l in raw:
        if l["name"] in listeners:
            continue
        lf = listeners[l["name"]] = _listener(gw, l, index, grants)
        if uses[l["name"]] > 1:
            lf.accepted = Cond("Accepted", False, "UnsupportedValue",
                               f"{uses[l['name']]} listeners are named {l['name']!r}; listener names must be unique, "
                               "so none of them is served.")
    _conflicts([l for l in raw if uses[l["name"]] == 1], listeners)
    return listeners


def gateway_acceptance(gw: Obj, listeners: dict[str, ListenerFacts], gateway_class: Cond) -> Cond:
    """The Gateway's Accepted condition from its GatewayClass' (`class_acceptance`), its spec and
    its listeners' verdicts (the data plane serves nothing of a Gateway that is not accepted)."""
    if not gateway_class.status:
        return Cond("Accepted", False, "Pending",
                    f"GatewayClass {str(_dict(gw.spec).get('gatewayClassName', ''))} is not accepted: {gateway_class.message}")
    spec = _dict(gw.spec)
    accepted = Cond("Accepted", True, "Accepted", "Accepted by the gwpolicy NGINX gateway.")
    infra = _dict(spec.get("infrastructure"))
    addresses = [a for a in spec.get("addresses") or [] if isinstance(a, dict)]
    bad_addresses = [a for a in addresses if (a.get("type") or "IPAddress") != "IPAddress"
                     or not _is_loopback(a.get("value"))]
    invalid = [n for n, lf in listeners.items() if not lf.accepted.status]
    if isinstance(infra.get("parametersRef"), dict):
        p = infra["parametersRef"]
        accepted = Cond("Accepted", False, "InvalidParameters",
                        f"spec.infrastructure.parametersRef {p.get('group')}/{p.get('kind')} {p.get('name')}: "
                        "this gateway takes no parameters")
    elif bad_addresses:
        a = bad_addresses[0]
        accepted = Cond("Accepted", False, "UnsupportedAddress",
                        f"spec.addresses: {a.get('type') or 'IPAddress'} {a.get('value')!r} is not a loopback IP address "
                        "(this gateway serves on 127.0.0.0/8 only)")
    elif listeners and len(invalid) == len(listeners):
        accepted = Cond("Accepted", False, "ListenersNotValid", f"No listener is valid: {_named(invalid, listeners)}.")
    elif invalid:  # the CRD: say which listeners are conflicted (not valid) and which are accepted
        valid = [n for n in listeners if n not in invalid]
        accepted = Cond("Accepted", True, "ListenersNotValid", f"Some listeners are not valid: {_named(invalid, listeners)}; "
                                                              f"accepted: {', '.join(valid)}.")
    return accepted


def _gateway(gw: Obj, gc_ref: Ref, gateway_class: Cond, index: ObjectIndex, grants: ReferenceGrants) -> GatewayFacts:
    spec = _dict(gw.spec)
    listeners = listener_verdicts(gw, index, grants)
    accepted = gateway_acceptance(gw, listeners, gateway_class)
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
    return GatewayFacts(gw.ref, gw, gc_ref, listeners, accepted, resolved, addresses)


def _named(names: list[str], listeners: dict[str, ListenerFacts]) -> str:
    """Listener names, each with the reason it is not accepted."""
    return ", ".join(f"{n} ({listeners[n].accepted.reason})" for n in names)


def _is_loopback(value: Any) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(str(value)).is_loopback
    except ValueError:
        return False


def _listener(gw: Obj, l: dict[str, Any], index: ObjectIndex, grants: ReferenceGrants) -> ListenerFacts:
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
    serveable = SUPPORTED_ROUTE_KINDS.get(protocol, ())
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
                                    f"Route kinds not supported on a {protocol} listener: {', '.join(bad)}.")
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


def _route(route: Obj, facts: Facts, index: ObjectIndex, grants: ReferenceGrants) -> RouteFacts | None:
    spec = _dict(route.spec)
    parents: list[ParentFacts] = []
    unsupported = _unsupported(spec)
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
        if why is None:  # attached only to listeners that are not valid: no usable parent
            attached = [l for l in attached if gf.listeners[l["name"]].accepted.status]
            why = None if attached else "NoMatchingParent"
            served = [l for l in attached if route.kind in SUPPORTED_ROUTE_KINDS.get(gf.listeners[l["name"]].protocol, ())]
            if attached and not served:  # e.g. allowedRoutes.kinds names HTTPRoute on a TLS listener
                why = "NotAllowedByListeners"
            attached = served
        if unsupported is not None:
            accepted = Cond("Accepted", False, "UnsupportedValue", unsupported)
            attached = []
        elif not gf.accepted.status:
            accepted = Cond("Accepted", False, "NoMatchingParent",
                            f"Gateway {gw_ref.namespace}/{gw_ref.name} is not accepted: {gf.accepted.message}")
            attached = []
        elif why is not None:
            accepted = Cond("Accepted", False, why, _why(why, pref, gf))
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


def _route_notes(spec: dict[str, Any]) -> str:
    """The route's own fields NGINX honours only approximately (or not at all), and how (POL's
    policyconf.route_field_notes): said in the Accepted message, which stays True."""
    from gwpolicy.gateway import policyconf

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
                return f"spec.rules[{i}]: filter type {ftype} is not supported by this data plane."
            why = redirect_problem(_dict(_dict(f).get("requestRedirect"))) if ftype == "RequestRedirect" else None
            if why is not None:
                return f"spec.rules[{i}]: {why}."
    from gwpolicy.gateway import routevalues  # render's escaping, which imports the data plane

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


# ---------------------------------------------------------------- status

def policy_kinds_annotation(kinds: Iterable[str]) -> str:
    return ",".join(sorted(set(kinds)))


def desired_status(obj: Obj, facts: Facts, programming: Programming, now: str) -> dict[str, Any] | None:
    """The `status` the object should carry after our write; None when it is none of ours."""
    ref = obj.ref
    if ref in facts.classes:
        return _class_status(obj, facts, now)
    if ref in facts.gateways:
        return _gateway_status(obj, facts.gateways[ref], facts, programming, now)
    if ref in facts.routes:
        return _route_status(obj, facts.routes[ref], facts, now, programming.left_out.get(ref))
    return without_our_entries(obj, facts.controller)


def without_our_entries(obj: Obj, controller: str) -> dict[str, Any] | None:
    """For an object that is no longer ours (its parentRefs no longer name our Gateways, a policy
    that no longer reaches one): its status without the entries we wrote; None when it has none."""
    status = _dict(obj.raw.get("status"))
    for key in ("parents", "ancestors"):
        entries = status.get(key)
        if isinstance(entries, list) and any(isinstance(e, dict) and e.get("controllerName") == controller for e in entries):
            out = copy.deepcopy(status)
            out[key] = [e for e in entries if not (isinstance(e, dict) and e.get("controllerName") == controller)]
            return out
    return None


def _merge_conditions(prev: Any, ours: list[dict[str, Any]], owned: Iterable[str]) -> list[dict[str, Any]]:
    """Our conditions replace ours where they are, new ones go last, others' stay where they are: a
    controller that appends its own after everyone else's then sees the same list (no ping-pong)."""
    owned = set(owned)
    by_type = {c["type"]: c for c in ours}
    out = []
    for c in prev or []:
        if not isinstance(c, dict):
            continue
        if c.get("type") in owned:
            if c["type"] in by_type:
                out.append(by_type.pop(c["type"]))
        else:
            out.append(c)
    return out + [c for c in ours if c["type"] in by_type]


def _class_status(gc: Obj, facts: Facts, now: str) -> dict[str, Any]:
    status = copy.deepcopy(_dict(gc.raw.get("status")))
    prev = status.get("conditions")
    gen = gc.generation
    ours = [facts.classes[gc.ref], facts.class_versions[gc.ref]]
    status["conditions"] = _merge_conditions(prev, [c.to_json(gen, prev, now) for c in ours], GATEWAY_CONDITION_TYPES)
    status["supportedFeatures"] = [{"name": n} for n in sorted(SUPPORTED_FEATURES)]
    return status


def _gateway_status(gw: Obj, gf: GatewayFacts, facts: Facts, programming: Programming, now: str) -> dict[str, Any]:
    """`gw` is the newest copy (its status is what we merge into); `gf` what its spec gave."""
    status = copy.deepcopy(_dict(gw.raw.get("status")))
    prev = status.get("conditions")
    gen = gw.generation
    running = programming.runs(gw)
    addresses = programming.addresses.get(gf.ref, [])
    if not gf.accepted.status:
        programmed = Cond("Programmed", False, "Invalid", "The Gateway is not accepted: " + gf.accepted.message)
    elif programming.error and not running:
        programmed = Cond("Programmed", False, "Invalid", "The Gateway is not programmed due to a failure to reload nginx "
                                                          f"with the configuration: {without_paths(programming.error)}")
    elif programming.error:  # the Gateway is as NGINX last loaded it, but other objects changed since
        programmed = Cond("Programmed", False, "Pending",
                          "NGINX serves an older configuration: it did not load the newest one, which nothing could be "
                          f"left out of to make it load: {without_paths(programming.error)}")
    elif not addresses:
        programmed = Cond("Programmed", False, "AddressNotAssigned", "No address is assigned yet.")
    elif gf.listeners and all(programming.listeners.get(gf.ref.with_section(n), (True, "", ""))[1] == "PortUnavailable"
                              for n in gf.listeners):  # NGINX could bind none of its ports: it serves nothing of it
        ports = "; ".join(f"{n}: {programming.listeners[gf.ref.with_section(n)][2]}" for n in gf.listeners)
        programmed = Cond("Programmed", False, "Invalid", f"No listener of this Gateway is served: {ports}")
    elif running:
        programmed = Cond("Programmed", True, "Programmed", "NGINX serves the configuration of this Gateway.")
    else:
        programmed = Cond("Programmed", False, "Pending", "Waiting for NGINX to load the configuration.")
    ours = [gf.accepted, programmed] + ([gf.resolved_refs] if gf.resolved_refs is not None else [])
    insecure = sorted(lf.name for lf in gf.listeners.values()
                      if lf.client_cas and lf.client_mode == frontendtls.ALLOW_INSECURE_FALLBACK)
    if insecure:  # GEP-91: said on the Gateway while any listener lets unverified clients in
        ours.append(Cond("InsecureFrontendValidationMode", True, "ConfigurationChanged",
                         f"Listeners {', '.join(insecure)} accept clients whose certificate is missing or does not "
                         "verify (spec.tls.frontend validation mode AllowInsecureFallback)."))
    status["conditions"] = _merge_conditions(prev, [c.to_json(gen, prev, now) for c in ours], GATEWAY_CONDITION_TYPES)
    status["addresses"] = [{"type": "IPAddress", "value": a} for a in addresses] if gf.accepted.status else []
    old_listeners = {l.get("name"): l for l in status.get("listeners") or [] if isinstance(l, dict)}
    listeners = []
    for lf in gf.listeners.values():
        lprev = (old_listeners.get(lf.name) or {}).get("conditions")
        if lf.conflicted.status:  # the conflict's reason, as the upstream suite's conflict tests expect
            lprog = Cond("Programmed", False, lf.conflicted.reason, f"The listener is not programmed: {lf.conflicted.message}")
        elif not lf.servable:
            why = next(c for c in (lf.accepted, lf.resolved_refs) if not c.status)
            lprog = Cond("Programmed", False, "Invalid", f"The listener is not programmed: {why.message}")
        elif not programming.listeners.get(gf.ref.with_section(lf.name), (True, "", ""))[0]:
            _, reason, message = programming.listeners[gf.ref.with_section(lf.name)]
            lprog = Cond("Programmed", False, "Invalid", f"The data plane does not serve this listener ({reason}): {message}")
        elif programmed.status:
            lprog = Cond("Programmed", True, "Programmed", "NGINX serves this listener.")
        else:
            lprog = Cond("Programmed", False, programmed.reason, programmed.message)
        accepted = lf.accepted
        rendered = programming.listeners.get(gf.ref.with_section(lf.name))
        if rendered is not None and not rendered[0] and rendered[1] == "PortUnavailable":
            accepted = Cond("Accepted", False, "PortUnavailable", rendered[2])  # GEP-1364 says it with Accepted
        conds = [accepted, lprog, lf.resolved_refs, lf.conflicted]
        listeners.append({
            "name": lf.name,
            "supportedKinds": [dict(k) for k in lf.supported_kinds],
            "attachedRoutes": lf.attached_routes,
            "conditions": [c.to_json(gen, lprev, now) for c in conds],
        })
    status["listeners"] = listeners
    return status


def _route_status(route: Obj, rf: RouteFacts, facts: Facts, now: str,
                  left_out: tuple[str, str] | None = None) -> dict[str, Any]:
    status = copy.deepcopy(_dict(route.raw.get("status")))
    existing = [p for p in status.get("parents") or [] if isinstance(p, dict)]
    gen = route.generation
    ours: dict[tuple, dict[str, Any]] = {}
    for pf in rf.parents:
        key = _pkey(pf.parent_ref, route)
        prev = next((p.get("conditions") for p in existing
                     if p.get("controllerName") == facts.controller and _pkey(_dict(p.get("parentRef")), route) == key), None)
        accepted = pf.accepted
        if left_out is not None and accepted.status:  # the data plane serves nothing of it
            accepted = Cond("Accepted", False, *left_out)
        ours[key] = {"parentRef": pf.parent_ref, "controllerName": facts.controller,
                     "conditions": [accepted.to_json(gen, prev, now), rf.resolved_refs.to_json(gen, prev, now)]}
    parents = []
    for p in existing:  # others' entries stay where they are; ours are replaced in place or dropped
        if p.get("controllerName") != facts.controller:
            parents.append(p)
            continue
        key = _pkey(_dict(p.get("parentRef")), route)
        if key in ours:
            parents.append(ours.pop(key))
    parents.extend(ours.values())
    status["parents"] = parents
    return status


def _pkey(pref: dict[str, Any], route: Obj) -> tuple:
    return (pref.get("group") if pref.get("group") is not None else GATEWAY_GROUP, pref.get("kind") or "Gateway",
            pref.get("namespace") or route.namespace or "", pref.get("name") or "",
            pref.get("sectionName") or "", pref.get("port") or 0)


def class_annotations(gc: Obj, policy_kinds: Iterable[str]) -> dict[str, str]:
    """The annotations the GatewayClass should carry: ours set, others kept."""
    ann = dict(gc.metadata.get("annotations") or {}) if isinstance(gc.metadata.get("annotations"), dict) else {}
    ann[POLICY_KINDS_ANNOTATION] = policy_kinds_annotation(policy_kinds)
    return ann


def all_desired(index: ObjectIndex, facts: Facts, programming: Programming, now: str) -> dict[Ref, dict[str, Any]]:
    """Every object of ours -> the status it should carry; and routes that carry an entry of ours
    but no longer name our Gateways -> their status without it."""
    out: dict[Ref, dict[str, Any]] = {}
    for refs in (facts.classes, facts.gateways, facts.routes, stale_routes(index, facts)):
        for ref in refs:
            obj = index.by_ref.get(ref)
            if obj is not None:
                st = desired_status(obj, facts, programming, now)
                if st is not None:
                    out[ref] = st
    return out


def stale_routes(index: ObjectIndex, facts: Facts) -> list[Ref]:
    """Routes that are not ours (now) but carry a `status.parents` entry of ours."""
    return [r.ref for r in route_objects(index)
            if r.ref not in facts.routes and without_our_entries(r, facts.controller) is not None]


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
                verdicts = iter(rf.parents)  # in parentRef order, ours only (see _route)
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


# ---------------------------------------------------------------- policies the gateway enforces

def policy_ancestors(policy: Obj, facts: Facts) -> list[Ref]:
    """Our Gateways that send traffic to a Service the policy targets (through an accepted parent of
    an HTTPRoute: a TLSRoute's connections pass through untouched, no backend policy applies)."""
    spec = _dict(policy.spec)
    targets = {Ref(CORE_GROUP, "Service", policy.namespace, str(t.get("name", "")))
               for t in spec.get("targetRefs") or [] if isinstance(t, dict)
               and (t.get("group") or CORE_GROUP) == CORE_GROUP and (t.get("kind") or "Service") == "Service"}
    out: dict[Ref, None] = {}
    for rf in facts.routes.values():
        if rf.ref.kind != "HTTPRoute" or not any(b.ref in targets for b in rf.backends):
            continue
        for p in rf.parents:
            if p.accepted.status:
                out[p.gateway] = None
    return sorted(out, key=Ref.sort_key)


def policy_status(policy: Obj, conditions: list[dict[str, str]], facts: Facts, now: str) -> dict[str, Any]:
    """A policy's `status.ancestors` with our entries (one per Gateway of ours it takes effect
    through, with `conditions`) and everyone else's kept in place."""
    status = copy.deepcopy(_dict(policy.raw.get("status")))
    existing = [a for a in status.get("ancestors") or [] if isinstance(a, dict)]
    gen = policy.generation
    ours: dict[tuple, dict[str, Any]] = {}
    for gw in policy_ancestors(policy, facts):
        aref = {"group": GATEWAY_GROUP, "kind": "Gateway", "namespace": gw.namespace, "name": gw.name}
        key = _pkey(aref, policy)
        prev = next((a.get("conditions") for a in existing if a.get("controllerName") == facts.controller
                     and _pkey(_dict(a.get("ancestorRef")), policy) == key), None)
        ours[key] = {"ancestorRef": aref, "controllerName": facts.controller,
                     "conditions": [Cond(c["type"], c["status"] == "True", c["reason"], c.get("message", "")).to_json(gen, prev, now)
                                    for c in conditions]}
    ancestors = []
    for a in existing:
        if a.get("controllerName") != facts.controller:
            ancestors.append(a)
            continue
        key = _pkey(_dict(a.get("ancestorRef")), policy)
        if key in ours:
            ancestors.append(ours.pop(key))
    ancestors.extend(ours.values())
    status["ancestors"] = ancestors[:16]
    return status


def keep_in_place(previous: Any, computed: list[dict[str, Any]], controller: str, key: str) -> list[dict[str, Any]]:
    """`computed` (others' entries and ours, in any order) laid out like `previous`: every entry stays
    where it was, ours replaced in place, new ones of ours last. Two controllers that each append
    their own entries after the others' would otherwise swap the order on every write."""
    def k(e: dict[str, Any]) -> tuple:
        return (e.get("controllerName"), json_key(e.get(key)))

    fresh = {k(e): e for e in computed if isinstance(e, dict)}
    out = []
    for e in previous or []:
        if isinstance(e, dict) and k(e) in fresh:
            out.append(fresh.pop(k(e)))
    return out + [e for e in computed if isinstance(e, dict) and k(e) in fresh]


def json_key(v: Any) -> str:
    import json

    return json.dumps(v, sort_keys=True, default=str)
