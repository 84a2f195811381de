"""What the benchmarks read of another process from /proc (bench/procfs.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from gwpolicy.bench import procfs


def test_a_busy_child_shows_its_cpu_and_memory_and_a_gone_one_shows_none():
    # a child that holds ~60 MB and spins for ~0.4 s of CPU, with a name that has ') (' in it
    code = "import time\nb = bytearray(60 << 20)\nb[::4096] = b'x' * len(b[::4096])\nt = time.process_time()\n" \
           "while time.process_time() - t < 0.4: pass\ntime.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], executable=sys.executable)
    try:
        deadline = time.monotonic() + 20
        while (procfs.cpu_seconds(proc.pid) or 0) < 0.35 and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = procfs.cpu_seconds(proc.pid)
        rss, peak = procfs.memory_mb(proc.pid)
        assert cpu is not None and 0.35 <= cpu < 5
        assert rss is not None and peak is not None and 60 < rss <= peak
    finally:
        proc.kill()
        proc.wait()
    assert procfs.cpu_seconds(proc.pid) is None
    assert procfs.memory_mb(proc.pid) == (None, None)
