"""PEM certificates and keys as NGINX will load them, checked with `cryptography` first.

NGINX reads a listener's certificate and key, a client-certificate CA bundle and a backend's CA
bundle when it loads a configuration, and refuses the whole configuration when one of them does not
parse or a key does not belong to its certificate. So every such file is parsed here, before it is
rendered, and a bad one makes only the object that named it unusable (its status says which block
and why). Pure: bytes in, a verdict out; verdicts are cached by content (status and the data plane
ask about the same Secrets and ConfigMaps on every change).
"""

from __future__ import annotations

import functools
import re

from cryptography import x509
from cryptography.hazmat.primitives import serialization

_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


@functools.lru_cache(maxsize=4096)
def certificates_problem(pem: bytes) -> str | None:
    """None when `pem` holds at least one certificate and every `CERTIFICATE` block in it is an
    X.509 certificate, else what is wrong with the first bad one."""
    blocks = _BLOCK.findall(pem)
    if not blocks:
        return "no PEM certificate (-----BEGIN CERTIFICATE-----)"
    for i, block in enumerate(blocks):
        try:
            x509.load_pem_x509_certificate(block)
        except ValueError as exc:
            return f"certificate {i + 1} of {len(blocks)} is not a valid X.509 certificate ({_short(exc)})"
    return None


def certificate_blocks(pem: bytes) -> list[bytes]:
    """The `CERTIFICATE` blocks of a PEM text, in order (what NGINX is given of a CA bundle)."""
    return list(_BLOCK.findall(pem))


@functools.lru_cache(maxsize=1024)
def key_pair_problem(certificate: bytes, key: bytes) -> str | None:
    """None when `certificate` (a PEM chain, the server's own first) parses and `key` is an
    unencrypted PEM private key of its public key, else why NGINX would refuse the pair."""
    problem = certificates_problem(certificate)
    if problem is not None:
        return f"tls.crt: {problem}"
    leaf = x509.load_pem_x509_certificate(_BLOCK.findall(certificate)[0])
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        return f"tls.key is not an unencrypted PEM private key ({_short(exc)})"
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        matches = private.public_key().public_bytes(*fmt) == leaf.public_key().public_bytes(*fmt)
    except (ValueError, TypeError) as exc:
        return f"tls.crt's public key cannot be read ({_short(exc)})"
    if not matches:
        return "tls.key is not the private key of the certificate in tls.crt"
    return None


def _short(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
