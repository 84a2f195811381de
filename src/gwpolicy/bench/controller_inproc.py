"""The controller's analysis in one process, without an API server: a `ClusterModel` fed the objects
of a synthetic cluster as its informers would feed them (JSON-shaped dicts, one ADDED event each),
then the full analysis, the child's peak RSS (the model's: `--verify` checks in processes of their own),
and one edit of each kind, each applied as an event:
the time to bring the analysis up to date (wall and CPU), whether it ran in place, and how many
objects came back to be checked.

Usage:
  gwpolicy bench controller-inproc --routes 1000,20000
  gwpolicy bench controller-inproc --cluster /work/benchdata/cluster-20000.yaml --json out.json

Each size runs in a fresh child process (`python -m gwpolicy.bench.controller_inproc --child FILE
RESULT.json`), so that its peak RSS is its own.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from gwpolicy import compiled
from gwpolicy.bench.edits import EDITS, fed, informer_objects


def child(path: str, verify: bool = False) -> dict[str, Any]:
    """Run in the child: feed, analyse, edit; the figures."""
    raws = informer_objects(path)
    out: dict[str, Any] = {"objects": len(raws), "routes": sum(1 for r in raws if r.get("kind") == "HTTPRoute")}
    w = time.perf_counter()
    model = fed(raws)
    out["feed_s"] = round(time.perf_counter() - w, 3)
    del raws
    w, c = time.perf_counter(), time.process_time()
    first = model.reconcile()
    out["full_analysis_s"] = round(time.perf_counter() - w, 3)
    out["full_analysis_cpu_s"] = round(time.process_time() - c, 3)
    out["first_checks"] = len(first)
    edits = []
    for name, make in EDITS:
        events = make(model.objects)
        full_before = model.reconciles
        w, c = time.perf_counter(), time.process_time()
        for etype, raw in events:
            model.event(etype, raw)
        checks = model.reconcile()
        # the young collection of what the edit allocated, in its own window: it runs when the
        # collector is turned back on only if the edit allocated more than it freed, and would
        # otherwise land in a later edit's window (inplace.apply.apply_change keeps it off meanwhile)
        gc.collect(0)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        edits.append({"edit": name, "ms": round(1000 * wall, 2), "cpu_ms": round(1000 * cpu, 2),
                      "in_place": model.reconciles == full_before, "checks": len(checks), "_refs": checks})
    out["edits"] = edits
    out["peak_rss_mb"] = _peak_mb()
    if verify:
        out["verified"], out["verify_peak_rss_mb"] = verified_apart(model)
    # What a running controller does next: its first complete status, whose echoes it then holds,
    # and (after that, or after a restart) full analyses of objects that carry status.
    checks = sorted({*first, *(r for e in edits for r in e.pop("_refs"))}, key=lambda r: r.sort_key())
    w, c = time.perf_counter(), time.process_time()
    out["status_writes"] = write_status(model, checks)
    out["status_write_s"] = round(time.perf_counter() - w, 3)
    out["status_write_cpu_s"] = round(time.process_time() - c, 3)
    out["peak_rss_after_status_mb"] = _peak_mb()
    model.stale = True
    w, c = time.perf_counter(), time.process_time()
    second = model.reconcile()
    out["full_analysis_with_status_s"] = round(time.perf_counter() - w, 3)
    out["full_analysis_with_status_cpu_s"] = round(time.process_time() - c, 3)
    out["with_status_checks"] = len(second)
    out["peak_rss_with_status_mb"] = _peak_mb()
    if verify:
        out["verified_with_status"], peak = verified_apart(model)
        out["verify_peak_rss_mb"] = max(out["verify_peak_rss_mb"], peak)
    return out


def _peak_mb() -> float:
    """The peak RSS of this process alone (MB): the model's, as the `--verify` checks run in children."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def verified_apart(model: Any) -> tuple[bool, float]:
    """`_same_as_full` in a forked child, so that its full analysis and its encoding of every item
    (7.5 GB at 20k routes) never count in the model's peak RSS; and the peak RSS of the children
    that checked so far (MB)."""
    pid = os.fork()
    if pid == 0:  # the child: a copy of the model, its own memory
        code = 2
        try:
            code = 0 if _same_as_full(model) else 1
        finally:
            os._exit(code)  # noqa: SLF001 - no cleanup of the parent's state in the child
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise RuntimeError(f"the --verify check failed in its child process (exit {code})")
    return code == 0, round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)


def write_status(model: Any, refs: list[Any]) -> int:
    """Write what each object should carry as the controller does, and feed each write back as the
    watch echo brings it: a MODIFIED event of a decoded copy with a new resourceVersion. Returns the
    number of objects written."""
    import orjson

    from gwpolicy.engine.status import ANNOTATION

    written = 0
    for ref in refs:
        want = model.desired(ref)
        raw = model.current(ref)
        if want is None or raw is None:
            continue
        status, annotations = want
        if status == (raw.get("status") or {}) and \
                annotations.get(ANNOTATION) == (raw["metadata"].get("annotations") or {}).get(ANNOTATION):
            continue
        echo = orjson.loads(orjson.dumps(raw))
        echo["status"] = orjson.loads(orjson.dumps(status))
        ann = {k: v for k, v in (echo["metadata"].get("annotations") or {}).items() if k != ANNOTATION}
        if annotations.get(ANNOTATION) is not None:
            ann[ANNOTATION] = annotations[ANNOTATION]
        echo["metadata"]["annotations"] = ann
        echo["metadata"]["resourceVersion"] = str(int(echo["metadata"].get("resourceVersion") or 0) + 1000000)
        model.event("MODIFIED", echo)
        written += 1
    model.reconcile()  # the echoes change no analysis: only comparisons
    return written


def _same_as_full(model: Any) -> bool:
    """The analysis after all the edits equals a full analysis of the same objects (as sets: the
    order of a target's paths may differ after an in-place change)."""
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.files.output import effective_list, encode, status_list

    a = model.analysis
    full = analyse(list(model.objects.values()), controller=model.controller, now=a.now)

    def canonical(x: Any) -> tuple[list[bytes], list[bytes]]:
        return (sorted(encode(i, "json") for i in effective_list(x)["items"]),
                sorted(encode(i, "json") for i in status_list(x)["items"]))

    return canonical(a) == canonical(full)


def measure(path: str, verify: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "gwpolicy.bench.controller_inproc", "--child", path, result] + (["--verify"] if verify else [])
        subprocess.run(cmd, check=True)
        with open(result, encoding="utf-8") as fh:
            out = json.load(fh)
    out["cluster"] = path
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [compiled.describe()]
    for r in rows:
        lines.append(f"{r['routes']:,} routes, {r['objects']:,} objects ({r['cluster']}): full analysis "
                     f"{r['full_analysis_s']:.2f} s wall, {r['full_analysis_cpu_s']:.2f} s CPU; peak RSS {r['peak_rss_mb']:,.0f} MB"
                     + (f"; equal to a full analysis after the edits: {r['verified']} (checked in a child process "
                        f"whose peak RSS, {r['verify_peak_rss_mb']:,.0f} MB, is not in these figures)" if "verified" in r else ""))
        lines.append(f"with status (after the first complete status: {r['status_writes']:,} objects written in "
                     f"{r['status_write_cpu_s']:.2f} s CPU, their echoes fed back): full analysis "
                     f"{r['full_analysis_with_status_s']:.2f} s wall, {r['full_analysis_with_status_cpu_s']:.2f} s CPU, "
                     f"{r['with_status_checks']:,} objects to check; peak RSS {r['peak_rss_with_status_mb']:,.0f} MB"
                     + (f"; equal to a full analysis: {r['verified_with_status']}" if "verified_with_status" in r else ""))
        lines.append("| edit | ms | CPU ms | in place | objects to check |")
        lines.append("|---|---:|---:|---|---:|")
        for e in r["edits"]:
            lines.append(f"| {e['edit']} | {e['ms']:.1f} | {e['cpu_ms']:.1f} | {'yes' if e['in_place'] else 'NO'} | {e['checks']:,} |")
        lines.append("")
    return "\n".join(lines)


def _positive(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return n


def main(argv: list[str]) -> int:
    from gwpolicy.bench.generate import route_counts, write_yaml
    from gwpolicy.kube.args import HelpFormatter, Parser

    if argv[:1] == ["--child"]:
        verify = "--verify" in argv
        rest = [a for a in argv[1:] if a != "--verify"]
        out = child(rest[0], verify)
        with open(rest[1], "w", encoding="utf-8") as fh:
            json.dump(out, fh)
        return 0
    parser = Parser(prog="gwpolicy bench controller-inproc", formatter_class=HelpFormatter,
                    description="The controller's analysis in process: full analysis, peak RSS, and each kind of edit.",
                    epilog="examples:\n  gwpolicy bench controller-inproc --routes 1000\n"
                           "  gwpolicy bench controller-inproc --cluster /work/benchdata/cluster-20000.yaml --json out.json\n"
                           "  gwpolicy bench controller-inproc --routes 4000 --instructions   # callgrind's counts, repeatable\n"
                           "  gwpolicy bench controller-inproc --routes 4000 --opcodes 4      # where edit 4's work goes\n")
    parser.add_argument("--routes", type=route_counts, default=[], help="route counts to generate, comma-separated")
    parser.add_argument("--cluster", action="append", default=[], help="a generated cluster file (repeatable)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "gwpolicy-bench"))
    parser.add_argument("--verify", action="store_true", help="compare the analysis after the edits with a full analysis")
    parser.add_argument("--json", help="also write the figures to this file")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--instructions", action="store_true",
                     help="count instructions (valgrind's callgrind, Ir) instead of time: the full analysis and each "
                          "edit, from its first event to the end of its reconcile; the counts repeat from run to run")
    how.add_argument("--opcodes", metavar="EDIT",
                     help="count the Python bytecodes one edit executes (its number, from 0, or a piece of its name) "
                          "and print the functions and lines that execute the most")
    parser.add_argument("--top", type=_positive, default=25, help="with --opcodes: how many functions and lines")
    parser.add_argument("--keep-dumps", metavar="DIR",
                        help="with --instructions: leave callgrind's dumps (one per window) in DIR for callgrind_annotate")
    args = parser.parse_args(argv)
    if args.verify and (args.instructions or args.opcodes is not None):
        parser.error("--verify goes with the timed run only (not with --instructions or --opcodes)")
    if args.keep_dumps and not args.instructions:
        parser.error("--keep-dumps goes with --instructions")
    if args.opcodes is not None:
        from gwpolicy.bench.instructions import pick_edit

        try:
            wanted = pick_edit([name for name, _ in EDITS], args.opcodes)
        except ValueError as e:
            parser.error(str(e))
    if args.instructions:
        from gwpolicy.bench.instructions import Unavailable, require_valgrind

        try:
            require_valgrind()
        except Unavailable as e:
            print(f"gwpolicy bench controller-inproc: error: {e}", file=sys.stderr)
            return 2
    paths = list(args.cluster)
    if not paths and not args.routes:
        parser.error("give --routes or --cluster")
    for n in args.routes:
        os.makedirs(args.workdir, exist_ok=True)
        path = os.path.join(args.workdir, f"cluster-{n}.yaml")
        if not os.path.exists(path):
            write_yaml(n, path)
        paths.append(path)
    for p in paths:
        if not os.path.exists(p):
            parser.error(f"--cluster {p}: no such file")
    if args.opcodes is not None:
        from gwpolicy.bench import instructions

        rows = []
        for p in paths:
            print(f"counting the bytecodes of edit {wanted} on {p} ...", file=sys.stderr)
            rows.append(instructions.opcodes(p, wanted, args.top))
            print(instructions.opcodes_table(rows[-1]))
    elif args.instructions:
        from gwpolicy.bench import instructions

        rows = []
        for i, p in enumerate(paths):
            print(f"counting instructions on {p} (under valgrind: minutes at 20k routes) ...", file=sys.stderr)
            keep = None if not args.keep_dumps else args.keep_dumps if len(paths) == 1 else os.path.join(args.keep_dumps, str(i))
            try:
                rows.append(instructions.measure(p, keep))
            except RuntimeError as e:
                print(f"gwpolicy bench controller-inproc: error: {p}: {e}", file=sys.stderr)
                return 1
        print(instructions.table(rows))
    else:
        rows = []
        for p in paths:
            print(f"measuring {p} ...", file=sys.stderr)
            rows.append(measure(p, args.verify))
        print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
