"""kube-apiserver's webhook client authentication: with --client-ca-file the webhook answers /validate
only for a caller whose certificate that CA signed (and, with --client-name, has one of those names);
anyone else learns nothing about any namespace's policies. /healthz still answers probes."""

from __future__ import annotations

import datetime as dt
import json
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gwpolicy.webhook import certs
from sandbox_proc import SandboxProcess
from test_webhook import PARABLE, Webhook, find, parable_raws, request


def client_cert(ca: certs.KeyPair, name: str, tmp: Path) -> tuple[str, str]:
    """A client certificate (CN `name`, clientAuth) signed by `ca`, as files."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    pair = certs.KeyPair(cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return certs.write_pair(str(tmp), f"client-{name}", pair)


def test_validate_answers_only_callers_with_a_certificate_of_the_client_ca(tmp_path):
    ca, other_ca = certs.make_ca("apiserver-client-ca"), certs.make_ca("someone-else")
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    sb = SandboxProcess(tmp_path, "--keep-creation-timestamp", "-f", str(PARABLE))
    hook = Webhook(sb, "--no-register", "--client-ca-file", str(ca_file), "--client-name", "kube-apiserver")
    try:
        line = ""
        while "serving https://" not in line:
            line = hook.proc.stderr.readline()
            assert line or hook.proc.poll() is None, "the webhook did not start"
        port = int(re.search(r":(\d+)/validate", line).group(1))
        review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "request": request("UPDATE", find(parable_raws(), "HTTPRoute", "baker", "cake"))}).encode()

        def post(cert: tuple[str, str] | None, path: str = "/validate") -> tuple[int, bytes]:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            if cert is not None:
                ctx.load_cert_chain(*cert)
            req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=review if path == "/validate" else None,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        import time
        deadline = time.monotonic() + 30
        status, body = post(client_cert(ca, "kube-apiserver", tmp_path))
        while b"is affected by" not in body and time.monotonic() < deadline:  # until its first analysis
            time.sleep(0.2)
            status, body = post(client_cert(ca, "kube-apiserver", tmp_path))
        assert status == 200 and b"is affected by" in body, body
        assert post(None)[0] == 401  # no certificate: nothing about anyone's policies
        assert post(client_cert(ca, "someone", tmp_path))[0] == 403  # signed, but not a name it answers
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            post(client_cert(other_ca, "kube-apiserver", tmp_path))  # another CA: the handshake fails
        assert post(None, "/healthz") == (200, b"ok")  # probes need no certificate
    finally:
        hook.close()
        sb.close()
