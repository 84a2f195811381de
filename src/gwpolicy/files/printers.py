"""kubectl-like printing: tables with uppercase headers, AGE, `-o name`, colour only on a terminal."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from typing import Sequence


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery HumanDuration, as kubectl prints AGE."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        y = h // (24 * 365)
        return f"{y}y{(h % (24 * 365)) // 24}d" if (h % (24 * 365)) // 24 else f"{y}y"
    return f"{h // (24 * 365)}y"


def _parse(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(created: str, now: str) -> str:
    c, n = _parse(created), _parse(now)
    if c is None or n is None or c.year >= 9999:
        return "<unknown>"
    return human_duration((n - c).total_seconds())


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, show_headers: bool = True,
          min_width: int = 0) -> str:
    """Columns padded as kubectl's tabwriter pads them (3 spaces between columns).

    `min_width=6` is kubectl's own minimum cell width (it shows with `--no-headers` and short values).
    """
    shown = ([list(headers)] if show_headers else []) + [list(r) for r in rows]
    if not shown:
        return ""
    widths = [0] * max(len(r) for r in shown)
    for row in shown:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in shown:
        cells = [cell.ljust(max(widths[i] + 3, min_width)) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        lines.append("".join(cells).rstrip())
    return "\n".join(lines) + "\n"


class Style:
    """ANSI colour when stdout is a terminal and NO_COLOR is unset; plain text otherwise."""

    def __init__(self, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def good(self, text: str) -> str:
        return self._wrap("32", text)

    def bad(self, text: str) -> str:
        return self._wrap("31", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def state(self, text: str) -> str:
        return self.good(text) if text in ("True", "Accepted", "effective", "yes") else self.bad(text)
