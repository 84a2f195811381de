"""What the benchmarks read of another process from /proc (Linux), in one place: its CPU seconds,
and its current and peak resident memory. Each figure is None when the process is gone (or /proc
is not there): a benchmark then reports no figure rather than a wrong one."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of a live process so far (fields 14 and 15 of /proc/PID/stat;
    the command name before them may hold spaces and parentheses, hence the split at the last ')')."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def memory_mb(pid: int) -> tuple[float | None, float | None]:
    """(current, peak) resident memory of a live process in MB: VmRSS and VmHWM of /proc/PID/status."""
    rss = peak = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        pass
    return rss, peak
