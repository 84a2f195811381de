"""The Gateway API conformance cases of ../shared/gateway-conformance as data, and the suite's
comparisons (status per `conformance/utils/kubernetes/helpers.go`, round trips per
`conformance/utils/http/http.go`), reproduced as the README there describes them.

Pure helpers: the unit test of gateway/status.py and the live harness share them, so that a status
the unit test accepts is one the live harness accepts too.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

CASES_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "gateway-conformance"
GATEWAY_GROUP = "gateway.networking.k8s.io"

Getter = Callable[[str, str | None, str], dict[str, Any] | None]


def load_base() -> dict[str, Any]:
    return yaml.safe_load((CASES_DIR / "base.yaml").read_text())


def case_names() -> list[str]:
    return sorted(p.stem for p in CASES_DIR.glob("*.yaml") if p.stem != "base")


def load_case(name: str) -> dict[str, Any]:
    return yaml.safe_load((CASES_DIR / f"{name}.yaml").read_text())


# ---------------------------------------------------------------- generated certificates

def _name(cn: str, org: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn), x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)])


def _key():
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(cn: str = "gatewayapi") -> tuple[Any, Any]:
    """A self-signed CA as the suite makes them (CN=gatewayapi, O=Kubernetes Gateway API)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    name = _name(cn, "Kubernetes Gateway API")
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_cert(hosts: Iterable[str], signer: tuple[Any, Any] | None = None, client: bool = False) -> tuple[bytes, bytes]:
    """An RSA-2048 certificate (CN=default, O=Acme Co) for `hosts`: DNS names, IPs, or URIs; PEM (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    subject = _name("default", "Acme Co")
    sans: list[Any] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            continue
        except ValueError:
            pass
        if "://" in h or h == "*":
            sans.append(x509.UniformResourceIdentifier(h))
        else:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_cert, issuer_key = signer if signer else (None, key)
    b = (x509.CertificateBuilder().subject_name(subject)
         .issuer_name(issuer_cert.subject if issuer_cert is not None else subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
         .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_cert_sign=False, crl_sign=False,
                                      content_commitment=False, data_encipherment=False, key_agreement=False,
                                      encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
                        critical=False))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(issuer_key, hashes.SHA256())
    return _pem_cert(cert), _pem_key(key)


def generated_objects(base: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[tuple[str, str], tuple[bytes, bytes]]]:
    """The Secrets and ConfigMaps of base.yaml `generated:`, with fresh keys; and the PEM certificate
    and key of every Secret by (namespace, name), for clients to trust and TLS backends to serve."""
    cas: dict[str, tuple[Any, Any]] = {}
    out: list[dict[str, Any]] = []
    pems: dict[tuple[str, str], tuple[bytes, bytes]] = {}
    entries = base["generated"]["objects"]
    # CAs first (ConfigMaps), labelled CA-n in their data description, in the order they appear
    for e in entries:
        if e["kind"] == "ConfigMap":
            label = re.search(r"CA-\d+", str(e["data"]["ca.crt"])).group(0)
            cas[label] = make_ca()
            out.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": e["name"], "namespace": e["namespace"]},
                        "data": {"ca.crt": _pem_cert(cas[label][0]).decode()}})
    for e in entries:
        if e["kind"] != "Secret":
            continue
        spec = e.get("cert") or {}
        signer = cas.get(spec["signedBy"]) if spec.get("signedBy") else None
        crt, key = make_cert(spec.get("hosts") or [], signer, bool(spec.get("clientAuth")))
        pems[(e["namespace"], e["name"])] = (crt, key)
        out.append({"apiVersion": "v1", "kind": "Secret", "type": e.get("type", "kubernetes.io/tls"),
                    "metadata": {"name": e["name"], "namespace": e["namespace"]},
                    "data": {"tls.crt": base64.b64encode(crt).decode(), "tls.key": base64.b64encode(key).decode()}})
    return out, pems


# ---------------------------------------------------------------- status comparison

def _conds_match(expected: list[dict[str, Any]], actual: Any) -> str | None:
    actual = [c for c in actual or [] if isinstance(c, dict)]
    for e in expected:
        if not any(c.get("type") == e["type"] and (not e.get("status") or c.get("status") == e["status"])
                   and (not e.get("reason") or c.get("reason") == e["reason"]) for c in actual):
            return f"missing condition {e} in {[(c.get('type'), c.get('status'), c.get('reason')) for c in actual]}"
    return None


def _latest(conds: Any, generation: Any) -> str | None:
    for c in conds or []:
        if isinstance(c, dict) and c.get("observedGeneration") != generation:
            return f"condition {c.get('type')} has observedGeneration {c.get('observedGeneration')}, generation is {generation}"
    return None


def _kinds_ok(expected: list[dict[str, Any]], actual: Any) -> bool:
    actual = [k for k in actual or [] if isinstance(k, dict)]
    if not expected:
        return not actual
    return all(any((a.get("group") or GATEWAY_GROUP) == (e.get("group") or GATEWAY_GROUP) and a.get("kind") == e["kind"]
                   for a in actual) for e in expected)


def check_status(entry: dict[str, Any], get: Getter) -> str | None:
    """None when the object's status holds what the entry expects; else what is missing."""
    o = entry["object"]
    obj = get(o["kind"], o.get("namespace"), o["name"])
    label = f"{o['kind']} {o.get('namespace')}/{o['name']}"
    if obj is None:
        return f"{label} not found"
    status = obj.get("status") or {}
    gen = (obj.get("metadata") or {}).get("generation")
    kind = o["kind"]
    if kind in ("Gateway", "GatewayClass"):
        why = _latest(status.get("conditions"), gen)
        if why:
            return f"{label}: {why}"
        if entry.get("conditions"):
            why = _conds_match(entry["conditions"], status.get("conditions"))
            if why:
                return f"{label}: {why}"
    if kind == "Gateway":
        listeners = [l for l in status.get("listeners") or [] if isinstance(l, dict)]
        if entry.get("address") and not any(isinstance(a, dict) and a.get("type") for a in status.get("addresses") or []):
            return f"{label}: no address"
        if entry.get("allListeners"):
            if not listeners:
                return f"{label}: no listeners in status"
            for l in listeners:
                why = _conds_match(entry["allListeners"]["conditions"], l.get("conditions"))
                if why:
                    return f"{label} listener {l.get('name')}: {why}"
        for lc in entry.get("listenerConditions") or []:
            l = next((x for x in listeners if x.get("name") == lc["name"]), None)
            if l is None:
                return f"{label}: listener {lc['name']} not in status"
            why = _conds_match(lc["conditions"], l.get("conditions"))
            if why:
                return f"{label} listener {lc['name']}: {why}"
        if entry.get("listeners") is not None:
            if len(listeners) != len(entry["listeners"]):
                return f"{label}: {len(listeners)} listeners in status, want {len(entry['listeners'])}"
            for el in entry["listeners"]:
                l = next((x for x in listeners if x.get("name") == el["name"]), None)
                if l is None:
                    return f"{label}: listener {el['name']} not in status"
                if l.get("attachedRoutes") != el["attachedRoutes"]:
                    return f"{label} listener {el['name']}: attachedRoutes {l.get('attachedRoutes')}, want {el['attachedRoutes']}"
                if not _kinds_ok(el.get("supportedKinds") or [], l.get("supportedKinds")):
                    return f"{label} listener {el['name']}: supportedKinds {l.get('supportedKinds')}, want {el.get('supportedKinds')}"
                why = _conds_match(el.get("conditions") or [], l.get("conditions"))
                if why:
                    return f"{label} listener {el['name']}: {why}"
        if entry.get("zeroRoutes"):
            if not (not listeners or (len(listeners) == 1 and listeners[0].get("attachedRoutes") == 0)):
                return f"{label}: not zero routes: {[(l.get('name'), l.get('attachedRoutes')) for l in listeners]}"
    if kind == "HTTPRoute":
        parents = [p for p in status.get("parents") or [] if isinstance(p, dict)]
        for p in parents:
            why = _latest(p.get("conditions"), gen)
            if why:
                return f"{label} parent {(p.get('parentRef') or {}).get('name')}: {why}"
        for ep in entry.get("parents") or []:
            if not any(_parent_matches(ep, p, o.get("namespace")) for p in parents):
                return f"{label}: no status parent matches {json.dumps(ep)}; have {json.dumps(parents)}"
        if entry.get("noAcceptedParents"):
            if parents and not (len(parents) == 1 and _conds_match([{"type": "Accepted", "status": "False"}],
                                                                    parents[0].get("conditions")) is None):
                return f"{label}: has accepted parents {json.dumps(parents)}"
    if kind == "BackendTLSPolicy":
        ancestors = [a for a in status.get("ancestors") or [] if isinstance(a, dict)]
        for a in ancestors:
            why = _latest(a.get("conditions"), gen)
            if why:
                return f"{label}: {why}"
        for ea in entry.get("ancestors") or []:
            ref = ea["ancestorRef"]
            if not any((a.get("ancestorRef") or {}).get("name") == ref["name"]
                       and ((a.get("ancestorRef") or {}).get("namespace") in (None, ref.get("namespace")))
                       and _conds_match(ea["conditions"], a.get("conditions")) is None for a in ancestors):
                return f"{label}: no ancestor matches {json.dumps(ea)}; have {json.dumps(ancestors)}"
    return None


def _parent_matches(ep: dict[str, Any], p: dict[str, Any], route_ns: str | None) -> bool:
    want, have = ep["parentRef"], p.get("parentRef") or {}
    if have.get("name") != want["name"]:
        return False
    strict = "group" in want or "kind" in want
    for k in ("group", "kind"):
        if k in want and have.get(k) != want[k]:
            return False
    if have.get("namespace") is not None:
        if have["namespace"] != want.get("namespace"):
            return False
    elif strict and ep.get("namespaceRequired"):
        return False
    if ep.get("controllerName") and p.get("controllerName") != ep["controllerName"]:
        return False
    return _conds_match(ep.get("conditions") or [], p.get("conditions")) is None


def gateway_ready(obj: dict[str, Any]) -> str | None:
    """base.yaml readiness for one Gateway: conditions current, Accepted and Programmed True."""
    status = obj.get("status") or {}
    gen = obj["metadata"].get("generation")
    why = _latest(status.get("conditions"), gen) or _conds_match(
        [{"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "True"}], status.get("conditions"))
    return f"Gateway {obj['metadata'].get('namespace')}/{obj['metadata']['name']}: {why}" if why else None


def skip_readiness(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get("gateway-api/skip-this-for-readiness") == "true"


def all_objects(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's manifests and what its steps apply, as copies."""
    out = [copy.deepcopy(m) for m in case.get("manifests") or []]
    for step in case.get("steps") or []:
        for action in step.get("actions") or []:
            out += [copy.deepcopy(m) for m in action.get("apply") or []]
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---------------------------------------------------------------- round trips (http.ExpectedResponse)

REDIRECTS = (300, 301, 302, 303, 304, 305, 307, 308)


def _joined(headers: list[tuple[str, str]], name: str) -> str | None:
    vals = [v for k, v in headers if k.lower() == name.lower()]
    return ",".join(vals) if vals else None


def compare(exp: dict[str, Any], status: int, headers: list[tuple[str, str]], body: bytes,
            scheme: str = "http") -> str | None:
    """`CompareRoundTrip`: None when the answer is what the entry expects, else why not."""
    resp = exp.get("response") or {}
    codes = resp.get("statusCodes") or [resp.get("statusCode", 200)]
    if status in (408, 504) and any(c in (408, 504) for c in codes):
        return None
    if status not in codes:
        return f"status {status}, want {codes}"
    req = exp["request"]
    if status in (200, 204):
        ctype = _joined(headers, "Content-Type")
        echoed: dict[str, Any] = {"method": req.get("method", "GET")}
        if ctype == "application/json":
            try:
                echoed = json.loads(body)
            except ValueError:
                return f"not JSON: {body[:200]!r}"
        want = exp.get("expectedRequest")
        if want is None:
            want = {"path": req["path"], "method": req.get("method", "GET"), "host": req.get("host") or "",
                    "headers": req.get("headers") or {}, "sni": req.get("sni")}
        if want.get("host") and echoed.get("host") != want["host"]:
            return f"backend saw host {echoed.get('host')!r}, want {want['host']!r}"
        if echoed.get("path", "") != want.get("path", ""):
            return f"backend saw path {echoed.get('path')!r}, want {want.get('path')!r}"
        if echoed.get("method") != want.get("method", "GET"):
            return f"backend saw method {echoed.get('method')!r}, want {want.get('method')!r}"
        if echoed.get("namespace", "") != (exp.get("namespace") or ""):
            return f"backend namespace {echoed.get('namespace')!r}, want {exp.get('namespace')!r}"
        got_headers = {k.lower(): v for k, v in (echoed.get("headers") or {}).items()}
        for name, value in (want.get("headers") or {}).items():
            have = got_headers.get(name.lower())
            if have is None:
                return f"backend did not get header {name}"
            if ",".join(have if isinstance(have, list) else [have]) != value:
                return f"backend got {name}: {have}, want {value!r}"
        for name in want.get("absentHeaders") or []:
            if name.lower() in got_headers:
                return f"backend got header {name}, which should be absent"
        strip = (lambda s: s.replace(" ", "")) if resp.get("ignoreWhitespace") else (lambda s: s)
        for name, values in (resp.get("validHeaderValues") or {}).items():
            have = _joined(headers, name)
            if have is None or strip(have) not in [strip(v) for v in values]:
                return f"response header {name}: {have!r}, want one of {values}"
        for name, value in (resp.get("headers") or {}).items():
            have = _joined(headers, name)
            if have is None or strip(have) != strip(value):
                return f"response header {name}: {have!r}, want {value!r}"
        for name in resp.get("absentHeaders") or []:
            if _joined(headers, name) is not None:
                return f"response header {name} should be absent"
        if exp.get("backend") and not str(echoed.get("pod", "")).startswith(exp["backend"]):
            return f"answered by {echoed.get('pod')!r}, want {exp['backend']}"
        if want.get("sni") and (echoed.get("tls") or {}).get("serverName") != want["sni"]:
            return f"backend saw SNI {(echoed.get('tls') or {}).get('serverName')!r}, want {want['sni']!r}"
        return None
    if status in REDIRECTS and exp.get("redirect") is not None:
        from urllib.parse import urlsplit

        loc = _joined(headers, "Location")
        if loc is None:
            return "redirect without Location"
        u = urlsplit(loc)
        red = exp["redirect"]
        want_scheme = red.get("scheme") or scheme
        if u.scheme != want_scheme:
            return f"redirect scheme {u.scheme!r}, want {want_scheme!r} ({loc})"
        if red.get("host") and u.hostname != red["host"]:
            return f"redirect host {u.hostname!r}, want {red['host']!r} ({loc})"
        want_path = red.get("path") or req["path"].split("?")[0]
        if u.path != want_path:
            return f"redirect path {u.path!r}, want {want_path!r} ({loc})"
        port = str(u.port) if u.port is not None else ""
        if red.get("port"):
            if port != str(red["port"]):
                return f"redirect port {port!r}, want {red['port']!r} ({loc})"
        elif port not in ("", "80" if u.scheme == "http" else "443"):
            return f"redirect port {port!r}, want none ({loc})"
    return None


def pod_backend(pod: str) -> str:
    """The weight check's backend: the pod name without its last two '-'-separated parts."""
    return "-".join(pod.split("-")[:-2])
