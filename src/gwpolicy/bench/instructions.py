"""Instruction counts of the in-process controller benchmark: `gwpolicy bench controller-inproc
--instructions` re-runs the benchmark's sequence under valgrind's callgrind, counting nothing until
an edit's first event and stopping at the end of its `reconcile`, so that each edit's count (`Ir`,
instructions executed) repeats from run to run whatever the machine's load. `--opcodes EDIT` counts,
in Python, the bytecodes each function and line executes during one edit: where the instructions go.

How the windows are opened and closed: callgrind starts with instrumentation off
(`--instr-atstart=no`); around each window the child sends its own callgrind, through `vgdb`, the
monitor commands `callgrind_control -z`, `-i on`, then (after the work) `-i off` and `-d LABEL` send:
zero, instrumentation on, instrumentation off, dump. The toggles' own cost (the return from the call
that turns counting on, the start of the one that turns it off) is measured as an empty window and
reported beside the counts. String hashing is fixed (PYTHONHASHSEED=0) so that set and dict
orders, hence the counts, repeat.
"""

from __future__ import annotations

import collections
import gc
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable

from gwpolicy import compiled

#: what to install when valgrind is missing (Debian's package holds callgrind, vgdb and callgrind_control)
DEBIAN_PACKAGE = "valgrind"


class Unavailable(Exception):
    """valgrind or its vgdb cannot be run here: the message says what to install."""


def require_valgrind() -> None:
    missing = [tool for tool in ("valgrind", "vgdb") if shutil.which(tool) is None]
    if missing:
        raise Unavailable(f"{' and '.join(missing)} not found on PATH: instruction counts need valgrind's "
                          f"callgrind (Debian: apt-get install {DEBIAN_PACKAGE})")


_VGDB_TIMEOUT_S = 120


def _vgdb_hangs(signum: int, frame: Any) -> None:
    raise RuntimeError(f"vgdb did not reach this process in {_VGDB_TIMEOUT_S} s: it needs to ptrace it "
                       "(a container without CAP_SYS_PTRACE, or kernel.yama.ptrace_scope 3, forbids that)")


def _control(log: int, env: dict[str, str], *commands: str) -> None:
    """Send callgrind monitor commands (`zero`, `instrumentation on`, `dump LABEL`...) to this
    process, as `callgrind_control -z/-i on/-d` does, through `vgdb` (which callgrind_control runs,
    after a search for the process that is not needed here): several commands in one call, spawned
    and waited for with as little Python as possible on either side, since what runs between
    `instrumentation on` and `instrumentation off` is counted (hence the open file `log` for its
    output and the plain dict `env`, which posix_spawnp reads in C). Quiet unless it fails."""
    argv = ["vgdb", f"--pid={os.getpid()}"]
    for i, command in enumerate(commands):
        argv += (["-c"] if i else []) + command.split()
    pid = os.posix_spawnp("vgdb", argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)])
    signal.alarm(_VGDB_TIMEOUT_S)  # vgdb reaches a process blocked in a system call through ptrace: never hang
    _, status = os.waitpid(pid, 0)
    signal.alarm(0)
    if os.waitstatus_to_exitcode(status) != 0:
        os.lseek(log, 0, os.SEEK_SET)
        said = os.read(log, 1 << 16).decode(errors="replace").strip()
        raise RuntimeError(f"vgdb {' -c '.join(commands)} failed: {said[-2000:] or 'no message'}")


class Windows:
    """The counting windows of one process under callgrind: each `count(label, work)` returns the
    instructions `work()` executed, read from the dump callgrind writes at its end."""

    def __init__(self, outdir: str, collect: bool = True) -> None:
        self.outdir = outdir
        self.collect = collect
        self.dumps = 0
        self.log = os.open(os.path.join(outdir, "vgdb.log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.env = dict(os.environ)
        signal.signal(signal.SIGALRM, _vgdb_hangs)

    def count(self, label: str, work: Callable[[], Any]) -> tuple[int, Any]:
        if self.collect:
            gc.collect()  # what earlier work left to the collector is collected outside the window
        _control(self.log, self.env, "zero", "instrumentation on")
        result = work()
        _control(self.log, self.env, "instrumentation off", f"dump {label}")
        self.dumps += 1
        return dump_total(self._dump_file(), label), result

    def _dump_file(self) -> str:
        path = os.path.join(self.outdir, f"callgrind.out.{os.getpid()}.{self.dumps}")
        if not os.path.exists(path):
            found = sorted(glob.glob(os.path.join(self.outdir, "callgrind.out.*")))
            raise RuntimeError(f"callgrind wrote no dump {path} (found: {', '.join(found) or 'none'})")
        return path


def dump_total(path: str, label: str) -> int:
    """The instructions (`Ir`) a callgrind dump file counts (its `totals:` line), after checking that
    the dump is the one `label`'s window asked for."""
    totals = trigger = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("totals:"):
                totals = int(line.split()[1])
            elif line.startswith("desc: Trigger:"):
                trigger = line.split(":", 2)[2].strip()
    if totals is None:
        raise RuntimeError(f"{path}: no totals: line (not a callgrind dump?)")
    if trigger != f"dump {label}":
        raise RuntimeError(f"{path}: the dump of {trigger!r}, where {label!r}'s was expected")
    return totals


def child(path: str, outdir: str) -> dict[str, Any]:
    """Run under callgrind: feed the model, count the full analysis and each edit."""
    from gwpolicy.bench.edits import EDITS, fed_model

    windows = Windows(outdir)
    out: dict[str, Any] = {}
    toggles, _ = windows.count("empty", lambda: None)
    model, out["objects"], out["routes"] = fed_model(path)
    out["toggle_ir"] = toggles
    out["full_analysis_ir"], first = windows.count("full-analysis", model.reconcile)
    out["first_checks"] = len(first)
    edits = []
    for i, (name, make) in enumerate(EDITS):
        events = make(model.objects)
        full_before = model.reconciles

        def edit() -> Any:
            for etype, raw in events:
                model.event(etype, raw)
            return model.reconcile()

        ir, checks = windows.count(f"edit-{i}", edit)
        edits.append({"edit": name, "ir": ir, "in_place": model.reconciles == full_before, "checks": len(checks)})
    out["edits"] = edits
    return out


def engine_child(path: str, outdir: str) -> dict[str, Any]:
    """Run under callgrind: what `gwpolicy effective -f FILE -o json` and `gwpolicy status` do,
    phase by phase (bench/child.py's `phases`), each phase a window; the collector off, as the CLI has it."""
    gc.disable()
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.files.load import load_paths
    from gwpolicy.files.output import status_list, write_effective

    windows = Windows(outdir, collect=False)
    out: dict[str, Any] = {}
    out["toggle_ir"], _ = windows.count("empty", lambda: None)
    out["load_ir"], loaded = windows.count("load", lambda: load_paths([path]))
    out["objects"] = len(loaded.objects)
    out["routes"] = sum(1 for o in loaded.objects if o.get("kind") == "HTTPRoute")
    out["analyse_ir"], a = windows.count("analyse", lambda: analyse(loaded.objects, loaded.origins, now="2026-01-01T00:00:00Z"))
    with open(os.devnull, "wb") as sink:
        out["output_ir"], _ = windows.count("output", lambda: write_effective(a, sink, "json"))
    out["status_ir"], items = windows.count("status", lambda: status_list(a)["items"])
    out["items"], out["status_items"] = len(a.effective), len(items)
    return out


def measure(path: str, keep: str | None = None, mode: str = "--child") -> dict[str, Any]:
    """The counts of one cluster file, from a child process under callgrind (its dumps are removed
    unless `keep` names a directory to leave them in, for callgrind_annotate): the controller's
    edits (`--child`) or the engine's phases (`--engine-child`)."""
    require_valgrind()
    # The child runs in a directory of its own whose name is as long whatever `keep` is, with the same
    # arguments: their lengths move its memory's layout, hence the order of sets of objects hashed by
    # address (0.1% of a small edit's count). `-P` keeps that directory off its sys.path, where each
    # import inside a window would list the dumps so far.
    rundir = tempfile.mkdtemp(prefix="gwpolicy-callgrind-")
    result = os.path.join(rundir, "result.json")
    log = os.path.join(rundir, "valgrind.log")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--log-file=valgrind.log",
           "--callgrind-out-file=callgrind.out.%p",
           sys.executable, "-P", "-m", "gwpolicy.bench.instructions", mode, os.path.abspath(path), "result.json", "."]
    try:
        done = subprocess.run(cmd, cwd=rundir, env={**os.environ, "PYTHONHASHSEED": "0"})
        if done.returncode != 0 or not os.path.exists(result):
            tail = ""
            if os.path.exists(log):
                with open(log, encoding="utf-8", errors="replace") as fh:
                    tail = "".join(fh.readlines()[-15:])
            raise RuntimeError(f"the run under callgrind failed (exit {done.returncode}); the end of its log:\n{tail}")
        with open(result, encoding="utf-8") as fh:
            out: dict[str, Any] = json.load(fh)
        if keep:
            os.makedirs(keep, exist_ok=True)
            for name in os.listdir(rundir):
                if name.startswith("callgrind.out.") or name == "valgrind.log":
                    shutil.move(os.path.join(rundir, name), os.path.join(keep, name))
            out["dumps"] = keep
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    out["cluster"] = path
    return out


def millions(ir: int) -> str:
    return f"{ir / 1e6:,.2f}M"


def table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['routes']:,} routes, {r['objects']:,} objects ({r['cluster']}): full analysis "
                     f"{millions(r['full_analysis_ir'])} instructions (callgrind Ir; each count includes the "
                     f"toggles' own {millions(r['toggle_ir'])})")
        lines.append("| edit | instructions (Ir) | in place | objects to check |")
        lines.append("|---|---:|---|---:|")
        for e in r["edits"]:
            lines.append(f"| {e['edit']} | {millions(e['ir'])} | {'yes' if e['in_place'] else 'NO'} | {e['checks']:,} |")
        lines.append("")
    return "\n".join(lines)


def engine_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| routes | objects | load | analyse | output (-o json) | status | effective (load + analyse + output) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['routes']:,} | {r['objects']:,} | {millions(r['load_ir'])} | {millions(r['analyse_ir'])} | "
                     f"{millions(r['output_ir'])} | {millions(r['status_ir'])} | "
                     f"{millions(r['load_ir'] + r['analyse_ir'] + r['output_ir'])} |")
    lines.append("(instructions, callgrind Ir, of each phase of `gwpolicy effective -f FILE -o json` and `gwpolicy status`; "
                 f"each includes the toggles' own {millions(rows[0]['toggle_ir']) if rows else '0'})")
    return "\n".join(lines) + "\n"


# --- where the instructions go: bytecodes per function and line, for one edit -----------------------

def pick_edit(names: list[str], wanted: str) -> int:
    """The index of the edit `wanted` names: its number in the sequence (0-based), or a piece of its
    name that only one edit holds."""
    if wanted.isdigit():
        if int(wanted) < len(names):
            return int(wanted)
        raise ValueError(f"--opcodes {wanted}: there are {len(names)} edits, numbered 0 to {len(names) - 1}")
    hits = [i for i, n in enumerate(names) if wanted.lower() in n.lower()]
    if len(hits) == 1:
        return hits[0]
    listing = "\n".join(f"  {i}: {n}" for i, n in enumerate(names))
    if not hits:
        raise ValueError(f"--opcodes {wanted!r}: no edit's name holds it; the edits:\n{listing}")
    raise ValueError(f"--opcodes {wanted!r}: {len(hits)} edits' names hold it ({', '.join(str(i) for i in hits)}); "
                     f"give its number or more of its name; the edits:\n{listing}")


def _short(filename: str) -> str:
    """A code object's file, from the package's root when it is gwpolicy's."""
    marker = os.sep + "gwpolicy" + os.sep
    return "gwpolicy/" + filename.rsplit(marker, 1)[1] if marker in filename else os.path.basename(filename)


def count_opcodes(work: Callable[[], Any]) -> tuple[collections.Counter, collections.Counter, Any]:
    """Bytecodes executed by `work()`, per function (file, name, first line) and per line (file,
    line): every frame traced with `f_trace_opcodes`. Slow (tens of times), but exact and repeatable."""
    per_function: collections.Counter = collections.Counter()
    per_line: collections.Counter = collections.Counter()

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            per_function[(code.co_filename, code.co_name, code.co_firstlineno)] += 1
            per_line[(code.co_filename, frame.f_lineno)] += 1
        return local

    def start(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    sys.settrace(start)
    try:
        result = work()
    finally:
        sys.settrace(None)
    return per_function, per_line, result


def opcodes_child(path: str, wanted: int, top: int) -> dict[str, Any]:
    """Feed the model, run the edits before `wanted` untraced, and count `wanted`'s bytecodes."""
    from gwpolicy.bench.edits import EDITS, fed_model

    model, objects, routes = fed_model(path)
    model.reconcile()
    for i, (name, make) in enumerate(EDITS[:wanted + 1]):
        events = make(model.objects)

        def edit() -> Any:
            for etype, raw in events:
                model.event(etype, raw)
            return model.reconcile()

        if i < wanted:
            edit()
            continue
        gc.collect()
        per_function, per_line, _ = count_opcodes(edit)
    total = sum(per_function.values())
    return {"cluster": path, "objects": objects, "routes": routes, "edit": EDITS[wanted][0], "opcodes": total,
            "functions": [{"file": _short(f), "function": fn, "line": ln, "opcodes": n}
                          for (f, fn, ln), n in per_function.most_common(top)],
            "lines": [{"file": _short(f), "line": ln, "opcodes": n} for (f, ln), n in per_line.most_common(top)]}


def opcodes(path: str, wanted: int, top: int) -> dict[str, Any]:
    """`opcodes_child` in a fresh process with string hashing fixed, so that the counts repeat; on the
    interpreted core (a compiled module runs no bytecodes: its work would not be counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-P", "-m", "gwpolicy.bench.instructions", "--opcodes-child", path, str(wanted), str(top), result]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONHASHSEED": "0", compiled.PURE_ENV: "1"})
        with open(result, encoding="utf-8") as fh:
            out: dict[str, Any] = json.load(fh)
    return out


def opcodes_table(r: dict[str, Any]) -> str:
    total = r["opcodes"]
    lines = [f"{r['routes']:,} routes ({r['cluster']}), edit {r['edit']!r}: {total:,} bytecodes executed "
             f"(Python's own count, from the edit's first event to the end of its reconcile)",
             "| function | file:line | bytecodes | share |", "|---|---|---:|---:|"]
    for f in r["functions"]:
        lines.append(f"| {f['function']} | {f['file']}:{f['line']} | {f['opcodes']:,} | {100 * f['opcodes'] / total:.1f}% |")
    lines += ["", "| line | bytecodes | share |", "|---|---:|---:|"]
    for ln in r["lines"]:
        lines.append(f"| {ln['file']}:{ln['line']} | {ln['opcodes']:,} | {100 * ln['opcodes'] / total:.1f}% |")
    return "\n".join(lines) + "\n"


def _main(argv: list[str]) -> int:
    if argv[:1] in (["--child"], ["--engine-child"]):
        try:
            out = (child if argv[0] == "--child" else engine_child)(argv[1], argv[3])
        except RuntimeError as e:  # vgdb or callgrind failed: the parent says so, with valgrind's log
            print(f"error: {e}", file=sys.stderr)
            return 1
        with open(argv[2], "w", encoding="utf-8") as fh:
            json.dump(out, fh)
        return 0
    if argv[:1] == ["--opcodes-child"]:
        out = opcodes_child(argv[1], int(argv[2]), int(argv[3]))
        with open(argv[4], "w", encoding="utf-8") as fh:
            json.dump(out, fh)
        return 0
    print("usage: gwpolicy bench controller-inproc --instructions | --opcodes EDIT (this module's "
          "--child modes are the benchmark's own)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
