"""Every directive policyconf and backendtls emit is accepted by the NGINX 1.22 we run, in its context.

`nginx -t` on a small config holding all of them: a field translated into something 1.22 rejects
(e.g. keepalive_min_timeout) would otherwise only show when a user's policy breaks the reload.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gwpolicy.gateway import backendtls as bt
from gwpolicy.gateway import policies
from gwpolicy.gateway import policyconf as pc
from gwpolicy.refs import Ref

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed")

EVERYTHING = {
    "TimeoutPolicy": {"connectionTimeout": "500ms", "readTimeout": "1m30s", "sendTimeout": 2, "idleTimeout": "75s"},
    "RetryPolicy": {"attempts": 3, "retryOn": ["connect-failure", "reset", "timeout", "invalid-header"],
                    "codes": list(pc.RETRYABLE_CODES), "nonIdempotent": True, "retryBudget": "10s"},
    "ClientSettingsPolicy": {"body": {"maxSize": "1Mi", "timeout": "5s"},
                             "keepAlive": {"requests": 50, "time": "1h", "timeout": "30s"}},
    "RateLimitPolicy": {"requests": 5, "unit": "Minute", "burst": 2, "noDelay": False,
                        "key": {"type": "Header", "header": "X-User-Id"}, "zoneSize": "1m"},
}
UPSTREAM = {"UpstreamSettingsPolicy": {"keepAlive": {"connections": 16, "requests": 100, "time": "1h",
                                                     "timeout": "60s"}, "zoneSize": "512k"}}


def _nginx_t(tmp_path: Path, conf: str) -> subprocess.CompletedProcess[str]:
    for d in ("logs", "run"):
        (tmp_path / d).mkdir(exist_ok=True)
    (tmp_path / "nginx.conf").write_text(conf)
    return subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                           "-g", f"pid {tmp_path}/run/nginx.pid; error_log {tmp_path}/logs/error.log;"],
                          capture_output=True, text=True, timeout=30)


def test_all_directives_pass_nginx_t(tmp_path: Path) -> None:
    collected = policies.Collected()
    loc = collected.location(EVERYTHING, scope="p")
    pem = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                          "-nodes", "-keyout", str(tmp_path / "k.pem"), "-subj", "/CN=ca", "-days", "1"],
                         capture_output=True, timeout=30).stdout
    assert pem.startswith(b"-----BEGIN CERTIFICATE-----")
    prof = bt.TLSProfile("abc.example.com", pem, Ref("gateway.networking.k8s.io", "BackendTLSPolicy", "ns", "p"))
    for rel, data in prof.files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    system = bt.TLSProfile("abc.example.com", None, prof.policy)
    up = policies.upstream_directives("up", UPSTREAM, peer_copies=loc.peer_copies)
    ind = "\n        "
    conf = f"""events {{}}
http {{
    {chr(10).join(collected.http())}
    upstream up {{
        server 127.0.30.1:9 {up.server_params};
        server 127.0.30.1:9 {up.server_params};
        server 127.0.30.1:9 {up.server_params};
        {ind.join(up.lines)}
    }}
    server {{
        listen 127.0.30.1:18080;
        location /a {{
            {ind.join(loc.lines)}
            {ind.join(prof.directives(str(tmp_path)))}
            proxy_pass https://up;
        }}
        location /b {{
            {ind.join(system.directives())}
            proxy_pass https://up;
        }}
    }}
}}
"""
    r = _nginx_t(tmp_path, conf)
    assert r.returncode == 0, r.stderr + conf
    assert "[warn]" not in r.stderr, r.stderr


def test_the_unsupported_directive_really_is_rejected(tmp_path: Path) -> None:
    """Why keepAlive.minTimeout is refused: NGINX 1.22 does not know keepalive_min_timeout."""
    r = _nginx_t(tmp_path, "events {}\nhttp { server { listen 127.0.30.1:18081; keepalive_min_timeout 1s; } }\n")
    assert r.returncode != 0 and "unknown directive" in r.stderr
