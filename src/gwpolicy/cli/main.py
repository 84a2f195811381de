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
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gwpolicy.cli.context import Ctx, port_number, requests_from
from gwpolicy.cli.loading import TIMINGS, CliError, load_analysis
from gwpolicy.cli.parser import EXAMPLES, EXIT_NOT_ACCEPTED, build_parser
from gwpolicy.cli.resources import NotFound, find_object
from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.model import well_shaped
from gwpolicy.files.load import LoadError, load_paths
from gwpolicy.files.output import encode, status_list, write_effective
from gwpolicy.files.printers import Style
from gwpolicy.kube.args import HelpFormatter, Parser, positive_number, program_name
from gwpolicy.kube.kubeconfig import context_namespace

if TYPE_CHECKING:
    from gwpolicy.cli.get import GetOptions
    from gwpolicy.engine.topology import PathNode







def _ctx(args: argparse.Namespace, a: Analysis, namespace: str) -> Ctx:
    return Ctx(a, namespace, bool(args.all_namespaces), args.output, Style())


class GateFailed(Exception):
    """`status --fail-on-not-accepted` found policies that are not Accepted: the output still goes out."""

    code = EXIT_NOT_ACCEPTED

    def __init__(self, out: bytes, failing: list[tuple[str, str]]) -> None:
        policies = len({policy for policy, _ in failing})
        super().__init__(f"{policies} polic{'y is' if policies == 1 else 'ies are'} not Accepted")
        self.out = out
        self.failing = failing

    def report(self) -> str:
        return f"Error: {self}:\n" + "\n".join(f"  {policy}: {what}" for policy, what in self.failing)


def not_accepted(a: Analysis, namespace: str | None) -> list[tuple[str, str]]:
    """`Kind/namespace/name: Reason on Target: message`, a line per target where a policy in scope
    is not Accepted (a CI log then says what to fix, not only that something is wrong)."""
    from gwpolicy.cli.context import label
    from gwpolicy.engine.attach import ACCEPTED

    out = []
    for ref in sorted(a.policies, key=lambda r: (r.namespace or "", r.name, r.kind)):
        if namespace is not None and ref.namespace != namespace:
            continue
        bad = [o for o in a.outcomes.get(ref, []) if o.reason != ACCEPTED]
        out += [(label(ref), f"{o.reason} on {label(o.declared) if o.declared is not None else '<no target>'}"
                 + (f": {o.message}" if o.message else "")) for o in bad]
    return out


def _get_options(args: argparse.Namespace) -> "GetOptions":
    """The printing flags of `get`, checked before anything is read: a bad one says which flag."""
    from gwpolicy.cli.get import GetOptions
    from gwpolicy.cli.jsonpath import JsonPathError, parse_columns, parse_template, relaxed, translate, unquote
    from gwpolicy.cli.selector import SelectorError, parse_selector

    if args.show_labels and args.output not in ("table", "wide"):
        raise CliError(f"--show-labels option cannot be used with {args.output} printer")
    try:
        selector = parse_selector(args.selector) if args.selector is not None else None
    except SelectorError as exc:
        raise CliError(f"-l/--selector {args.selector!r}: {exc}") from exc
    fmt, _, spec = args.output.partition("=")
    try:
        if fmt == "jsonpath":
            parse_template(unquote(spec))
        elif fmt == "custom-columns":
            parse_columns(spec)
    except JsonPathError as exc:
        raise CliError(f"-o {fmt}: {exc}") from exc
    try:
        if args.sort_by is not None:
            translate(relaxed(args.sort_by))
    except JsonPathError as exc:
        raise CliError(f"--sort-by: {exc}") from exc
    return GetOptions(args.output, selector, args.show_labels, args.sort_by, args.no_headers, args.ignore_not_found)


def _keep_noting(ctx: Ctx, borrowed: list[bool]) -> Callable[[PathNode], bool]:
    """`ctx.keeps`, which also notes in `borrowed` whether it kept a path of `Namespace/*`."""
    rf = ctx.requests_from
    assert rf is not None

    def keep(path: PathNode) -> bool:
        if not rf.holds(path):
            return False
        if not borrowed and rf.borrows(path):
            borrowed.append(True)
        return True
    return keep


def run_command(args: argparse.Namespace) -> tuple[bytes, str | None]:
    """(stdout, stderr note) of one command; raises CliError/NotFound/LoadError for errors."""
    if args.command == "completion":
        from gwpolicy.cli.completion import script

        return script(args.shell, program_name()).encode(), None
    options = _get_options(args) if args.command == "get" else None
    namespace = args.namespace or context_namespace(args.kubeconfig, args.context)
    a, reanalyse = load_analysis(args, namespace)
    ctx = _ctx(args, a, namespace)
    cmd = args.command
    from_namespace = getattr(args, "from_namespace", None)
    if from_namespace is not None and cmd != "whatif":  # whatif: either side's mesh will do (cmd_whatif)
        ctx.requests_from = requests_from(a, from_namespace)
    if cmd == "effective":
        t0 = time.perf_counter()
        sys.stdout.flush()
        borrowed: list[bool] = []
        keep = None if ctx.requests_from is None else _keep_noting(ctx, borrowed)
        write_effective(a, sys.stdout.buffer, args.output, None if args.all_namespaces or not args.namespace else args.namespace,
                        keep=keep)
        if TIMINGS is not None:
            TIMINGS["output"] = time.perf_counter() - t0
        note = None
        if borrowed:
            note = (f"Note: the items on paths of Namespace/* are what applies to requests from {from_namespace} where it "
                    "has no mesh paths of its own")
        return b"", note
    if cmd == "status" and getattr(args, "mesh_status", False):
        from gwpolicy.engine.meshstatus import mesh_status_changes
        scope = None if args.all_namespaces or not args.namespace else args.namespace
        return encode(status_list(a, scope, mesh_status_changes(a)), args.output), None
    if cmd == "status":
        scope = None if args.all_namespaces or not args.namespace else args.namespace
        out = encode(status_list(a, scope), args.output)
        if args.fail_on_not_accepted:
            failing = not_accepted(a, scope)
            if failing:
                raise GateFailed(out, failing)
        return out, None
    if cmd == "get":
        from gwpolicy.cli.get import cmd_get
        assert options is not None
        return cmd_get(ctx, args.names, options)
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
        return cmd_whatif(ctx, apply_raws, delete, reanalyse, from_namespace), None
    if cmd == "graph":
        from gwpolicy.cli.graph import cmd_graph
        ctx.all_namespaces = ctx.all_namespaces or not args.namespace  # the whole picture unless -n narrows it
        return cmd_graph(ctx), None
    raise CliError(f"unknown command {cmd}")


def _intermixed(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """Names after flags, as kubectl takes them (`get svc -n x a b`): argparse leaves them over."""
    words = [w for w in extra if not w.startswith("-") or w == "-"]
    if not words or len(words) != len(extra):
        return extra
    if args.command == "get":
        args.names += words
        return []
    if args.command == "describe" and args.name is None and len(words) == 1:
        args.name = words[0]
        return []
    return extra


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
    if argv[:1] == ["render"]:
        from gwpolicy.gateway.render_cli import main as render_main
        return render_main(argv[1:])
    if argv[:1] == ["echo"] and "--grpc" in argv:
        from gwpolicy.gateway.grpcecho import main as grpc_echo_main
        return grpc_echo_main(argv[1:])
    if argv[:1] == ["echo"]:
        from gwpolicy.gateway.echo import main as echo_main
        return echo_main(argv[1:])
    if argv[:1] == ["nginx-sidecar"]:
        from gwpolicy.gateway.sidecar import main as sidecar_main
        return sidecar_main(argv[1:])
    if argv[:1] == ["mesh"] and argv[1:2] != ["status"]:  # `mesh status` is the engine's (below)
        from gwpolicy.mesh.proxy import main as mesh_main
        return mesh_main(argv[1:])
    if argv[:1] == ["gateway"]:
        from gwpolicy.gateway.controller import main as gateway_main
        return gateway_main(argv[1:])
    # A CLI run is short and allocates millions of objects that live until it exits: the cyclic
    # garbage collector would walk them again and again for nothing (a third of the run time).
    gc.disable()
    if argv[:1] == ["__complete"]:
        from gwpolicy.cli.completion import complete_main
        return complete_main(argv[1:])
    mesh_status = argv[:2] == ["mesh", "status"]
    if mesh_status:  # `mesh status`: the status command's flags, with what the mesh controller writes
        argv = ["status", *argv[2:]]
    parser = build_parser(program_name())
    args, extra = parser.parse_known_args(argv)
    args.mesh_status = mesh_status
    if not args.command:
        parser.print_help(sys.stderr)
        return 1
    extra = _intermixed(args, extra)
    if extra:  # the subcommand's own usage, not the top-level one
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    from gwpolicy.cli.get import PartialResult
    from gwpolicy.cli.jsonpath import JsonPathError

    try:
        out, note = run_command(args)
    except (PartialResult, GateFailed) as exc:  # the output still goes out, then what went wrong
        try:
            sys.stdout.buffer.write(exc.out)
            sys.stdout.flush()
        except BrokenPipeError:
            pass
        print(exc.report(), file=sys.stderr)
        return exc.code
    except (LoadError, CliError, NotFound, JsonPathError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gwpolicy effective ... | head`: the reader has what it wanted (streamed output)
        return 0
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

    p = Parser(prog=f"{program_name()} sandbox", formatter_class=HelpFormatter,
               epilog="Examples:\n" + EXAMPLES["sandbox"].format(p=program_name()), description="A local Kubernetes API server on 127.0.0.1 "
                                "for tests and for trying policies with kubectl, no cluster needed.")
    p.add_argument("--port", type=port_number, default=0, help="port to listen on (0 picks a free one)")
    p.add_argument("--kubeconfig-out", metavar="FILE", help="write a kubeconfig for the sandbox here")
    p.add_argument("--keep-creation-timestamp", action="store_true",
                   help="test switch: keep metadata.creationTimestamp from the input, so age decides as written")
    p.add_argument("--bookmark-interval", type=positive_number, default=1.0, help="seconds between watch BOOKMARK events")
    p.add_argument("-f", "--filename", action="append", default=[], help="objects to load at start (CRDs first)")
    p.add_argument("--allow-loopback-endpoints", action="store_true",
                   help="take 127.0.0.0/8 and ::1 addresses in EndpointSlices, which kube-apiserver refuses: "
                   "backends on this machine, for a demo or a test (the gateway quickstart)")
    p.add_argument("--service-cidr", metavar="CIDR", default=None,
                   help="IPv4 range Services get their cluster IPs from, as kube-apiserver's "
                        "--service-cluster-ip-range (default 10.96.0.0/12)")
    p.add_argument("--data-dir", metavar="DIR", help="keep objects and resourceVersions in DIR (SQLite) and "
                   "come back with them after a restart, also after kill -9; -f loads only into an empty DIR")
    p.add_argument("--crds", choices=["standard", "experimental", "none"], default="standard",
                   help="CRDs installed at start: the Gateway API's standard or experimental channel, each with "
                        "gwpolicy's CRDs and the PolicyKinds of its policy kinds (deploy/); none: only built-in "
                        "kinds. A CRD given with -f replaces ours of the same name, kind or plural (default: standard)")
    args = p.parse_args(argv)
    if args.service_cidr:
        from gwpolicy.sandbox.clusterips import parse_range

        try:
            parse_range(args.service_cidr)
        except ValueError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
    given: list[dict[str, Any]] = []
    if args.filename:
        from gwpolicy.sandbox.seed import well_shaped

        try:
            loaded = load_paths(args.filename)
        except LoadError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        for w in loaded.warnings:
            print(f"Warning: {w}", file=sys.stderr)
        given = well_shaped(loaded.objects, loaded.origins, sys.stderr)
        del loaded  # serve() empties `preload` as it stores it: nothing else may hold the parsed objects
    preload = []
    if given or args.crds != "none":
        from gwpolicy.sandbox.bundled import BundleMissing
        from gwpolicy.sandbox.bundled import preload as bundled_preload

        try:  # CRDs made up for kinds without one
            preload = bundled_preload(None if args.crds == "none" else args.crds, given)
        except BundleMissing as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        del given
    try:
        asyncio.run(serve(args.port, args.kubeconfig_out, args.keep_creation_timestamp, args.bookmark_interval, preload,
                          args.data_dir, args.allow_loopback_endpoints, args.service_cidr))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


_SERVERS = ("bench", "sandbox", "controller", "webhook", "gateway", "nginx-sidecar", "echo", "mesh")


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
