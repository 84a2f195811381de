"""`gwpolicy render -f DIR`: the NGINX configuration for manifests on disk, no cluster (the edge).

Prints every file render() produces, each under a `# ==== <path> ====` header, so a user can see
what a change does to the data plane before applying it. Private keys are never printed: a
certificate file is shown as a one-line note naming its Secret. What is not served, a Gateway (not
ours, not accepted) or a listener of a served one, is said on stderr, one `Warning:` line each,
with the reason status gives (docs/gateway.md, "One certificate rule; what `gwpolicy render -f`
leaves out and why").
"""

from __future__ import annotations

import argparse
import sys

from gwpolicy.engine.analysis import analyse
from gwpolicy.files.load import LoadError, load_paths
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import (
    DEFAULT_ADDRESS_POOL,
    DEFAULT_CONTROLLER_NAME,
    DataPlane,
    DataPlaneConfig,
    DataPlaneError,
    build_dataplane,
)
from gwpolicy.gateway.render import render
from gwpolicy.kube.args import HelpFormatter, Parser, program_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--filename", action="append", required=True, help="manifest file or directory (repeatable)")
    p.add_argument("--controller-name", default=DEFAULT_CONTROLLER_NAME,
                   help=f"render the Gateways of GatewayClasses with this controllerName (default {DEFAULT_CONTROLLER_NAME}); "
                        "'*' renders every GatewayClass")
    p.add_argument("--address-pool", default=DEFAULT_ADDRESS_POOL,
                   help=f"loopback network Gateways without an address get one from (default {DEFAULT_ADDRESS_POOL})")
    p.add_argument("--file", dest="only", action="append", help="print only this file (e.g. servers.conf; repeatable)")
    add_endpoint_arguments(p)


def add_endpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Which endpoints the data plane may send to and what one namespace may cost (the gateway's
    and `render`'s, one set of flags)."""
    p.add_argument("--namespace-match-budget", type=int, metavar="N",
                   help="route matches (each counted once per hostname) the HTTPRoutes of one namespace may ask for; "
                        "over it the namespace's newest routes are not served and say so (Accepted=False, "
                        "NamespaceBudgetExceeded); default: no budget")
    p.add_argument("--allow-unmanaged-endpointslices", action="store_true",
                   help="use every EndpointSlice labelled with a Service's name, not only those the EndpointSlice "
                        "controller manages (label endpointslice.kubernetes.io/managed-by: "
                        "endpointslice-controller.k8s.io): whoever may write EndpointSlices then chooses where the "
                        "gateway connects")
    p.add_argument("--allow-loopback-endpoints", action="store_true",
                   help="use loopback endpoint addresses (127.0.0.0/8, ::1), for backends on this machine (tests, "
                        "demos); link-local, multicast, unspecified and the gateway's own addresses are never used")


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_paths(args.filename)
        analysis = analyse(loaded.objects, loaded.origins, kind_checks=policyconf.kind_checks(), by_target=True)
        config = DataPlaneConfig(controller_name=None if args.controller_name == "*" else args.controller_name,
                                 address_pool=args.address_pool,
                                 allow_unmanaged_endpointslices=args.allow_unmanaged_endpointslices,
                                 allow_loopback_endpoints=args.allow_loopback_endpoints,
                                 namespace_budget=args.namespace_match_budget)
        dataplane = build_dataplane(analysis, config)
        files = render(dataplane)
    except (LoadError, DataPlaneError, ValueError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    over = [f"HTTPRoute {r.namespace}/{r.name} is not served ({reason}): {message}"
            for r, (reason, message) in sorted(dataplane.over_budget.items(), key=lambda kv: kv[0].sort_key())]
    for line in not_served(dataplane, args.controller_name) + over + dataplane.warnings:
        print(f"Warning: {line}", file=sys.stderr)
    out = sys.stdout
    shown = [k for k in files if not args.only or k in args.only]
    if args.only and not shown:
        print(f"Error: no file {', '.join(args.only)} in the rendered configuration (files: {', '.join(files)})", file=sys.stderr)
        return 1
    for path in shown:
        out.write(f"# ==== {path} ====\n")
        if path.startswith("secrets/"):
            out.write(f"# certificate and private key of Secret {path[8:-4].replace('_', '/', 1)} "
                      f"({len(files[path])} bytes; not printed)\n\n")
            continue
        text = files[path].decode("utf-8", errors="replace")
        out.write(text if text.endswith("\n") else text + "\n")
        out.write("\n")
    return 0


def not_served(dataplane: DataPlane, controller_name: str) -> list[str]:
    """Why each Gateway, and each listener of a served Gateway, has no server block (what the
    gateway's status says of it), one line each, in Gateway order: a user who sees nothing
    rendered for a Gateway learns why without running the controller."""
    out = []
    for gw, why in sorted(dataplane.unserved.items(), key=lambda kv: kv[0].sort_key()):
        hint = " (--controller-name '*' renders every GatewayClass)" if "belongs to controller" in why else ""
        out.append(f"Gateway {gw.namespace}/{gw.name} is not served: {why}{hint}")
    for ref, fact in sorted(dataplane.listeners.items(), key=lambda kv: kv[0].sort_key()):
        if not fact.programmed and ref.object not in dataplane.unserved:
            out.append(f"Gateway {ref.namespace}/{ref.name} listener {ref.section} is not served ({fact.reason}): {fact.message}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=f"{program_name()} render", formatter_class=HelpFormatter, description="Print the NGINX "
               "configuration the gateway would run for manifests on disk (no cluster needed).", epilog="""examples:
  gwpolicy render -f examples/quickstart            # every file, one after the other, under a header
  gwpolicy render -f manifests/ -f -                # files and stdin, as the other commands take them
""")
    add_arguments(p)
    return run(p.parse_args(argv))
