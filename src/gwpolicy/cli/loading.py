"""Reading what a command analyses: the -f files, or the cluster of the kubeconfig."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.files.load import load_paths

#: phase timings, printed on stderr as JSON when GWPOLICY_TIMINGS is set (the benchmark reads them)
TIMINGS: dict[str, float] | None = {} if os.environ.get("GWPOLICY_TIMINGS") else None


class CliError(Exception):
    """A user-facing error: printed as `Error: ...` on stderr, exit code 1."""


def load_analysis(args: argparse.Namespace, namespace: str) -> tuple[Analysis, Callable[[list[dict[str, Any]]], Analysis]]:
    t0 = time.perf_counter()
    if args.filename:
        loaded = load_paths(args.filename)
        for w in loaded.warnings:
            print(f"Warning: {w}", file=sys.stderr)
    else:  # live mode: read the cluster of the kubeconfig (read-only)
        from gwpolicy.cli.live import read_cluster
        from gwpolicy.files.load import Loaded

        try:
            objects = read_cluster(args.kubeconfig, args.context)
        except RuntimeError as exc:
            raise CliError(str(exc)) from exc
        loaded = Loaded(objects, [cluster_origin(o) for o in objects])
    if TIMINGS is not None:
        TIMINGS["load"] = time.perf_counter() - t0

    def run(raws: list[dict[str, Any]], origins: list[str] | None = None) -> Analysis:
        return analyse(raws, origins, default_namespace=namespace, controller=args.controller_name, now=args.now,
                       timings=TIMINGS)

    a = run(loaded.objects, loaded.origins)
    for w in a.warnings:
        print(f"Warning: {w}", file=sys.stderr)
    return a, run


def cluster_origin(obj: dict[str, Any]) -> str:
    """Where a live object came from, named as every other reference is: `cluster: Kind/namespace/name`."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"cluster: {obj.get('kind')}/" + (f"{ns}/" if ns else "") + str(meta.get("name"))
