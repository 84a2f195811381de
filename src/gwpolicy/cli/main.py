"""`gwpolicy` entry point: kubectl-like flags, errors on stderr, exit codes (0 ok, 1 error).

Also installed as `kubectl-gwpolicy`, so `kubectl gwpolicy ...` works; kubectl hands every flag
to the plugin, which handles `-n`, `--context` and `--kubeconfig` itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

from gwpolicy import __version__
from gwpolicy.analysis import Analysis, analyse
from gwpolicy.cli.context import Ctx, port_number, positive_number, rfc3339_time
from gwpolicy.cli.kubeconfig import context_namespace
from gwpolicy.cli.printers import Style
from gwpolicy.cli.resources import NotFound, find_object, split_ref
from gwpolicy.load import LoadError, load_paths
from gwpolicy.model import well_shaped
from gwpolicy.output import encode, status_list, write_effective
from gwpolicy.status import DEFAULT_CONTROLLER


#: phase timings, printed on stderr as JSON when GWPOLICY_TIMINGS is set (the benchmark reads them)
TIMINGS: dict[str, float] | None = {} if os.environ.get("GWPOLICY_TIMINGS") else None


class CliError(Exception):
    """A user-facing error: printed as `Error: ...` on stderr, exit code 1."""


def _common(p: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    p.add_argument("-f", "--filename", action="append", default=[], metavar="FILE|DIR|-",
                   help="manifests to analyse (repeatable; a directory is read recursively; - is stdin)")
    p.add_argument("-n", "--namespace", help="namespace of the names given, and of what is listed")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list objects of every namespace")
    p.add_argument("-o", "--output", default=formats[0], choices=formats, help="output format")
    p.add_argument("--context", help="kubeconfig context (its namespace is the default namespace)")
    p.add_argument("--kubeconfig", help="path to the kubeconfig file")
    p.add_argument("--controller-name", default=DEFAULT_CONTROLLER, help="controllerName of our status entries")
    p.add_argument("--now", default=os.environ.get("GWPOLICY_NOW"), type=rfc3339_time,
                   help="the current time, RFC 3339 (default: now); fixes AGE and lastTransitionTime for reproducible output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gwpolicy", description="Gateway API policy attachment (GEP-713): "
                                     "which policies affect an object and why, what a policy affects, "
                                     "and the status a controller writes.")
    parser.add_argument("--version", action="version", version=f"gwpolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("get", help="list policies, policy kinds, or objects with the policies that affect them")
    p.add_argument("type", metavar="TYPE[/NAME]", help="policies, policykinds, or a kind (gateways, httproutes, svc, retrypolicies...)")
    p.add_argument("name", nargs="?", metavar="NAME", help="only this object")
    _common(p, ("table", "wide", "json", "yaml", "name"))
    p = sub.add_parser("describe", help="which policies affect an object and what results, or what a policy does")
    p.add_argument("ref", metavar="TYPE/NAME")
    p.add_argument("name", nargs="?", help=argparse.SUPPRESS)
    _common(p, ("text",))
    p = sub.add_parser("explain", help="the precedence ladder of one field on each path")
    p.add_argument("ref", metavar="TYPE/NAME[#SECTION]")
    p.add_argument("field", metavar="FIELD", help="dotted field of the settings (a prefix shows every field below it)")
    p.add_argument("--kind", help="only this policy kind")
    _common(p, ("table", "json", "yaml"))
    p = sub.add_parser("impact", help="what a policy affects and what deleting it would change")
    p.add_argument("ref", metavar="POLICYTYPE/NAME")
    _common(p, ("table", "json", "yaml"))
    p = sub.add_parser("whatif", help="what applying changed objects, or deleting one, would change")
    grp = p.add_mutually_exclusive_group(required=True)
    grp.add_argument("--apply", action="append", metavar="FILE|DIR|-", help="changed or new objects")
    grp.add_argument("--delete", metavar="TYPE/NAME", help="an object to delete")
    _common(p, ("table", "json", "yaml"))
    p = sub.add_parser("graph", help="the topology with policies on what they target")
    _common(p, ("dot", "mermaid", "svg"))
    sub.add_parser("sandbox", help="a local Kubernetes API server to try policies with kubectl (gwpolicy sandbox --help)")
    sub.add_parser("controller", help="write policy status into a cluster (gwpolicy controller --help)")
    sub.add_parser("webhook", help="warn at apply time about policy effects (gwpolicy webhook --help)")
    sub.add_parser("bench", help="generate synthetic clusters and measure gwpolicy on them (gwpolicy bench --help)")
    p = sub.add_parser("effective", help="effective policy of every object, path and policy kind (S9)")
    _common(p, ("json", "yaml"))
    p = sub.add_parser("status", help="the status the controller would write (S9)")
    _common(p, ("json", "yaml"))
    return parser


def _load(args: argparse.Namespace, namespace: str) -> tuple[Analysis, Callable[[list[dict[str, Any]]], Analysis]]:
    t0 = time.perf_counter()
    if args.filename:
        loaded = load_paths(args.filename)
        for w in loaded.warnings:
            print(f"Warning: {w}", file=sys.stderr)
    else:  # live mode: read the cluster of the kubeconfig (read-only)
        from gwpolicy.cli.live import read_cluster
        from gwpolicy.load import Loaded

        try:
            objects = read_cluster(args.kubeconfig, args.context)
        except RuntimeError as exc:
            raise CliError(str(exc)) from exc
        loaded = Loaded(objects, [f"cluster: {o.get('kind')} {o['metadata'].get('name')}" for o in objects])
    if TIMINGS is not None:
        TIMINGS["load"] = time.perf_counter() - t0

    def run(raws: list[dict[str, Any]], origins=None) -> Analysis:
        return analyse(raws, origins, default_namespace=namespace, controller=args.controller_name, now=args.now,
                       timings=TIMINGS)

    a = run(loaded.objects, loaded.origins)
    for w in a.warnings:
        print(f"Warning: {w}", file=sys.stderr)
    return a, run


def _ctx(args: argparse.Namespace, a: Analysis, namespace: str) -> Ctx:
    return Ctx(a, namespace, bool(args.all_namespaces), args.output, Style())


def run_command(args: argparse.Namespace) -> tuple[bytes, str | None]:
    """(stdout, stderr note) of one command; raises CliError/NotFound/LoadError for errors."""
    namespace = args.namespace or context_namespace(args.kubeconfig, args.context)
    a, reanalyse = _load(args, namespace)
    ctx = _ctx(args, a, namespace)
    cmd = args.command
    if cmd == "effective":
        t0 = time.perf_counter()
        sys.stdout.flush()
        write_effective(a, sys.stdout.buffer, args.output, None if args.all_namespaces or not args.namespace else args.namespace)
        if TIMINGS is not None:
            TIMINGS["output"] = time.perf_counter() - t0
        return b"", None
    if cmd == "status":
        return encode(status_list(a, None if args.all_namespaces or not args.namespace else args.namespace), args.output), None
    if cmd == "get":
        from gwpolicy.cli.get import cmd_get
        what, name = args.type, args.name
        if "/" in what:
            what, name = split_ref(what)
        return cmd_get(ctx, what, name)
    if cmd == "describe":
        from gwpolicy.cli.describe import describe_policy, describe_target
        ref = find_object(a, args.ref, namespace, args.name)
        text = describe_policy(ctx, ref) if ref in a.policies else describe_target(ctx, ref)
        return text.encode(), None
    if cmd == "explain":
        from gwpolicy.cli.explain_cmd import cmd_explain
        text, section = args.ref, None
        if "#" in text:
            text, section = text.split("#", 1)
        ref = find_object(a, text, namespace).with_section(section)
        if section is not None and section not in a.topology.sections.get(ref.object, []):
            raise NotFound(f'{ref.kind} "{ref.name}" has no section "{section}"')
        return cmd_explain(ctx, ref, args.field, args.kind), None
    if cmd == "impact":
        from gwpolicy.cli.impact import cmd_impact
        ref = find_object(a, args.ref, namespace)
        if ref not in a.policies:
            raise CliError(f"{args.ref} is not a policy; impact takes POLICYTYPE/NAME")
        return cmd_impact(ctx, ref, reanalyse), None
    if cmd == "whatif":
        from gwpolicy.cli.impact import cmd_whatif
        apply_raws = None
        if args.apply:
            changed = load_paths(args.apply)
            warnings = list(changed.warnings)
            apply_raws, _ = well_shaped(changed.objects, changed.origins, namespace, warnings)  # named here, by file
            for w in warnings:
                print(f"Warning: {w}", file=sys.stderr)
        delete = find_object(a, args.delete, namespace) if args.delete else None
        return cmd_whatif(ctx, apply_raws, delete, reanalyse), None
    if cmd == "graph":
        from gwpolicy.cli.graph import cmd_graph
        ctx.all_namespaces = ctx.all_namespaces or not args.namespace  # the whole picture unless -n narrows it
        return cmd_graph(ctx), None
    raise CliError(f"unknown command {cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from gwpolicy.bench.run import main as bench_main
        return bench_main(argv[1:])
    if argv[:1] == ["sandbox"]:
        return sandbox_main(argv[1:])
    if argv[:1] == ["controller"]:
        from gwpolicy.controller.main import main as controller_main
        return controller_main(argv[1:])
    if argv[:1] == ["webhook"]:
        from gwpolicy.webhook.main import main as webhook_main
        return webhook_main(argv[1:])
    # A CLI run is short and allocates millions of objects that live until it exits: the cyclic
    # garbage collector would walk them again and again for nothing (a third of the run time).
    gc.disable()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 1
    try:
        out, note = run_command(args)
    except (LoadError, CliError, NotFound) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - never a traceback for users; GWPOLICY_DEBUG=1 shows it
        if os.environ.get("GWPOLICY_DEBUG"):
            raise
        print(f"Error: unexpected {type(exc).__name__}: {exc} (set GWPOLICY_DEBUG=1 for the traceback, "
              "and please report it)", file=sys.stderr)
        return 1
    try:
        t0 = time.perf_counter()
        if out:
            sys.stdout.buffer.write(out)
        sys.stdout.flush()
    except BrokenPipeError:
        return 0
    if note:
        print(note, file=sys.stderr)
    if TIMINGS is not None:
        TIMINGS["output"] = TIMINGS.get("output", 0.0) + time.perf_counter() - t0
        print("timings " + json.dumps({k: round(v, 4) for k, v in TIMINGS.items()}), file=sys.stderr)
    return 0


def sandbox_main(argv: list[str]) -> int:
    """`gwpolicy sandbox`: run the local API server in the foreground."""
    import asyncio

    from gwpolicy.sandbox.server import serve

    p = argparse.ArgumentParser(prog="gwpolicy sandbox", description="A local Kubernetes API server on 127.0.0.1 "
                                "for tests and for trying policies with kubectl, no cluster needed.")
    p.add_argument("--port", type=port_number, default=0, help="port to listen on (0 picks a free one)")
    p.add_argument("--kubeconfig-out", metavar="FILE", help="write a kubeconfig for the sandbox here")
    p.add_argument("--keep-creation-timestamp", action="store_true",
                   help="test switch: keep metadata.creationTimestamp from the input, so age decides as written")
    p.add_argument("--bookmark-interval", type=positive_number, default=1.0, help="seconds between watch BOOKMARK events")
    p.add_argument("-f", "--filename", action="append", default=[], help="objects to load at start (CRDs first)")
    p.add_argument("--data-dir", metavar="DIR", help="keep objects and resourceVersions in DIR (SQLite) and "
                   "come back with them after a restart, also after kill -9; -f loads only into an empty DIR")
    args = p.parse_args(argv)
    preload = []
    if args.filename:
        from gwpolicy.sandbox.seed import ordered, well_shaped

        try:
            loaded = load_paths(args.filename)
        except LoadError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        for w in loaded.warnings:
            print(f"Warning: {w}", file=sys.stderr)
        objects = well_shaped(loaded.objects, loaded.origins, sys.stderr)
        preload = ordered(objects)  # with CRDs made up for kinds that have none
    try:
        asyncio.run(serve(args.port, args.kubeconfig_out, args.keep_creation_timestamp, args.bookmark_interval, preload,
                          args.data_dir))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


_SERVERS = ("bench", "sandbox", "controller", "webhook")


def entry() -> None:
    """The console scripts: `main`, then, for a one-shot command, an exit that leaves the memory to
    the operating system instead of freeing the analysis object by object (0.9 s at 20k routes)."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in _SERVERS:
        sys.exit(code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
