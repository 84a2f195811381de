"""`gwpolicy bench dataplane`: it runs, on small clusters, and its figures are sane (no timing is
asserted: the machine is shared). Loopback: the benchmark's own 127.0.94.x / 127.0.95.1, free ports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gwpolicy.bench import dataplane
from gwpolicy.bench.run import main as bench_main

needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (Debian: nginx)")
needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (Debian: wrk; ./dev installs it)")
needs_valgrind = pytest.mark.skipif(not dataplane.valgrind_available(), reason="valgrind is not installed (Debian: valgrind)")


def test_the_routes_measured_are_the_first_middle_and_last_upstream_of_the_rendering() -> None:
    files = dataplane.render_gwpolicy(dataplane.cluster(30, "127.0.94.1", ("127.0.95.1", 18080)), 18000)
    order = dataplane.upstream_order(files)
    pos = dataplane.positions(files, 30)
    assert len(order) == 30
    assert [order.index(dataplane.host(pos[p]).split(".")[0]) for p in dataplane.POSITIONS] == [0, 15, 29]


@needs_nginx
@pytest.mark.parametrize("scenario", ["plain", *dataplane.SCENARIOS])
def test_both_configurations_of_every_scenario_pass_nginx_t(tmp_path: Path, scenario: str) -> None:
    objs = dataplane.cluster(3, "127.0.94.1", ("127.0.95.1", 18080), scenario, (1,), keepalive=scenario == "plain")
    gw = b"".join(dataplane.render_gwpolicy(objs, 18000).values()).decode()
    # gwpolicy proxies every route to the backend (a route without endpoints would measure a 500)
    assert "no ready endpoints" not in gw and gw.count("server 127.0.95.1:18080") >= 3
    if scenario in ("timeout", "all"):
        assert "proxy_read_timeout 30s;" in gw
    if scenario in ("ratelimit", "all"):
        assert "limit_req zone=rl" in gw
    for name, files in (("gw", dataplane.render_gwpolicy(objs, 18000)),
                        ("hw", dataplane.handwritten(3, "127.0.94.2", 18080, ("127.0.95.1", 18080), scenario, (1,)))):
        cur = dataplane.write_tree(tmp_path / name, files)
        done = subprocess.run(["nginx", "-t", "-q", "-p", f"{cur}/", "-c", "nginx.conf"], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)
    text = files["nginx.conf"].decode()
    if scenario in ("ratelimit", "all"):
        assert "limit_req zone=rl" in text
    if scenario in ("matches", "all"):
        assert "$arg_v" in text


@needs_nginx
@needs_wrk
def test_the_benchmark_measures_both_configurations_and_reports_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    code = bench_main(["dataplane", "--sizes", "12", "--scenarios", "all", "--rounds", "1", "--duration", "1",
                       "--rate-duration", "1", "--no-instructions", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = capsys.readouterr().out
    assert "| routes | scenario | keepalive | route |" in report
    rows = json.loads(out.read_text())["rows"]
    # 12 routes: first, middle and last, keepalive off and on; the scenario's one route; two configurations each
    assert len(rows) == (3 * 2 + 1) * 2
    for r in rows:
        assert r["rps"] > 0 and r["errors"] == 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["cpu_us"] > 0 and r["reload_first_ms"] > 0, r
        if r["keepalive"]:  # the backend keeps its connections: far fewer than one per request
            assert r["backend_conns_per_req"] < 0.2, r
        else:  # a new backend connection for each request
            assert r["backend_conns_per_req"] > 0.8, r
    gw = {(r["keepalive"], r["position"]) for r in rows if r["config"] == "gw" and r["scenario"] == "plain"}
    assert gw == {(ka, p) for ka in (False, True) for p in dataplane.POSITIONS}


@needs_nginx
@needs_valgrind
def test_instructions_per_request_are_counted_for_each_route(tmp_path: Path) -> None:
    transform = tmp_path / "same.py"
    transform.write_text("def transform(files):\n    return dict(files)\n")
    opts = dataplane.Options(sizes=[12], scenarios=[], scenario_routes=1, rounds=1, duration=1, conns=4, rate=100,
                             rate_duration=0, n1=20, n2=100, load=False, instructions=True, workdir=tmp_path / "w",
                             transform=dataplane.load_transform(str(transform)), workers=1)
    rows = dataplane.measure(opts, log=lambda s: None)["rows"]
    assert len(rows) == 2 * 3 * 3  # keepalive off/on, three routes, hw + gw + the transformed gw
    for r in rows:
        assert 5_000 < r["ir_per_request"] < 2_000_000, r
        assert r["ir_first"] > 0, r
    by = {(r["config"], r["keepalive"], r["position"]): r["ir_per_request"] for r in rows}
    for key, ir in by.items():  # the untouched transform is the same configuration: the same count
        if key[0] == "x":
            assert abs(ir - by[("gw", *key[1:])]) <= 0.01 * ir, key


def test_without_wrk_the_report_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = shutil.which
    monkeypatch.setattr(dataplane.shutil, "which", lambda name: None if name in ("wrk", "hey", "valgrind") else real(name))
    if real("nginx") is None:
        assert dataplane.main(["--sizes", "1", "--scenarios", ""]) == 2
        assert "nginx is not installed" in capsys.readouterr().err
        return
    assert dataplane.main(["--sizes", "1", "--scenarios", "", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "note: wrk is not installed (Debian: apt-get install wrk)" in out
    assert "note: valgrind is not installed" in out


@pytest.mark.parametrize("argv, said", [
    (["--sizes", "0"], "must be at least 1"),
    (["--scenarios", "timeout,bogus"], "'bogus': scenarios are"),
    (["--instruction-requests", "100,10"], "0 < N1 < N2"),
    (["--worker-processes", "two"], "--worker-processes"),
])
def test_bad_options_are_refused_with_the_reason(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        dataplane.main(argv)
    assert said in capsys.readouterr().err
