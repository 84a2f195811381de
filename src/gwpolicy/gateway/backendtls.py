"""BackendTLSPolicy on NGINX 1.22: one TLS profile per upstream, CA bundles, and the policy's conditions.

The engine already picks, per Service port path, the one BackendTLSPolicy that applies (mergeStrategy
None: a port's own policy, else the whole Service's; among policies on one target the oldest wins and
the others are Conflicted).  This module turns the winner into an NGINX TLS profile, resolves its
CA certificates from ConfigMaps, and says what the policy's `Accepted` / `ResolvedRefs` conditions
are, with the reasons of the conformance suite.

NGINX caches upstream TLS sessions per `upstream` block and reuses them across locations, so a
profile is part of the upstream's identity (`TLSProfile.key`): two profiles never share an upstream.
`proxy_ssl_name` sets both the SNI and the name verified, so `subjectAltNames` cannot be honoured.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gwpolicy.engine import names
from gwpolicy.engine.attach import ACCEPTED
from gwpolicy.engine.model import ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.gateway.pem import certificates_problem

KIND = (GATEWAY_GROUP, "BackendTLSPolicy")
SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's ca-certificates bundle
CA_KEY = "ca.crt"
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")

# condition reasons (gateway-api apis/v1/backendtlspolicy_types.go and the conformance cases)
R_ACCEPTED, R_INVALID, R_CONFLICTED, R_NO_CA = "Accepted", "Invalid", "Conflicted", "NoValidCACertificate"
R_RESOLVED, R_INVALID_KIND, R_INVALID_CA_REF = "ResolvedRefs", "InvalidKind", "InvalidCACertificateRef"


class Lookup(Protocol):
    """What resolving a policy's CA refs reads objects through: an ObjectIndex, or the data plane's
    builder, which records each ConfigMap a route's TLS read (dataplane.BuildCache)."""

    def get(self, ref: Ref) -> Any: ...


@dataclass(frozen=True)
class TLSProfile:
    """How NGINX talks TLS to one Service port: the name for SNI and verification, the CA bundle."""

    hostname: str
    ca_pem: bytes | None  # None: the system trust store (wellKnownCACertificates: System)
    policy: Ref

    @property
    def key(self) -> str:
        """Short stable id; part of the upstream name so one upstream has one TLS profile."""
        h = hashlib.sha256(self.hostname.encode() + b"\0" + (self.ca_pem or b"system")).hexdigest()
        return h[:10]

    @property
    def ca_file(self) -> str:
        """The bundle's path: relative to the rendered tree, or the system bundle."""
        if self.ca_pem is None:
            return SYSTEM_CA_FILE
        return f"tls/ca-{hashlib.sha256(self.ca_pem).hexdigest()[:16]}.pem"

    def files(self) -> dict[str, bytes]:
        """Files the renderer writes (the CA bundle), by relative path."""
        return {} if self.ca_pem is None else {self.ca_file: self.ca_pem}

    def directives(self, root: str = "") -> list[str]:
        """Location lines; the location then proxies to `https://<upstream>`.  `root` prefixes the
        bundle path when NGINX's prefix is not the rendered tree."""
        ca = self.ca_file if self.ca_pem is None else f"{root.rstrip('/') + '/' if root else ''}{self.ca_file}"
        return ["proxy_ssl_server_name on;", f"proxy_ssl_name {self.hostname};", "proxy_ssl_verify on;",
                "proxy_ssl_verify_depth 4;", f"proxy_ssl_trusted_certificate {ca};",
                "proxy_ssl_session_reuse on;"]


@dataclass(frozen=True)
class TLSFailure:
    """The policy that applies cannot be programmed; requests to the backend get 500 (fail closed)."""

    policy: Ref
    accepted_reason: str
    resolved_reason: str  # ResolvedRefs reason (True only when it is R_RESOLVED)
    message: str


def unsupported_fields(spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Fields of a BackendTLSPolicy spec NGINX 1.22 cannot honour, with why."""
    out: list[tuple[str, str]] = []
    validation = (spec or {}).get("validation") or {}
    if not isinstance(validation, Mapping):
        return [("spec.validation", "must be an object")]
    if validation.get("subjectAltNames"):
        out.append(("spec.validation.subjectAltNames",
                    "NGINX verifies the backend certificate against the one name it also sends as SNI "
                    "(proxy_ssl_name = spec.validation.hostname); other subject alternative names "
                    "are not supported by the nginx-1.22 data plane"))
    wk = validation.get("wellKnownCACertificates")
    if wk not in (None, "", "System"):
        out.append(("spec.validation.wellKnownCACertificates", f"{wk!r} is not recognised; only System is"))
    if (spec or {}).get("options"):
        out.append(("spec.options", "TLS options are not supported by the nginx-1.22 data plane"))
    return out


def resolve(spec: Mapping[str, Any], policy: Ref, index: Lookup) -> TLSProfile | TLSFailure:
    """The winning policy's spec (the engine's effective spec on a Service port) -> a profile or why not."""
    bad = unsupported_fields(spec)
    if bad:
        return TLSFailure(policy, R_INVALID, R_RESOLVED, "; ".join(f"{f}: {why}" for f, why in bad))
    validation = spec.get("validation") or {}
    hostname = validation.get("hostname")
    if not isinstance(hostname, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", hostname or ""):
        return TLSFailure(policy, R_INVALID, R_RESOLVED,
                          f"spec.validation.hostname: {hostname!r} must be a DNS name (lower case)")
    refs = validation.get("caCertificateRefs") or []
    system = validation.get("wellKnownCACertificates") == "System"
    if system and refs:
        return TLSFailure(policy, R_INVALID, R_RESOLVED,
                          "spec.validation: caCertificateRefs and wellKnownCACertificates are both set; set one")
    if system:
        return TLSProfile(hostname, None, policy)
    if not refs:
        return TLSFailure(policy, R_INVALID, R_RESOLVED,
                          "spec.validation: needs caCertificateRefs or wellKnownCACertificates: System")
    bundle: list[bytes] = []
    for i, ref in enumerate(refs):
        where = f"spec.validation.caCertificateRefs[{i}]"
        if not isinstance(ref, Mapping):
            return TLSFailure(policy, R_NO_CA, R_INVALID_CA_REF, f"{where}: must be an object")
        group, kind, name = ref.get("group") or CORE_GROUP, ref.get("kind"), ref.get("name")
        if (group, kind) != (CORE_GROUP, "ConfigMap"):
            return TLSFailure(policy, R_NO_CA, R_INVALID_KIND,
                              f"{where}: kind {kind!r} (group {group!r}) is not supported; use a core ConfigMap")
        bad_name = names.name_problem("ConfigMap", name)
        if bad_name is not None:  # no such ConfigMap can exist; the name is repr()-ed, never spelt as given
            return TLSFailure(policy, R_NO_CA, R_INVALID_CA_REF, f"{where}: ConfigMap {bad_name}")
        cm = index.get(Ref(CORE_GROUP, "ConfigMap", policy.namespace, str(name)))
        if cm is None:
            return TLSFailure(policy, R_NO_CA, R_INVALID_CA_REF,
                              f"{where}: ConfigMap {policy.namespace}/{name} does not exist")
        data = cm.raw.get("data") or {}
        pem = data.get(CA_KEY) if isinstance(data, Mapping) else None
        certs = _PEM.findall(pem.encode()) if isinstance(pem, str) else []
        if not certs:
            return TLSFailure(policy, R_NO_CA, R_INVALID_CA_REF,
                              f"{where}: ConfigMap {policy.namespace}/{name} has no PEM certificate under data.{CA_KEY}")
        problem = certificates_problem(b"\n".join(certs))  # what NGINX would refuse the whole configuration for
        if problem is not None:
            return TLSFailure(policy, R_NO_CA, R_INVALID_CA_REF,
                              f"{where}: ConfigMap {policy.namespace}/{name} data.{CA_KEY}: {problem}")
        bundle.extend(certs)
    return TLSProfile(hostname, b"\n".join(bundle) + b"\n", policy)


def ca_configmaps(policy: Any) -> set[Ref]:
    """The ConfigMaps a BackendTLSPolicy (an Obj) names in `spec.validation.caCertificateRefs`, in
    its own namespace as `resolve` looks them up: its conditions and the TLS of the backends it
    covers read those."""
    spec = policy.spec if isinstance(policy.spec, Mapping) else {}
    validation = spec.get("validation")
    refs = validation.get("caCertificateRefs") if isinstance(validation, Mapping) else None
    return {Ref(CORE_GROUP, "ConfigMap", policy.namespace, str(r.get("name")))
            for r in refs if isinstance(r, Mapping)} if isinstance(refs, list) else set()


def for_backend(effective: Mapping[Any, Any] | None, index: Lookup) -> TLSProfile | TLSFailure | None:
    """The TLS of one backend from its effective policies (kind -> Result); None: plain HTTP."""
    for key, value in (effective or {}).items():
        if key in (KIND, KIND[1]):
            spec = getattr(value, "spec", value)
            policies = sorted(getattr(value, "policies", ()) or (), key=Ref.sort_key)
            if not isinstance(spec, Mapping) or not spec:
                return None
            if not policies:  # a bare spec: no namespace for its ConfigMaps; fail closed, never plain HTTP
                return TLSFailure(Ref(*KIND, None, "?"), R_INVALID, R_RESOLVED,
                                  "BackendTLSPolicy spec without its policy (pass the engine's Result)")
            return resolve(spec, policies[0], index)
    return None


def conditions(policy: Ref, index: ObjectIndex, engine_reason: str, engine_message: str) -> list[dict[str, str]]:
    """Accepted and ResolvedRefs of one BackendTLSPolicy for each of its Gateway ancestors.

    `engine_reason` is the engine's outcome for the policy (Accepted, Conflicted, Invalid,
    TargetNotFound): a policy the engine does not accept keeps that reason.
    """
    obj = index.get(policy)
    spec = obj.spec if obj is not None and isinstance(obj.spec, Mapping) else {}
    result = resolve(spec, policy, index)
    if isinstance(result, TLSFailure):
        resolved = {"type": "ResolvedRefs", "status": "True" if result.resolved_reason == R_RESOLVED else "False",
                    "reason": result.resolved_reason,
                    "message": "All CA certificate references resolved." if result.resolved_reason == R_RESOLVED
                    else result.message}
        accepted = {"type": "Accepted", "status": "False", "reason": result.accepted_reason, "message": result.message}
    else:
        resolved = {"type": "ResolvedRefs", "status": "True", "reason": R_RESOLVED,
                    "message": "All CA certificate references resolved."}
        accepted = {"type": "Accepted", "status": "True", "reason": R_ACCEPTED,
                    "message": f"TLS to the backend with SNI and verified name {result.hostname}."}
    if engine_reason != ACCEPTED and accepted["status"] == "True":
        accepted = {"type": "Accepted", "status": "False", "reason": engine_reason, "message": engine_message}
    return [accepted, resolved]


def all_conditions(analysis: Any) -> dict[Ref, list[dict[str, str]]]:
    """Conditions of every BackendTLSPolicy in an engine Analysis (the worst target outcome counts)."""
    from gwpolicy.engine.attach import SEVERITY

    out: dict[Ref, list[dict[str, str]]] = {}
    for ref, outs in analysis.outcomes.items():
        if (ref.group, ref.kind) != KIND:
            continue
        worst = max(outs, key=lambda o: SEVERITY.get(o.reason, 0), default=None)
        out[ref] = conditions(ref, analysis.index, worst.reason if worst else ACCEPTED,
                              worst.message if worst else "")
    return out


def profiles(items: Iterable[TLSProfile]) -> dict[str, bytes]:
    """Every CA bundle file the given profiles need, by relative path (deterministic)."""
    files: dict[str, bytes] = {}
    for p in items:
        files.update(p.files())
    return dict(sorted(files.items()))
