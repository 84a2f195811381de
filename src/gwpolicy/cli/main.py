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

from gwpolicy import __version__
from gwpolicy.analysis import Analysis, analyse
from gwpolicy.cli.args import HelpFormatter, Parser, program_name
from gwpolicy.cli.context import Ctx, port_number, positive_number, rfc3339_time
from gwpolicy.cli.kubeconfig import context_namespace
from gwpolicy.cli.printers import Style
from gwpolicy.cli.resources import NotFound, find_object
from gwpolicy.load import LoadError, load_paths
from gwpolicy.model import well_shaped
from gwpolicy.output import encode, status_list, write_effective
from gwpolicy.status import DEFAULT_CONTROLLER

if TYPE_CHECKING:
    from gwpolicy.cli.get import GetOptions

#: phase timings, printed on stderr as JSON when GWPOLICY_TIMINGS is set (the benchmark reads them)
TIMINGS: dict[str, float] | None = {} if os.environ.get("GWPOLICY_TIMINGS") else None


class CliError(Exception):
    """A user-facing error: printed as `Error: ...` on stderr, exit code 1."""


#: exit code of `status --fail-on-not-accepted` when a policy is not Accepted (1 stays "could not run")
EXIT_NOT_ACCEPTED = 3


#: examples shown by `COMMAND --help`; {p} is the program name (gwpolicy, or kubectl gwpolicy)
EXAMPLES: dict[str, str] = {
    "get": """\
  # every policy of the namespace, whether it is Accepted and how many objects it affects
  {p} get policies -n baker -f examples/parable
  # several names, of one type or of several
  {p} get retrypolicies cake-retries bagel-retries -n baker -f examples/parable
  {p} get httproute/cake retrypolicy/cake-retries -n baker -f examples/parable
  # by label, with the labels shown, sorted by age; without the header row
  {p} get namespaces -l 'shop in (true),!pci' --show-labels --sort-by .metadata.creationTimestamp -f examples/parable
  {p} get httproutes -A --no-headers --sort-by .metadata.name -f examples/parable
  # fields of your choice
  {p} get policies -n baker -o custom-columns=NAME:.metadata.name,REASON:.status.ancestors[0].conditions[0].reason -f examples/parable
  {p} get policies -n baker -o jsonpath='{{range .items[*]}}{{.metadata.name}}{{"\\n"}}{{end}}' -f examples/parable
  # the policy kinds gwpolicy knows, and how it recognised each
  {p} get policykinds -f examples/parable""",
    "describe": """\
  # which policies affect a route, and the effective settings field by field
  {p} describe httproute/cake -n baker -f examples/parable
  # what a policy targets, what it affects and how each of its fields fares
  {p} describe retrypolicy/cake-retries -n baker -f examples/parable""",
    "explain": """\
  # the precedence ladder of maxRetries on every path to the route
  {p} explain httproute/cake maxRetries -n baker -f examples/parable
  # one rule of the route, every field under backoff, as JSON
  {p} explain 'httproute/cake#api' backoff -n baker -o json -f examples/parable""",
    "impact": """\
  # what a policy affects and what deleting it would change
  {p} impact retrypolicy/baker-retries -n baker -f examples/parable""",
    "whatif": """\
  # what applying an edited policy would change, before anyone applies it
  {p} whatif --apply edited-policy.yaml -n baker -f examples/parable
  # what deleting a policy would change
  {p} whatif --delete healthcheckpolicy/cake-health -n baker -f examples/parable""",
    "graph": """\
  # the topology of a namespace as Graphviz, or as an SVG picture
  {p} graph -n payments -f examples/parable
  {p} graph -n payments -o svg -f examples/parable > payments.svg""",
    "effective": """\
  # the effective policy of every object, path and kind (the contract's EffectivePolicyList)
  {p} effective -f examples/parable
  {p} effective -n payments -o yaml -f examples/parable""",
    "status": """\
  # the status the controller would write
  {p} status -n grocer -o yaml -f examples/parable
  # in CI: fail (exit 3) when a policy of the manifests is not Accepted
  {p} status --fail-on-not-accepted -o yaml -f manifests/ > /dev/null""",
    "sandbox": """\
  # an API server on a free port, with a kubeconfig for kubectl, loaded with the parable
  {p} sandbox --kubeconfig-out /tmp/sandbox.kubeconfig -f examples/parable &
  kubectl --kubeconfig /tmp/sandbox.kubeconfig get httproutes -A""",
    "completion": """\
  # bash: load completion now, or for every shell
  source <({p} completion bash)
  {p} completion bash > /etc/bash_completion.d/gwpolicy
  # zsh (after compinit)
  source <({p} completion zsh)""",
}


def _get_format(text: str) -> str:
    """`-o` of get: a kubectl format, `jsonpath=TEMPLATE` or `custom-columns=SPEC`."""
    if text in GET_FORMATS or text.startswith(("jsonpath=", "custom-columns=")):
        return text
    raise argparse.ArgumentTypeError(
        f'unable to match a printer suitable for the output format "{text}", allowed formats are: '
        + ",".join(GET_FORMATS + ("jsonpath=TEMPLATE", "custom-columns=SPEC")))


GET_FORMATS = ("table", "wide", "json", "yaml", "name")


def _common(p: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    p.add_argument("-f", "--filename", action="append", default=None, metavar="FILE|DIR|-",
                   help="manifests to analyse (repeatable; a directory is read recursively; - is stdin); "
                        "without -f the cluster of the kubeconfig is read")
    p.add_argument("-n", "--namespace", help="namespace of the names given, and of what is listed "
                                             "(default: the kubeconfig context's namespace, else default)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list objects of every namespace")
    if formats is GET_FORMATS:
        p.add_argument("-o", "--output", default="table", type=_get_format, metavar="FORMAT",
                       help="output format: " + "|".join(formats) + "|jsonpath=TEMPLATE|custom-columns=SPEC")
    else:
        p.add_argument("-o", "--output", default=formats[0], choices=formats, help="output format")
    p.add_argument("--context", help="kubeconfig context (its namespace is the default namespace)")
    p.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--controller-name", default=DEFAULT_CONTROLLER, help="controllerName of our status entries")
    p.add_argument("--now", default=os.environ.get("GWPOLICY_NOW"), type=rfc3339_time,
                   help="the current time, RFC 3339 (default: now); fixes AGE and lastTransitionTime for reproducible output")


def _command(sub: Any, name: str, help: str, prog: str, **kw: Any) -> argparse.ArgumentParser:
    """A subcommand with its examples in its --help."""
    examples = EXAMPLES.get(name)
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                          epilog=("Examples:\n" + examples.format(p=prog)) if examples else None,
                          formatter_class=HelpFormatter, **kw)


def build_parser(prog: str = "gwpolicy") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, formatter_class=HelpFormatter,
                    description="Gateway API policy attachment (GEP-713): which policies affect an object and why, "
                                "what a policy affects, and the status a controller writes.",
                    epilog=f"Examples:\n  {prog} get policies -A -f examples/parable\n"
                           f"  {prog} describe httproute/cake -n baker -f examples/parable\n"
                           f"Use '{prog} COMMAND --help' for the examples of a command.")
    parser.add_argument("--version", action="version", version=f"gwpolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = _command(sub, "get", "list policies, policy kinds, or objects with the policies that affect them", prog)
    p.add_argument("names", nargs="*", metavar="TYPE[/NAME] [NAME...]",
                   help="policies, policykinds, or a type (gateways, httproutes, svc, retrypolicies...), "
                        "then names; or several TYPE/NAME")
    _common(p, GET_FORMATS)
    p.add_argument("-l", "--selector", metavar="SELECTOR",
                   help="label selector as kubectl takes it (=, ==, !=, in, notin, KEY, !KEY)")
    p.add_argument("--show-labels", action="store_true", help="add a LABELS column")
    p.add_argument("--sort-by", metavar="JSONPATH", help="sort by the value of a field (e.g. .metadata.name)")
    p.add_argument("--no-headers", action="store_true", help="no header row in table and custom-columns output")
    p.add_argument("--ignore-not-found", action="store_true", help="a name that is not there is not an error")
    p = _command(sub, "describe", "which policies affect an object and what results, or what a policy does", prog)
    p.add_argument("ref", metavar="TYPE/NAME")
    p.add_argument("name", nargs="?", help=argparse.SUPPRESS)
    _common(p, ("text",))
    p = _command(sub, "explain", "the precedence ladder of one field on each path", prog)
    p.add_argument("ref", metavar="TYPE/NAME[#SECTION]")
    p.add_argument("field", metavar="FIELD", help="dotted field of the settings (a prefix shows every field below it)")
    p.add_argument("--kind", help="only this policy kind")
    _common(p, ("table", "json", "yaml"))
    p = _command(sub, "impact", "what a policy affects and what deleting it would change", prog)
    p.add_argument("ref", metavar="POLICYTYPE/NAME")
    _common(p, ("table", "json", "yaml"))
    p = _command(sub, "whatif", "what applying changed objects, or deleting one, would change", prog)
    grp = p.add_mutually_exclusive_group(required=True)
    grp.add_argument("--apply", action="append", metavar="FILE|DIR|-", help="changed or new objects")
    grp.add_argument("--delete", metavar="TYPE/NAME", help="an object to delete")
    _common(p, ("table", "json", "yaml"))
    p = _command(sub, "graph", "the topology with policies on what they target", prog)
    _common(p, ("dot", "mermaid", "svg"))
    sub.add_parser("sandbox", help="a local Kubernetes API server to try policies with kubectl (gwpolicy sandbox --help)")
    sub.add_parser("controller", help="write policy status into a cluster (gwpolicy controller --help)")
    sub.add_parser("webhook", help="warn at apply time about policy effects (gwpolicy webhook --help)")
    sub.add_parser("gateway", help="serve Gateways and HTTPRoutes with NGINX, with GEP-1364 status (gwpolicy gateway --help)")
    sub.add_parser("nginx-sidecar", help="run the gateway's NGINX in a container of its own (gwpolicy nginx-sidecar --help)")
    sub.add_parser("render", help="print the NGINX configuration for manifests on disk (gwpolicy render --help)")
    sub.add_parser("echo", help="the conformance echo backend for tests and demos (gwpolicy echo --help; --grpc: the gRPC one)")
    sub.add_parser("bench", help="generate synthetic clusters and measure gwpolicy on them (gwpolicy bench --help)")
    p = _command(sub, "effective", "effective policy of every object, path and policy kind", prog)
    _common(p, ("json", "yaml"))
    p = _command(sub, "status", "the status the controller would write", prog)
    _common(p, ("json", "yaml"))
    p.add_argument("--fail-on-not-accepted", action="store_true",
                   help=f"exit {EXIT_NOT_ACCEPTED} when a policy in scope is not Accepted on every target, "
                        "naming each on stderr (for CI)")
    p = _command(sub, "completion", "shell completion script for bash or zsh", prog)
    p.add_argument("shell", choices=("bash", "zsh"))
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
        loaded = Loaded(objects, [_cluster_origin(o) for o in objects])
    if TIMINGS is not None:
        TIMINGS["load"] = time.perf_counter() - t0

    def run(raws: list[dict[str, Any]], origins: list[str] | None = None) -> Analysis:
        return analyse(raws, origins, default_namespace=namespace, controller=args.controller_name, now=args.now,
                       timings=TIMINGS)

    a = run(loaded.objects, loaded.origins)
    for w in a.warnings:
        print(f"Warning: {w}", file=sys.stderr)
    return a, run


def _cluster_origin(obj: dict[str, Any]) -> str:
    """Where a live object came from, named as every other reference is: `cluster: Kind/namespace/name`."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"cluster: {obj.get('kind')}/" + (f"{ns}/" if ns else "") + str(meta.get("name"))


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
    from gwpolicy.attach import ACCEPTED
    from gwpolicy.cli.context import label

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


def run_command(args: argparse.Namespace) -> tuple[bytes, str | None]:
    """(stdout, stderr note) of one command; raises CliError/NotFound/LoadError for errors."""
    if args.command == "completion":
        from gwpolicy.cli.completion import script

        return script(args.shell, program_name()).encode(), None
    options = _get_options(args) if args.command == "get" else None
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
        return cmd_whatif(ctx, apply_raws, delete, reanalyse), None
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
    if argv[:1] == ["gateway"]:
        from gwpolicy.gateway.controller import main as gateway_main
        return gateway_main(argv[1:])
    # A CLI run is short and allocates millions of objects that live until it exits: the cyclic
    # garbage collector would walk them again and again for nothing (a third of the run time).
    gc.disable()
    if argv[:1] == ["__complete"]:
        from gwpolicy.cli.completion import complete_main
        return complete_main(argv[1:])
    parser = build_parser(program_name())
    args, extra = parser.parse_known_args(argv)
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
    p.add_argument("--data-dir", metavar="DIR", help="keep objects and resourceVersions in DIR (SQLite) and "
                   "come back with them after a restart, also after kill -9; -f loads only into an empty DIR")
    p.add_argument("--crds", choices=["standard", "experimental", "none"], default="standard",
                   help="CRDs installed at start: the Gateway API's standard or experimental channel, each with "
                        "gwpolicy's CRDs and the PolicyKinds of its policy kinds (deploy/); none: only built-in "
                        "kinds. A CRD given with -f replaces ours of the same name, kind or plural (default: standard)")
    args = p.parse_args(argv)
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
                          args.data_dir, args.allow_loopback_endpoints))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


_SERVERS = ("bench", "sandbox", "controller", "webhook", "gateway", "nginx-sidecar", "echo")


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
