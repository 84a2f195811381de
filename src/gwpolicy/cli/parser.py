"""The command line's grammar: commands, flags, help and examples (argparse)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Sequence

from gwpolicy import __version__
from gwpolicy.cli.context import rfc3339_time
from gwpolicy.engine.status import DEFAULT_CONTROLLER
from gwpolicy.kube.args import HelpFormatter, Parser, namespace_name

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
  {p} describe retrypolicy/cake-retries -n baker -f examples/parable
  # in a mesh: what applies to requests from namespace shop to the Service reports
  {p} describe service/reports -n demo --from shop -f examples/mesh""",
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


def _from(p: argparse.ArgumentParser) -> None:
    """`--from NAMESPACE`: the mesh paths of that namespace's requests only (docs/mesh.md)."""
    p.add_argument("--from", dest="from_namespace", metavar="NAMESPACE", type=namespace_name,
                   help="only the mesh paths of requests from this namespace: its own, and those of Namespace/* "
                        "where it has none of its own; north-south paths are left out (needs an XMesh)")


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
    _from(p)
    p = _command(sub, "explain", "the precedence ladder of one field on each path", prog)
    p.add_argument("ref", metavar="TYPE/NAME[#SECTION]")
    p.add_argument("field", metavar="FIELD", help="dotted field of the settings (a prefix shows every field below it)")
    p.add_argument("--kind", help="only this policy kind")
    _common(p, ("table", "json", "yaml"))
    _from(p)
    p = _command(sub, "impact", "what a policy affects and what deleting it would change", prog)
    p.add_argument("ref", metavar="POLICYTYPE/NAME")
    _common(p, ("table", "json", "yaml"))
    _from(p)
    p = _command(sub, "whatif", "what applying changed objects, or deleting one, would change", prog)
    grp = p.add_mutually_exclusive_group(required=True)
    grp.add_argument("--apply", action="append", metavar="FILE|DIR|-", help="changed or new objects")
    grp.add_argument("--delete", metavar="TYPE/NAME", help="an object to delete")
    _common(p, ("table", "json", "yaml"))
    _from(p)
    p = _command(sub, "graph", "the topology with policies on what they target", prog)
    _common(p, ("dot", "mermaid", "svg"))
    sub.add_parser("sandbox", help="a local Kubernetes API server to try policies with kubectl (gwpolicy sandbox --help)")
    sub.add_parser("controller", help="write policy status into a cluster (gwpolicy controller --help)")
    sub.add_parser("webhook", help="warn at apply time about policy effects (gwpolicy webhook --help)")
    sub.add_parser("gateway", help="serve Gateways and HTTPRoutes with NGINX, with GEP-1364 status (gwpolicy gateway --help)")
    sub.add_parser("mesh", help="the mesh proxy of one client namespace, with NGINX (gwpolicy mesh --help)")
    sub.add_parser("nginx-sidecar", help="run the gateway's NGINX in a container of its own (gwpolicy nginx-sidecar --help)")
    sub.add_parser("render", help="print the NGINX configuration for manifests on disk (gwpolicy render --help)")
    sub.add_parser("echo", help="the conformance echo backend for tests and demos (gwpolicy echo --help; --grpc: the gRPC one)")
    sub.add_parser("bench", help="generate synthetic clusters and measure gwpolicy on them (gwpolicy bench --help)")
    p = _command(sub, "effective", "effective policy of every object, path and policy kind", prog)
    _common(p, ("json", "yaml"))
    _from(p)
    p = _command(sub, "status", "the status the controller would write", prog)
    _common(p, ("json", "yaml"))
    p.add_argument("--fail-on-not-accepted", action="store_true",
                   help=f"exit {EXIT_NOT_ACCEPTED} when a policy in scope is not Accepted on every target, "
                        "naming each on stderr (for CI)")
    p = _command(sub, "completion", "shell completion script for bash or zsh", prog)
    p.add_argument("shell", choices=("bash", "zsh"))
    return parser
