"""`gwpolicy bench tracing`: it runs end to end on tiny parameters and reports its figures (no timing
is asserted: the machine is shared). Loopback: 127.0.95.1, free ports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gwpolicy.bench import tracing
from gwpolicy.bench.run import main as bench_main

needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (Debian: nginx)")
needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (Debian: wrk; ./dev installs it)")


@needs_nginx
def test_the_configuration_under_test_passes_nginx_t_and_traces_only_the_traced_location(tmp_path: Path) -> None:
    conf = tracing.front_conf("127.0.95.1", 18001, "127.0.95.1:18002", "127.0.95.1:18003")
    plain, traced = conf.split("location /plain")[1].split("location /traced")
    assert "access_log" not in plain and "traceparent" not in plain
    assert "access_log syslog:server=127.0.95.1:18003" in traced and "traceparent 00-$gw_tr_trace" in traced
    (tmp_path / "nginx.conf").write_text(conf)
    for d in ("../run", "../logs"):
        (tmp_path / d).mkdir(exist_ok=True)
    done = subprocess.run(["nginx", "-t", "-q", "-p", f"{tmp_path}/", "-c", "nginx.conf"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_nginx
@needs_wrk
def test_the_benchmark_traces_every_request_of_the_paced_run_and_reports_the_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    code = bench_main(["tracing", "--rounds", "1", "--seconds", "1", "--rate", "100", "--paced-seconds", "2",
                       "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    for words in ("untraced:", "traced (ratio 100, propagate):", "cost of tracing:", "span relay:", "us per span",
                  "load average"):
        assert words in text
    r = json.loads(out.read_text())
    assert all(x["rps"] > 0 for k in ("plain", "traced") for x in r["saturation"][k])
    paced = r["paced"]
    # 100%: one span per request (wrk does not count the requests still in flight when it stops)
    assert 0 < paced["requests"] <= paced["spans"] <= paced["requests"] + tracing.PACED_CONNS
    assert paced["relay_cpu_s"] > 0
    counts = r["relay_counts"]
    assert counts["malformed"] == 0 and counts["export_failed"] == 0
    assert counts["received"] > paced["requests"]
