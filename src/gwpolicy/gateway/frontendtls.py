"""Frontend client-certificate validation (GEP-91, `Gateway.spec.tls.frontend`), read once for both
the facts (gateway/facts.py) and the data plane (gateway/dataplane.py), so the two never disagree.

Pure. A listener's validation is the `perPort` entry of its port, else `default`; it applies to
HTTPS listeners only (a TLS passthrough listener never sees the client's certificate). Every
`caCertificateRefs` entry must be a core ConfigMap with a PEM `ca.crt` (another namespace only with
a ReferenceGrant from the Gateway). When some are invalid the listener's `ResolvedRefs` is False
with the first one's reason; when all are, `Accepted` is False too (`NoValidCACertificate`), as
the CRD says. Either way this data plane does not program the listener (fail closed: a listener
that asked for client certificates is never served with a weaker check than it asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gwpolicy.engine import names
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.gateway.pem import certificates_problem

ALLOW_VALID_ONLY = "AllowValidOnly"
ALLOW_INSECURE_FALLBACK = "AllowInsecureFallback"
MODES = (ALLOW_VALID_ONLY, ALLOW_INSECURE_FALLBACK)

INVALID_KIND = "InvalidCACertificateKind"
INVALID_REF = "InvalidCACertificateRef"
REF_NOT_PERMITTED = "RefNotPermitted"
NO_VALID_CA = "NoValidCACertificate"


@dataclass(frozen=True)
class Validation:
    """What one HTTPS listener asks of its clients: `where` names the field it came from."""

    where: str  # e.g. "spec.tls.frontend.perPort[0].tls.validation"
    mode: str  # ALLOW_VALID_ONLY | ALLOW_INSECURE_FALLBACK
    cas: tuple[Ref, ...]  # the valid ConfigMaps, in reference order
    bundle: bytes  # their ca.crt, concatenated
    problems: tuple[tuple[str, str], ...]  # (reason, message) of each invalid reference

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.cas) and self.mode in MODES


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def listener_validation(gw: Obj, port: Any, index: ObjectIndex, grants: ReferenceGrants) -> Validation | None:
    """The validation an HTTPS listener of `gw` on `port` must apply; None when none is asked."""
    frontend = _dict(_dict(_dict(gw.spec).get("tls")).get("frontend"))
    validation = _dict(frontend.get("default")).get("validation")
    where = "spec.tls.frontend.default.validation"
    for i, pp in enumerate(frontend.get("perPort") or []):
        if isinstance(pp, dict) and pp.get("port") == port:
            validation = _dict(pp.get("tls")).get("validation")
            where = f"spec.tls.frontend.perPort[{i}].tls.validation"
            break
    if not isinstance(validation, dict):
        return None
    mode = validation.get("mode") or ALLOW_VALID_ONLY
    problems: list[tuple[str, str]] = []
    if mode not in MODES:
        problems.append(("UnsupportedValue", f"{where}.mode {mode!r} is not one of {', '.join(MODES)}"))
    cas: list[Ref] = []
    bundle: list[bytes] = []
    refs = validation.get("caCertificateRefs")
    if not isinstance(refs, list) or not refs:
        problems.append((INVALID_REF, f"{where}.caCertificateRefs is empty"))
        refs = []
    for i, ref in enumerate(refs):
        cm, pem, problem = _ca(gw, ref, index, grants, f"{where}.caCertificateRefs[{i}]")
        if cm is None:
            problems.append(problem)
        else:
            cas.append(cm)
            bundle.append(pem)
    return Validation(where, str(mode), tuple(cas), b"".join(bundle), tuple(problems))


def _ca(gw: Obj, ref: Any, index: ObjectIndex, grants: ReferenceGrants,
        where: str) -> tuple[Ref | None, bytes, tuple[str, str]]:
    """(ConfigMap, its PEM, -) of a usable reference, else (None, -, (reason, message))."""
    if not isinstance(ref, dict):
        return None, b"", (INVALID_REF, f"{where} is not an object reference")
    group = ref.get("group") or CORE_GROUP
    kind = ref.get("kind") or "ConfigMap"
    ns = ref.get("namespace") or gw.namespace or ""
    name = str(ref.get("name", ""))
    if group != CORE_GROUP or kind != "ConfigMap":
        return None, b"", (INVALID_KIND, f"{where}: {group + '/' if group else ''}{kind} is not a ConfigMap (ConfigMaps with ca.crt are supported).")
    bad_name = names.reference_problem("ConfigMap", ns, name)
    if bad_name is not None:
        return None, b"", (INVALID_REF, f"{where}: ConfigMap {bad_name}.")
    if ns != gw.namespace and not grants.allows(GATEWAY_GROUP, "Gateway", gw.namespace or "", CORE_GROUP, "ConfigMap", ns, name):
        return None, b"", (REF_NOT_PERMITTED, f"{where}: ConfigMap {ns}/{name} is in another namespace and no ReferenceGrant allows it.")
    cm = index.by_ref.get(Ref(CORE_GROUP, "ConfigMap", ns, name))
    pem = _dict(cm.raw.get("data")).get("ca.crt") if cm is not None else None
    if cm is None or not isinstance(pem, str) or "-----BEGIN CERTIFICATE-----" not in pem:
        return None, b"", (INVALID_REF, f"{where}: ConfigMap {ns}/{name} does not exist or has no PEM certificate in ca.crt.")
    problem = certificates_problem(pem.encode())  # what NGINX would refuse the whole configuration for
    if problem is not None:
        return None, b"", (INVALID_REF, f"{where}: ConfigMap {ns}/{name} ca.crt: {problem}.")
    return cm.ref, pem.rstrip("\n").encode() + b"\n", ("", "")
