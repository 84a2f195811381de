"""BackendTLSPolicy on the NGINX data plane: profiles, CA bundles and the conformance cases' conditions."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gwconformance import merge_patch
from gwpolicy.analysis import analyse
from gwpolicy.gateway import backendtls as bt
from gwpolicy.refs import Ref

CASES = Path(__file__).resolve().parents[3] / "shared" / "gateway-conformance"
NOW = "2026-01-01T00:00:00Z"


def make_ca(cn: str = "test-ca") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], *hosts: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `hosts`, signed by `ca`."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def configmap(name: str, ns: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data}


def _stamp(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Creation timestamps in file order (what an API server gives objects applied in order)."""
    out = copy.deepcopy(objs)
    for i, o in enumerate(out):
        md = o.setdefault("metadata", {})
        md.setdefault("creationTimestamp", f"2025-01-01T00:{i // 60:02d}:{i % 60:02d}Z")
        md.setdefault("generation", 1)
    return out


def _policy_conditions(objs: list[dict[str, Any]]) -> dict[str, dict[str, tuple[str, str]]]:
    a = analyse(_stamp(objs), now=NOW)
    return {ref.name: {c["type"]: (c["status"], c["reason"]) for c in conds}
            for ref, conds in bt.all_conditions(a).items()}


@pytest.fixture(scope="module")
def ca_configmaps() -> list[dict[str, Any]]:
    ns = "gateway-conformance-infra"
    return [configmap("tls-checks-ca-certificate", ns, {"ca.crt": pem(make_ca("CA-3")[1])}),
            configmap("mismatch-ca-certificate", ns, {"ca.crt": pem(make_ca("mismatch")[1])})]


def _expected(status: list[dict[str, Any]]) -> dict[str, dict[str, tuple[str, str]]]:
    out = {}
    for entry in status:
        if entry["object"]["kind"] != "BackendTLSPolicy":
            continue
        conds = {c["type"]: (c["status"], c["reason"]) for anc in entry["ancestors"] for c in anc["conditions"]}
        out[entry["object"]["name"]] = conds
    return out


@pytest.mark.parametrize("case", ["BackendTLSPolicy", "BackendTLSPolicyInvalidCACertificateRef",
                                  "BackendTLSPolicyInvalidKind"])
def test_conformance_case_conditions(case: str, ca_configmaps: list[dict[str, Any]]) -> None:
    base = yaml.safe_load((CASES / "base.yaml").read_text())["manifests"]
    doc = yaml.safe_load((CASES / f"{case}.yaml").read_text())
    objs = base + ca_configmaps + doc["manifests"]
    got = _policy_conditions(objs)
    want = _expected(doc.get("status") or [])
    assert want, "the case names BackendTLSPolicy conditions"
    for name, conds in want.items():
        assert {t: got[name][t] for t in conds} == conds, name
    values = {f"configMap:{c['metadata']['namespace']}/{c['metadata']['name']}/ca.crt": c["data"]["ca.crt"]
              for c in ca_configmaps}
    for step in doc.get("steps") or []:
        for action in step["actions"]:
            if "patch" in action:
                o = action["patch"]["object"]
                for i, m in enumerate(objs):
                    md = m["metadata"]
                    if m["kind"] == o["kind"] and md.get("namespace") == o["namespace"] and md["name"] == o["name"]:
                        objs[i] = merge_patch(m, _subst(action["patch"]["mergePatch"], values))
            for new in action.get("apply") or []:
                objs.append(_subst(new, values))
        got = _policy_conditions(objs)
        for name, conds in _expected(step.get("status") or []).items():
            assert {t: got[name][t] for t in conds} == conds, (step["description"], name)


def _subst(obj: Any, values: dict[str, str]) -> Any:
    if isinstance(obj, dict):
        return {k: _subst(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_subst(v, values) for v in obj]
    if isinstance(obj, str) and obj.startswith("${") and obj.endswith("}"):
        return values[obj[2:-1]]
    return obj


def _btls(name: str, ts: str, validation: dict[str, Any], section: str | None = None, **spec: Any) -> dict[str, Any]:
    t = {"group": "", "kind": "Service", "name": "svc", **({"sectionName": section} if section else {})}
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": ts, "generation": 1},
            "spec": {"targetRefs": [t], "validation": validation, **spec}}


def _cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    gw = "gateway.networking.k8s.io"
    return [
        {"apiVersion": f"{gw}/v1", "kind": "GatewayClass", "metadata": {"name": "cls"}, "spec": {"controllerName": "x/y"}},
        {"apiVersion": f"{gw}/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "ns"},
         "spec": {"gatewayClassName": "cls", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": f"{gw}/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "ns"},
         "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "svc", "port": 443}]},
                                                           {"backendRefs": [{"name": "svc", "port": 8443}]}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": "ns"},
         "spec": {"ports": [{"name": "https-1", "port": 443}, {"name": "https-2", "port": 8443}]}},
        *extra]


def _profiles(objs: list[dict[str, Any]]) -> dict[str | None, bt.TLSProfile | bt.TLSFailure | None]:
    a = analyse(_stamp(objs), now=NOW)
    out = {}
    for ep in a.effective:
        if ep.target.kind == "Service" and ep.kind.kind == "BackendTLSPolicy":
            out[ep.target.section] = bt.for_backend({ep.kind.key: ep.result}, a.index)
    return out


def test_oldest_wins_and_a_port_policy_beats_the_whole_service_without_conflict() -> None:
    ca = pem(make_ca()[1])
    objs = _cluster(configmap("ca", "ns", {"ca.crt": ca}),
                    _btls("whole-1", "2025-01-01T00:00:01Z", {"hostname": "abc.example.com", "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]}),
                    _btls("whole-2", "2025-01-01T00:00:02Z", {"hostname": "zzz.example.com", "wellKnownCACertificates": "System"}),
                    _btls("port-1", "2025-01-01T00:00:03Z", {"hostname": "other.example.com", "wellKnownCACertificates": "System"}, "https-1"))
    conds = _policy_conditions(objs)
    assert conds["whole-1"]["Accepted"] == ("True", "Accepted")
    assert conds["whole-2"]["Accepted"] == ("False", "Conflicted")
    assert conds["port-1"]["Accepted"] == ("True", "Accepted")
    prof = _profiles(objs)
    assert prof["https-1"].hostname == "other.example.com" and prof["https-1"].ca_pem is None
    assert prof["https-2"].hostname == "abc.example.com" and prof["https-2"].ca_pem.decode().strip() == ca.strip()
    assert prof["https-1"].key != prof["https-2"].key
    lines = prof["https-2"].directives()
    assert "proxy_ssl_name abc.example.com;" in lines and "proxy_ssl_verify on;" in lines
    assert f"proxy_ssl_trusted_certificate {prof['https-2'].ca_file};" in lines
    assert prof["https-1"].directives()[4] == f"proxy_ssl_trusted_certificate {bt.SYSTEM_CA_FILE};"
    assert bt.profiles(p for p in prof.values() if isinstance(p, bt.TLSProfile)) == {
        prof["https-2"].ca_file: prof["https-2"].ca_pem}


def test_subject_alt_names_are_not_silently_dropped() -> None:
    objs = _cluster(_btls("san", "2025-01-01T00:00:01Z", {
        "hostname": "abc.example.com", "wellKnownCACertificates": "System",
        "subjectAltNames": [{"type": "URI", "uri": "spiffe://abc.example.com/x"}]}))
    conds = _policy_conditions(objs)
    assert conds["san"]["Accepted"] == ("False", "Invalid")
    assert conds["san"]["ResolvedRefs"] == ("True", "ResolvedRefs")
    failure = _profiles(objs)["https-1"]
    assert isinstance(failure, bt.TLSFailure) and "subjectAltNames" in failure.message


def test_not_a_certificate_and_unknown_well_known_are_reported() -> None:
    objs = _cluster(configmap("ca", "ns", {"ca.crt": "hello"}),
                    _btls("bad-pem", "2025-01-01T00:00:01Z", {"hostname": "a.example.com", "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]}))
    assert _policy_conditions(objs)["bad-pem"] == {"Accepted": ("False", "NoValidCACertificate"),
                                                    "ResolvedRefs": ("False", "InvalidCACertificateRef")}
    objs = _cluster(_btls("wk", "2025-01-01T00:00:01Z", {"hostname": "a.example.com", "wellKnownCACertificates": "Mozilla"}))
    assert _policy_conditions(objs)["wk"]["Accepted"] == ("False", "Invalid")
    assert bt.for_backend({}, None) is None
    assert isinstance(bt.for_backend({"BackendTLSPolicy": {"validation": {"hostname": "a.example.com"}}}, None),
                      bt.TLSFailure)  # a bare spec fails closed
    assert isinstance(bt.resolve({"validation": {"hostname": "A_B"}}, Ref("gateway.networking.k8s.io", "BackendTLSPolicy", "ns", "x"), None), bt.TLSFailure)
