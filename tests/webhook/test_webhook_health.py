"""The webhook's /healthz, as a kubelet probe meets it, with no deprecated aiohttp use on the way.

aiohttp deprecates a plain function as a handler (it wraps it, with a DeprecationWarning, for now);
a webhook that registered /healthz so would stop answering its probe once aiohttp drops the wrapper.
The webhook runs here with that one warning made an error (mypy found the plain handler)."""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import urllib.request

from helpers import ROOT
from sandbox_proc import BIN, SandboxProcess


def test_webhook_serves_healthz_with_aiohttps_deprecated_handler_warning_an_error(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="error:Bare functions are deprecated:DeprecationWarning")
    with SandboxProcess(tmp_path, "-f", str(ROOT / "examples" / "parable")) as sb:
        proc = subprocess.Popen([str(BIN / "gwpolicy"), "webhook", "--kubeconfig", str(sb.kubeconfig), "--port", "0",
                                 "--health-listen", "127.0.0.1:0", "--no-register"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            seen = []
            while not any("serving https://" in line for line in seen):
                line = proc.stderr.readline()
                assert line, "the webhook ended before serving:\n" + "".join(seen)
                seen.append(line)
            m = re.search(r":(\d+)/validate", seen[-1])
            if m is None:  # no port: it failed on the way (the rest of its output says why)
                proc.terminate()
                raise AssertionError("the webhook did not serve:\n" + "".join(seen) + proc.stderr.read())
            port = int(m.group(1))
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its own CA; only the answer matters here
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=5) as resp:
                assert (resp.status, resp.read()) == (200, b"ok")
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
