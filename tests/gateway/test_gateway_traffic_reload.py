"""Reloads verified, not assumed (127.0.11.0/24): no request lost while the configuration changes,
each change in traffic within 1 s, a configuration NGINX rejects never loaded, a reload that fails
after `nginx -t` (a port in use) detected with the last good configuration still serving, and NGINX
never outliving the process that started it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gateway_kit import (
    Echoes,
    Served,
    backend,
    eventually,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    request,
    route,
)

pytestmark = pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")

ADDR = "127.0.11.1"
BACKENDS = "127.0.11.2"


def manifests(echoes: Echoes, port: int, version: int, extra_listener: dict | None = None) -> list[dict]:
    """Change number `version`: the route sends to v1 or v2 and says which change it is in a header."""
    listeners = [listener("http", port)] + ([extra_listener] if extra_listener else [])
    rules = [{"backendRefs": [backend("v1" if version % 2 == 0 else "v2")],
              "filters": [{"type": "ResponseHeaderModifier",
                           "responseHeaderModifier": {"set": [{"name": "X-Change", "value": str(version)}]}}]}]
    return [gatewayclass(), *echoes.objects(), gateway("gw", "infra", *listeners),
            route("r", "infra", rules, hostnames=["reload.test"])]


@pytest.fixture()
def setup(tmp_path):
    echoes = Echoes(BACKENDS).start("v1", "v2")
    port = free_port(ADDR)
    served = Served(tmp_path / "nginx", ADDR)
    yield served, echoes, port
    served.stop()
    echoes.stop()


def test_twenty_changes_under_steady_traffic_lose_nothing_and_show_within_a_second(setup):
    served, echoes, port = setup
    served.apply(manifests(echoes, port, 0))
    stop = threading.Event()
    failures: list[str] = []
    sent = [0]
    seen: dict[int, float] = {}  # change -> first time a response carried it
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            try:
                a = request(ADDR, port, "/", "reload.test", timeout=5)
                change = int(a.headers.get("x-change", "-1"))
                ok = a.status == 200 and a.pod.startswith("v1-" if change % 2 == 0 else "v2-")
                with lock:
                    sent[0] += 1
                    seen.setdefault(change, time.monotonic())
                    if not ok:
                        failures.append(f"change {change}: {a.status} {a.pod}")
            except OSError as e:  # a connection refused or reset would be a lost request
                with lock:
                    failures.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    lag = []
    try:
        for version in range(1, 21):
            t0 = time.monotonic()
            result = served.apply(manifests(echoes, port, version))
            assert result.ok and result.changed
            assert eventually(lambda: version in seen, timeout=5, poll=0.01), f"change {version} never seen"
            lag.append(seen[version] - t0)
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert sent[0] > 100
    assert max(lag) < 1.0, lag
    assert served.nginx.generation == 21


def test_a_configuration_nginx_rejects_is_never_loaded(setup):
    served, echoes, port = setup
    served.apply(manifests(echoes, port, 0))
    files = served.files(manifests(echoes, port, 1))
    files["servers.conf"] += b"\nnot_a_directive on;\n"
    result = served.nginx.apply(files)
    assert not result.ok and "not_a_directive" in result.error and "rejected" in result.error
    assert result.generation == 1 == served.nginx.generation
    # nothing of it is left: `current` is the serving generation again, the rejected tree is gone
    root = served.nginx.root
    assert (root / "current").resolve() == (root / "gen-1").resolve()
    assert sorted(p.name for p in root.glob("gen-*")) == ["gen-1"]
    a = request(ADDR, port, "/", "reload.test")
    assert (a.status, a.headers["x-change"]) == (200, "0")
    # with `nginx -t` before every reload (test_reloads), the same configuration stops there
    served.nginx.test_reloads = True
    result = served.nginx.apply(files)
    assert not result.ok and "not_a_directive" in result.error and "nginx -t" in result.error
    assert served.nginx.generation == 1 and served.nginx.probe() == 1
    served.nginx.test_reloads = False
    # the next good configuration goes in as usual
    served.apply(manifests(echoes, port, 2))
    assert request(ADDR, port, "/", "reload.test").headers["x-change"] == "2"


def test_a_reload_that_fails_after_nginx_t_is_detected_and_the_old_configuration_keeps_serving(setup):
    served, echoes, port = setup
    served.apply(manifests(echoes, port, 0))
    busy = socket.socket()
    busy.bind((ADDR, 0))
    busy.listen()
    taken = busy.getsockname()[1]
    try:
        files = served.files(manifests(echoes, port, 1, extra_listener=listener("more", taken)))
        result = served.nginx.apply(files)
        assert not result.ok
        assert "Address already in use" in result.error and f"{ADDR}:{taken}" in result.error
        assert served.nginx.generation == 1
        assert served.nginx.probe() == 1
        assert request(ADDR, port, "/", "reload.test").headers["x-change"] == "0"
    finally:
        busy.close()
    result = served.nginx.apply(files)  # the port is free now: the same change goes in
    assert result.ok, result.error
    assert request(ADDR, taken, "/", "reload.test").headers["x-change"] == "1"


def test_unchanged_files_do_not_reload(setup):
    served, echoes, port = setup
    first = served.apply(manifests(echoes, port, 0))
    again = served.apply(manifests(echoes, port, 0))
    assert (again.changed, again.generation) == (False, first.generation)


CHILD = """
import sys, time
from gwpolicy.gateway.nginx import Nginx
n = Nginx(sys.argv[1], outlive=sys.argv[3] == "outlive")
r = n.apply({"nginx.conf": open(sys.argv[2], "rb").read()})
assert r.ok, r.error
print(n.pid, flush=True)
if sys.argv[4] == "sleep":
    time.sleep(60)
"""
MIN_CONF = ("pid ../run/nginx.pid;\nerror_log ../logs/error.log;\nevents {}\nhttp {\n    access_log off;\n"
            "    client_body_temp_path ../run/b; proxy_temp_path ../run/p; fastcgi_temp_path ../run/f;\n"
            "    uwsgi_temp_path ../run/u; scgi_temp_path ../run/s;\n    include control*.conf;\n}\n")


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_nginx_outlives_a_killed_process_and_the_next_one_adopts_it(tmp_path: Path, sig: int) -> None:
    """The gateway's way (outlive=True): NGINX serves on after its process is killed; a new Nginx on
    the same root adopts it (same master, same generation, nothing reloaded) and stop() ends it."""
    from gwpolicy.gateway.nginx import Nginx

    conf = tmp_path / "min.conf"
    conf.write_text(MIN_CONF)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "root"), str(conf), "outlive", "sleep"],
                             stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    adopter = None
    try:
        child.send_signal(sig)
        child.wait(10)
        time.sleep(0.3)
        assert not _gone(pid), "NGINX ended with the process that started it"
        adopter = Nginx(tmp_path / "root", outlive=True)
        assert adopter.adopted == (pid, 1) and adopter.pid == pid and adopter.probe() == 1
        again = adopter.apply({"nginx.conf": conf.read_bytes()})
        assert again.ok and not again.changed and adopter.pid == pid  # the files it serves: nothing reloaded
        changed = adopter.apply({"nginx.conf": conf.read_bytes() + b"# edited\n"})
        assert changed.ok and changed.changed and adopter.pid == pid and adopter.probe() == changed.generation
    finally:
        if child.poll() is None:
            child.kill()
        (adopter or Nginx(tmp_path / "root", outlive=True)).stop()
    assert eventually(lambda: _gone(pid), timeout=10), "stop() did not end the adopted NGINX"


CRASH_BEFORE_VERIFY = """
import os, signal, sys, time
from gwpolicy.gateway.nginx import Nginx
def crash(self, gen, offset):
    print(self.pid, flush=True)
    time.sleep(0.5)  # the master has bound its ports by now
    os.kill(os.getpid(), signal.SIGKILL)
Nginx._verify = crash
Nginx(sys.argv[1], outlive=True).apply({"nginx.conf": open(sys.argv[2], "rb").read()})
"""


def test_a_process_killed_before_nginx_answered_leaves_no_nginx_to_the_next(tmp_path: Path) -> None:
    """A gateway killed between starting NGINX and seeing it serve: the master is already recorded
    (state file), so the next process on the root finds it unverified and stops it, instead of
    leaving it on the ports with nobody to stop it."""
    from gwpolicy.gateway.nginx import Nginx

    conf = tmp_path / "min.conf"
    conf.write_text(MIN_CONF)
    out = subprocess.run([sys.executable, "-c", CRASH_BEFORE_VERIFY, str(tmp_path / "root"), str(conf)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid = int(out.stdout)
    try:
        assert not _gone(pid), "NGINX ended with the process that started it"
        successor = Nginx(tmp_path / "root", outlive=True)
        assert successor.adopted is None and successor.not_adopted
        assert eventually(lambda: _gone(pid), timeout=15), "the unverified master was left running"
    finally:
        if not _gone(pid):
            os.killpg(pid, signal.SIGKILL)  # the master leads its own process group: its workers go with it


def test_a_library_user_leaves_no_nginx_behind_when_it_exits(tmp_path: Path) -> None:
    """Tests and benchmarks (outlive=False): NGINX stops when the interpreter exits normally."""
    conf = tmp_path / "min.conf"
    conf.write_text(MIN_CONF)
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "root"), str(conf), "library", "exit"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout)
    assert eventually(lambda: _gone(pid), timeout=10), "NGINX outlived the library user's normal exit"


def test_a_missing_or_unusable_nginx_is_named_with_what_to_install(tmp_path: Path) -> None:
    from gwpolicy.gateway.nginx import Nginx, NginxError, check_modules

    with pytest.raises(NginxError, match=r"NGINX not found .*install the Debian package 'nginx'"):
        Nginx(tmp_path, binary=str(tmp_path / "no-nginx-here"))
    fake = tmp_path / "old-nginx"
    fake.write_text("#!/bin/sh\necho 'nginx version: nginx/1.18.0' >&2\n")
    fake.chmod(0o755)
    with pytest.raises(NginxError, match=r"NGINX 1\.18\.0 .* too old: this data plane needs 1\.22"):
        Nginx(tmp_path, binary=str(fake))
    with pytest.raises(NginxError, match="libnginx-mod-http-js"):
        check_modules({"nginx.conf": b"load_module /nowhere/ngx_http_js_module.so;\n"})


def test_once_apply_returns_every_new_connection_gets_the_new_configuration(setup):
    """Right after a SIGHUP both generations' workers accept on the same sockets; apply() returns
    only when the old ones have stopped accepting, so `Programmed` never runs ahead of traffic."""
    served, echoes, port = setup
    served.apply(manifests(echoes, port, 0))
    stale = []
    for version in range(1, 11):
        served.apply(manifests(echoes, port, version))
        for _ in range(5):
            got = request(ADDR, port, "/", "reload.test").headers.get("x-change")
            if got != str(version):
                stale.append((version, got))
    assert stale == []


def _tls_manifests(echoes: Echoes, port: int, tls_port: int, cert: tuple[bytes, bytes] | None, version: int) -> list[dict]:
    from gateway_kit import tls_secret

    objs = manifests(echoes, port, version)
    if cert is None:
        return objs
    gw = next(o for o in objs if o["kind"] == "Gateway")
    gw["spec"]["listeners"].append(listener("https", tls_port, "HTTPS", "reload.test",
                                            tls={"certificateRefs": [{"name": "cert"}]}))
    return objs + [tls_secret("cert", "infra", *cert)]


def test_a_restart_on_the_same_state_dir_serves_its_own_generation_and_keeps_no_old_private_key(tmp_path):
    """A restarted gateway (same --state-dir) numbers its generations after the previous run's:
    what it loads stays on disk (`current` never dangles), the previous run's trees are gone, and
    only the serving generation holds private keys."""
    from gateway_kit import self_signed

    crt, key = self_signed(tmp_path, "reload", ["reload.test"])
    cert = (crt.read_bytes(), key.read_bytes())
    echoes = Echoes(BACKENDS).start("v1", "v2")
    port, tls_port = free_port(ADDR), free_port(ADDR)
    root = tmp_path / "state"
    try:
        first = Served(root, ADDR)
        try:
            for version in range(3):
                first.apply(_tls_manifests(echoes, port, tls_port, cert, version))
            # an older generation keeps its configuration to look at, never its keys
            assert sorted(p.name for p in root.glob("gen-*")) == ["gen-2", "gen-3"]
            assert not (root / "gen-2" / "secrets").exists() and (root / "gen-3" / "secrets").is_dir()
        finally:
            first.stop()
        again = Served(root, ADDR)  # the restart; the Secret was deleted meanwhile
        try:
            result = again.apply(_tls_manifests(echoes, port, tls_port, None, 0))
            assert result.generation == 4
            again.apply(_tls_manifests(echoes, port, tls_port, None, 1))
            assert (root / "current").resolve() == (root / "gen-5").resolve() and (root / "gen-5").is_dir()
            assert sorted(p.name for p in root.glob("gen-*")) == ["gen-4", "gen-5"]
            assert list(root.glob("gen-*/secrets/*")) == []
            assert request(ADDR, port, "/", "reload.test").headers["x-change"] == "1"
        finally:
            again.stop()
    finally:
        echoes.stop()
