"""`gwpolicy controller`: run the controller until SIGTERM/SIGINT."""

from __future__ import annotations

import gc

from gwpolicy.controller.app import Controller, Options
from gwpolicy.engine.status import DEFAULT_CONTROLLER
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.args import HelpFormatter, Parser, program_name
from gwpolicy.kube.endpoints import ListenError

EXAMPLES = """examples:
  # against the sandbox: leader election on a Lease in the context's namespace, health on 127.0.0.1:8080
  gwpolicy sandbox --port 8001 --kubeconfig-out /tmp/sb.kubeconfig -f examples/parable &
  gwpolicy controller --kubeconfig /tmp/sb.kubeconfig

  # in a cluster (deploy/): two replicas, leader election on a Lease in the pod's namespace,
  # health and metrics on 0.0.0.0:8080
  gwpolicy controller

  # also keep an EffectivePolicy next to each affected object (deploy/50-effectivepolicy-crd.yaml)
  gwpolicy controller --effective-policy-objects
"""


def parse(argv: list[str]) -> Options:
    p = Parser(prog=f"{program_name()} controller", formatter_class=HelpFormatter, epilog=EXAMPLES, description="Keep policy status (GEP-713, GEP-1364) "
                                "and breadcrumbs true in a cluster, for any policy kind.")
    defaults.add_arguments(p, "controller")
    p.add_argument("--controller-name", default=DEFAULT_CONTROLLER, help="controllerName of our status entries")
    p.add_argument("--namespace", help="write status only to objects in this namespace (reads stay cluster-wide: "
                   "the analysis needs every Gateway, policy and Namespace); cluster-scoped objects are never written")
    p.add_argument("--breadcrumb-qps", type=float, default=50.0, help="breadcrumb writes per second at most")
    p.add_argument("--write-workers", type=int, default=4, help="writes in flight at most")
    p.add_argument("--effective-policy-objects", action="store_true",
                   help="keep an EffectivePolicy (gwpolicy.io) next to every object some policy affects "
                        "(needs deploy/50-effectivepolicy-crd.yaml)")
    p.add_argument("--effective-policy-namespace", help="namespace of the EffectivePolicies of cluster-scoped "
                   "objects other than Namespaces (default: the lease namespace)")
    p.add_argument("--resync", type=float, default=0.0, help="seconds between full relists of every kind, to catch "
                   "what a watch missed (default 0: never; a kube-apiserver's watches can be trusted)")
    a = p.parse_args(argv)
    serve.setup_logging(a.verbose)
    return Options(**defaults.options(a), controller_name=a.controller_name, namespace=a.namespace,
                   breadcrumb_qps=a.breadcrumb_qps, write_workers=a.write_workers,
                   effective_policy_objects=a.effective_policy_objects,
                   effective_policy_namespace=a.effective_policy_namespace, resync=a.resync)


def main(argv: list[str]) -> int:
    opts = parse(argv)
    gc.freeze()  # what start-up allocated lives for the whole run
    c = Controller(opts)
    return serve.run(c, lambda: f"gwpolicy controller {opts.identity} serving health and metrics on port {c.port}",
                     (ListenError,))
