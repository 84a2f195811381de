"""`gwpolicy bench`: generate synthetic clusters and measure gwpolicy on them (docs/performance.md).

Every figure comes from a fresh process; each measurement is repeated and the fastest run kept,
since a shared 2-core machine only ever adds time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from gwpolicy import compiled
from gwpolicy.bench.generate import at_least, route_counts, write_yaml
from gwpolicy.kube.args import HelpFormatter, Parser, program_name


def _child(mode: str, path: str) -> dict[str, float]:
    """One measurement in a fresh process; `process_cpu` is the CPU time (user and system) of the
    whole process, start to exit, which a shared machine inflates far less than wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.NamedTemporaryFile(suffix=".json") as res:
        subprocess.run([sys.executable, "-m", "gwpolicy.bench.child", mode, path, res.name], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(res.name, encoding="utf-8") as fh:
            out = json.load(fh)
    out["process_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def _end_to_end(path: str) -> tuple[float, float, float]:
    """Wall time and CPU time (process start to exit) and peak RSS (MB) of
    `gwpolicy effective -f FILE -o json > /dev/null`, run as the command line runs it."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gwpolicy.cli.main", "effective", "-f", path, "-o", "json"],
                            stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(routes: int, workdir: str, repeat: int) -> dict[str, Any]:
    path = os.path.join(workdir, f"cluster-{routes}.yaml")
    if not os.path.exists(path):
        write_yaml(routes, path)
    size_mb = os.path.getsize(path) / 1e6
    parses = [_child("parse", path) for _ in range(repeat)]
    fastests = [_child("parse_fastest", path) for _ in range(repeat)]
    parse = min(parses, key=lambda r: r["parse"])
    fastest = min(fastests, key=lambda r: r["parse"])
    phases = min((_child("phases", path) for _ in range(repeat)), key=lambda r: r["wall"])
    e2e = [_end_to_end(path) for _ in range(repeat)]
    wall = min(w for w, _, _ in e2e)
    cpu = min(c for _, c, _ in e2e)
    rss = max(r for _, _, r in e2e)
    parse_cpu = min(r["parse_cpu"] for r in parses)
    fastest_cpu = min(r["parse_cpu"] for r in fastests)
    return {"routes": routes, "objects": int(parse["objects"]), "yaml_mb": round(size_mb, 1),
            "parse_s": parse["parse"], "phases": phases, "effective_s": wall, "effective_rss_mb": rss,
            "ratio_to_parse": wall / parse["parse"], "fastest_parse_s": fastest["parse"],
            "ratio_to_fastest": wall / fastest["parse"],
            "parse_cpu_s": parse_cpu, "fastest_parse_cpu_s": fastest_cpu, "effective_cpu_s": cpu,
            "cpu_ratio_to_parse": cpu / parse_cpu, "cpu_ratio_to_fastest": cpu / fastest_cpu,
            "load_average": os.getloadavg()}


def exponents(rows: list[dict[str, Any]], key: str) -> list[str]:
    out = []
    for a, b in zip(rows, rows[1:]):
        ya, yb = a[key], b[key]
        out.append(f"{a['routes']}->{b['routes']}: {math.log(yb / ya) / math.log(b['routes'] / a['routes']):.2f}")
    return out


def report(rows: list[dict[str, Any]], controller: list[dict[str, Any]] | None = None) -> str:
    lines = [f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"{platform.platform()}; {compiled.describe()}", ""]
    if rows:
        lines += _engine_table(rows)
    if controller:
        if rows:
            lines.append("")
        lines += _controller_table(controller)
    return "\n".join(lines) + "\n"


def _table(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    return [" | ".join(h.rjust(w) for h, w in zip(head, widths)), "-|-".join("-" * w for w in widths),
            *(" | ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body)]


def _controller_table(rows: list[dict[str, Any]]) -> list[str]:
    """Time to the first complete status, then per edit: reprocessing, settling and the writes it caused;
    the controller's and the sandbox's own processes' figures; and a restart on objects with status."""
    def edit(e: dict[str, Any]) -> str:
        cpu = f" ({e['reprocess_cpu_ms']} CPU)" if "reprocess_cpu_ms" in e else ""
        return f"{e['reprocess_ms']} ms{cpu} / {e['settle_s'] * 1000:.0f} ms / {e['writes']}"

    head = ["routes", "first complete status s", "writes", "full analysis s (CPU)", "policy edit", "route edit",
            "namespace-wide policy edit", "controller peak RSS MB", "controller CPU s", "sandbox peak RSS MB",
            "sandbox CPU s"]
    body = [[str(c["routes"]), f"{c['first_status_s']:.1f}", str(c["initial_writes"]),
             f"{c['full_analysis_s']:.2f} ({c['full_analysis_cpu_s']:.2f})",
             edit(c["policy_edit"]), edit(c["route_edit"]), edit(c["namespace_policy_edit"]),
             str(c["controller"]["peak_rss_mb"]), f"{c['controller']['cpu_s']:.1f}",
             f"{c['sandbox'].get('peak_rss_mb', 0):.0f}", f"{c['sandbox'].get('cpu_s', 0):.1f}"] for c in rows]
    lines = ["controller (`gwpolicy controller` and `gwpolicy sandbox`, each its own process, on loopback); "
             "edits as reprocess / settle / API writes:"]
    lines += _table(head, body)
    restarts = [c for c in rows if c.get("restart")]
    if restarts:
        lines.append("")
        lines.append("a second controller process started on the cluster with the first one's status:")
        lines += _table(["routes", "settled s", "writes", "full analysis s (CPU)", "peak RSS MB", "CPU s"],
                        [[str(c["routes"]), f"{c['restart']['settled_s']:.1f}", str(c["restart"]["writes"]),
                          f"{c['restart']['full_analysis_s']:.2f} ({c['restart']['full_analysis_cpu_s']:.2f})",
                          str(c["restart"]["peak_rss_mb"]), f"{c['restart']['cpu_s']:.1f}"] for c in restarts])
    for c in rows:
        if c.get("breadcrumb_qps"):
            lines.append(f"{c['routes']} routes at --breadcrumb-qps {c['breadcrumb_qps']:g}: {c['breadcrumb_calls']} breadcrumb "
                         f"calls need {c['breadcrumb_budget_s']:.1f} s at that rate; first complete status "
                         f"{c['first_status_s']:.1f} s ({c['first_status_s'] / max(c['breadcrumb_budget_s'], 1e-9):.2f}x); "
                         f"a route edit 5 s in waited {c['route_edit_during_backlog_s']:.2f} s")
    if len(rows) > 1:
        lines.append("growth exponent of the full analysis: " + ", ".join(exponents(rows, "full_analysis_s")))
        lines.append("growth exponent of the time to first complete status: " + ", ".join(exponents(rows, "first_status_s")))
    paths = {e["path"] for c in rows for e in (c["policy_edit"], c["route_edit"], c["namespace_policy_edit"])}
    lines.append("every edit handled " + (f"in place ({', '.join(sorted(paths))})" if paths == {"incremental"}
                                          else f"by: {', '.join(sorted(paths))}"))
    lines.append("load average at start / end: " + "; ".join(
        f"{c['routes']}: {' '.join(map(str, c['load_average_start']))} / {' '.join(map(str, c['load_average_end']))}"
        for c in rows))
    lines.append("first complete status: from the controller's start (its process start included) until it is "
                 "idle; full analysis and reprocess: wall time, the controller's CPU time in brackets; RSS and "
                 "CPU: each process's own")
    return lines


def _engine_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    head = ["routes", "objects", "YAML MB", "parse s", "load", "index", "topology", "attach", "merge", "output",
            "status", "items", "effective e2e s", "x parse", "fastest parse s", "x fastest", "peak RSS MB"]
    body = []
    for r in rows:
        p = r["phases"]
        body.append([str(r["routes"]), str(r["objects"]), f"{r['yaml_mb']:.1f}", f"{r['parse_s']:.2f}",
                     f"{p['load']:.2f}", f"{p['index']:.2f}", f"{p['topology']:.2f}", f"{p['attachment']:.2f}",
                     f"{p['merge']:.2f}", f"{p['output']:.2f}", f"{p['status']:.2f}", str(int(p["items"])),
                     f"{r['effective_s']:.2f}", f"{r['ratio_to_parse']:.2f}", f"{r['fastest_parse_s']:.2f}",
                     f"{r['ratio_to_fastest']:.2f}", f"{r['effective_rss_mb']:.0f}"])
    lines += _table(head, body)
    lines.append("")
    lines.append("the same in CPU time (user + system; a shared machine inflates it far less than wall time):")
    lines += _table(["routes", "parse CPU s", "fastest parse CPU s", "effective e2e CPU s", "x parse", "x fastest",
                     "load average"],
                    [[str(r["routes"]), f"{r['parse_cpu_s']:.2f}", f"{r['fastest_parse_cpu_s']:.2f}",
                      f"{r['effective_cpu_s']:.2f}", f"{r['cpu_ratio_to_parse']:.2f}", f"{r['cpu_ratio_to_fastest']:.2f}",
                      " ".join(f"{x:.1f}" for x in r["load_average"])] for r in rows])
    if len(rows) > 1:
        lines.append("")
        lines.append("growth exponent of effective e2e time (1.0 = linear): " + ", ".join(exponents(rows, "effective_s")))
        merge_rows = [dict(r, merge=r["phases"]["merge"] + r["phases"]["topology"]) for r in rows]
        lines.append("growth exponent of topology+merge: " + ", ".join(exponents(merge_rows, "merge")))
    lines.append("parse s: PyYAML's C loader alone; fastest parse s: rapidyaml's parse, its JSON and orjson's loads "
                 "(the fastest way measured to read YAML into Python objects); x: effective e2e over each; "
                 "e2e is the whole process (start, imports, exit), a parse only the parse; each figure the "
                 "fastest of --repeat runs; load average when the size's runs ended")
    return lines


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except OSError as exc:  # an output file or work directory that cannot be written
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _instructions(args: argparse.Namespace) -> int:
    """`bench run --instructions`: each size's phases counted under callgrind, one run each."""
    from gwpolicy.bench import instructions

    if args.controller:
        print("Error: --instructions counts the engine; the controller's counts: "
              "gwpolicy bench controller-inproc --instructions", file=sys.stderr)
        return 2
    try:
        instructions.require_valgrind()
    except instructions.Unavailable as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    rows = []
    for size in args.sizes:
        path = os.path.join(args.workdir, f"cluster-{size}.yaml")
        if not os.path.exists(path):
            write_yaml(size, path)
        print(f"counting the instructions of {size} routes (under valgrind: minutes at 20k routes)...", file=sys.stderr)
        try:
            rows.append(instructions.measure(path, mode="--engine-child"))
        except RuntimeError as e:
            print(f"Error: {path}: {e}", file=sys.stderr)
            return 1
    print(instructions.engine_table(rows), end="")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"engine_instructions": rows}, fh, indent=2)
    return 0


def _main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=f"{program_name()} bench", formatter_class=HelpFormatter, epilog="""examples:
  gwpolicy bench generate --routes 1000 -o /tmp/1k.yaml     # a synthetic cluster
  gwpolicy bench run --sizes 1000,10000                      # the engine, against PyYAML's parse
  gwpolicy bench run --sizes '' --controller --controller-routes 1000
  gwpolicy bench webhook --routes 1000,20000                 # admission latency
  gwpolicy bench gateway --sizes 1000,10000                  # the NGINX data plane
  gwpolicy bench regex --refused                             # hostile requests to regex routes
  gwpolicy bench dataplane --quick                           # a request's cost in NGINX, against hand-written
  gwpolicy bench controller-inproc --routes 1000             # the controller's analysis and edits, in process
  gwpolicy bench replicas --routes 1000                      # rps through 1 and 3 gateway replicas, edit to all
  gwpolicy bench tracing                                     # tracing's cost in NGINX, the span relay's CPU
  gwpolicy bench run --sizes 4000 --instructions             # instruction counts (valgrind), repeatable
  gwpolicy bench controller-inproc --routes 4000 --instructions
""")
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write a synthetic cluster as YAML")
    g.add_argument("--routes", type=at_least(0), required=True)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("-o", "--output", default="-")
    r = sub.add_parser("run", help="measure the engine (and the controller) on synthetic clusters")
    r.add_argument("--sizes", type=route_counts, default="1000,10000,50000", help="route counts, comma-separated (empty: no engine runs)")
    r.add_argument("--repeat", type=at_least(1), default=2)
    r.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "gwpolicy-bench"))
    r.add_argument("--controller", action="store_true", help="also measure `gwpolicy controller` against "
                   "`gwpolicy sandbox`, each in its own process")
    r.add_argument("--controller-routes", type=route_counts, default="1000,10000,50000", help="route counts for the controller")
    r.add_argument("--controller-breadcrumb-qps", type=float, default=0.0,
                   help="the controller's --breadcrumb-qps (default 0: unpaced, to measure the controller itself)")
    r.add_argument("--no-controller-restart", action="store_true",
                   help="skip the second controller process on the cluster with status")
    r.add_argument("--json", help="also write the figures to this file")
    r.add_argument("--instructions", action="store_true",
                   help="count each size's instructions (valgrind's callgrind, Ir: load, analyse, output, status) "
                        "instead of timing them; the counts repeat from run to run")
    w = sub.add_parser("webhook", help="measure the admission webhook's latency on synthetic clusters")
    w.add_argument("--routes", type=route_counts, default="1000,20000", help="route counts, comma-separated")
    w.add_argument("--reviews", type=at_least(1), default=300, help="reviews of each sort (policy, route, Service, Namespace) per size")
    sub.add_parser("gateway", help="measure the NGINX data plane (gwpolicy bench gateway --help)", add_help=False)
    sub.add_parser("regex", help="what a hostile request to a regex route costs another tenant "
                   "(gwpolicy bench regex --help)", add_help=False)
    sub.add_parser("dataplane", help="what a request costs NGINX in gwpolicy's configuration, against a hand-written "
                   "one (gwpolicy bench dataplane --help)", add_help=False)
    sub.add_parser("controller-inproc", help="the controller's analysis and each kind of edit, in process "
                   "(gwpolicy bench controller-inproc --help)", add_help=False)
    sub.add_parser("replicas", help="requests per second through one gateway replica and through three, and "
                   "an edit's time to every replica (gwpolicy bench replicas --help)", add_help=False)
    sub.add_parser("tracing", help="what tracing at 100%% sampling costs NGINX, and the span relay's CPU at "
                   "1,000 requests/s (gwpolicy bench tracing --help)", add_help=False)
    if (argv if argv is not None else sys.argv[1:])[:1] == ["tracing"]:
        from gwpolicy.bench.tracing import main as tracing_main
        return tracing_main(list(argv if argv is not None else sys.argv[1:])[1:])
    if (argv if argv is not None else sys.argv[1:])[:1] == ["replicas"]:
        from gwpolicy.bench.replicas import main as replicas_main
        return replicas_main(list(argv if argv is not None else sys.argv[1:])[1:])
    if (argv if argv is not None else sys.argv[1:])[:1] == ["controller-inproc"]:
        from gwpolicy.bench.controller_inproc import main as inproc_main
        return inproc_main(list(argv if argv is not None else sys.argv[1:])[1:])
    if (argv if argv is not None else sys.argv[1:])[:1] == ["regex"]:
        from gwpolicy.bench.regex_cost import main as regex_main
        return regex_main(list(argv if argv is not None else sys.argv[1:])[1:])
    if (argv if argv is not None else sys.argv[1:])[:1] == ["dataplane"]:
        from gwpolicy.bench.dataplane import main as dataplane_main
        return dataplane_main(list(argv if argv is not None else sys.argv[1:])[1:])
    if (argv if argv is not None else sys.argv[1:])[:1] == ["gateway"]:
        from gwpolicy.bench.gateway import main as gateway_main
        return gateway_main(list(argv if argv is not None else sys.argv[1:])[1:])
    args = parser.parse_args(argv)
    if args.cmd == "webhook":
        from gwpolicy.bench.webhook import measure_webhook, webhook_table
        rows = [measure_webhook(n, args.reviews) for n in args.routes]
        print("\n".join(webhook_table(rows)))
        return 0
    if args.cmd == "generate":
        if args.output == "-":
            import yaml

            from gwpolicy.bench.generate import cluster
            yaml.dump_all(cluster(args.routes, args.seed), sys.stdout, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                          sort_keys=False)
        else:
            n = write_yaml(args.routes, args.output, args.seed)
            print(f"wrote {n} objects to {args.output}", file=sys.stderr)
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    if args.instructions:
        return _instructions(args)
    rows = []
    for size in args.sizes:
        print(f"measuring {size} routes...", file=sys.stderr)
        rows.append(measure(size, args.workdir, args.repeat))
    controller = None
    if args.controller:
        from gwpolicy.bench.controller import measure_controller
        controller = []
        for size in args.controller_routes:
            print(f"measuring the controller on {size} routes...", file=sys.stderr)
            controller.append(measure_controller(size, args.workdir, breadcrumb_qps=args.controller_breadcrumb_qps,
                                                 restart=not args.no_controller_restart))
    text = report(rows, controller)
    print(text, end="")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"engine": rows, "controller": controller}, fh, indent=2)
    return 0
