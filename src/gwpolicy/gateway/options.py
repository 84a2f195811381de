"""`gwpolicy gateway`'s options and flags: the shared ones of every long-running command
(kube/defaults.py) and the gateway's own."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gwpolicy.gateway.facts import GATEWAY_CONTROLLER
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.args import HelpFormatter, Parser, program_name
from gwpolicy.kube.defaults import ProcessOptions


@dataclass
class GatewayOptions(ProcessOptions):
    """The gateway's options: the shared ones (kube/defaults.py) and its own."""

    controller_name: str = GATEWAY_CONTROLLER
    field_manager: str = "gwpolicy-gateway"
    lease_name: str = "gwpolicy-gateway"
    state_dir: str | None = None  # NGINX's files; a fresh temporary directory when None
    address_pool: str | None = None  # loopback network Gateways get their addresses from
    port_offset: int = 0
    debounce: float = 0.05
    write_workers: int = 4
    nginx: str = "/usr/sbin/nginx"
    worker_processes: int | str = "auto"  # NGINX's worker_processes: "auto" (one per core) or a number
    allow_unmanaged_endpointslices: bool = False  # see DataPlaneConfig
    allow_loopback_endpoints: bool = False
    namespace_budget: int | None = None  # DataPlaneConfig.namespace_budget
    pod_addresses: bool = False  # serve every Gateway on all the pod's addresses (see --pod-addresses)
    nginx_sidecar: bool = False  # NGINX is run by `gwpolicy nginx-sidecar` on the state directory



DESCRIPTION = """Run the gateway: a controller for the GatewayClasses whose spec.controllerName is
ours, with NGINX as its data plane. It watches GatewayClass, Gateway, HTTPRoute, ReferenceGrant,
BackendTLSPolicy, Service, EndpointSlice, Secret, ConfigMap and the policy kinds; renders one NGINX
configuration from the engine's analysis; starts NGINX as a child process, validates every new
configuration before loading it and verifies that it serves; and writes GEP-1364 status
(GatewayClass, Gateway and listeners, HTTPRoute parents). Each Gateway is served on its own
loopback address (127.0.0.0/8, from --address-pool unless spec.addresses names one) and its
listeners' ports; status.addresses says where. Runs in the foreground until SIGTERM or SIGINT, then
stops NGINX gracefully; SIGUSR2 ends it and leaves NGINX serving, and so does a crash or SIGKILL: the
next gateway on the same --state-dir adopts the running NGINX without restarting it. With
--nginx-sidecar NGINX is run by `gwpolicy nginx-sidecar` on the same --state-dir, and no signal to
the gateway stops it. Ports below 1024 need root (or CAP_NET_BIND_SERVICE); without it NGINX cannot bind
them, and the Gateway's Programmed condition says so (see --port-offset)."""


def worker_processes(text: str) -> int | str:
    """`auto` or a number of NGINX worker processes (1-1024), for --worker-processes."""
    if text == "auto":
        return text
    if text.isdigit() and 1 <= int(text) <= 1024:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not auto or a number of processes from 1 to 1024")


def parse(argv: list[str]) -> GatewayOptions:
    from gwpolicy.gateway.render_cli import add_endpoint_arguments  # `render -f` takes the same flags

    p = Parser(prog=f"{program_name()} gateway", formatter_class=HelpFormatter, description=DESCRIPTION,
               epilog="""examples:
  # against the sandbox; Gateways of GatewayClasses whose controllerName is ours, leader election
  # on a Lease in the context's namespace, health and metrics on 127.0.0.1:8081
  gwpolicy sandbox --port 8001 --kubeconfig-out /tmp/sb.kubeconfig &
  gwpolicy gateway --kubeconfig /tmp/sb.kubeconfig

  # without root: serve listener port 80 on 8080
  gwpolicy gateway --kubeconfig /tmp/sb.kubeconfig --port-offset 8000
""")
    defaults.add_arguments(p, "gateway")
    p.add_argument("--controller-name", default=GATEWAY_CONTROLLER,
                   help=f"serve the GatewayClasses with this spec.controllerName (default {GATEWAY_CONTROLLER})")
    p.add_argument("--state-dir", help="directory for NGINX's configuration and logs (default: a new temporary directory)")
    p.add_argument("--address-pool", help="loopback network (CIDR) Gateways get their addresses from")
    p.add_argument("--port-offset", type=int, default=0,
                   help="add this to every listener port NGINX binds (e.g. 8000 to serve port 80 on 8080 without root)")
    p.add_argument("--debounce", type=float, default=0.05, help="seconds to gather a burst of changes into one reload")
    p.add_argument("--write-workers", type=int, default=4, help="status writes in flight at most")
    p.add_argument("--nginx", default="/usr/sbin/nginx", help="the NGINX binary (1.22 or newer, with njs)")
    p.add_argument("--worker-processes", type=worker_processes, default="auto",
                   help="NGINX worker processes: auto (one per CPU core, the default) or a number")
    p.add_argument("--pod-addresses", action="store_true",
                   help="serve every Gateway on all of the pod's addresses at its listeners' ports (NGINX listens "
                        "on 0.0.0.0), as in a cluster, instead of a loopback address of --address-pool; "
                        "status.addresses then lists the Gateway's spec.addresses, else the addresses of every "
                        "ready replica's pod (POD_IPS or POD_IP from the downward API)")
    p.add_argument("--nginx-sidecar", action="store_true",
                   help="leave running NGINX to `gwpolicy nginx-sidecar --state-dir` on the same --state-dir (a "
                        "container of its own in the pod, sharing its process namespace): the gateway writes, checks "
                        "and reloads the configuration, and adopts that NGINX, but never starts or stops it")
    add_endpoint_arguments(p)
    a = p.parse_args(argv)
    serve.setup_logging(a.verbose)
    return GatewayOptions(**defaults.options(a), controller_name=a.controller_name, state_dir=a.state_dir,
                          address_pool=a.address_pool, port_offset=a.port_offset, debounce=a.debounce,
                          write_workers=a.write_workers, nginx=a.nginx, worker_processes=a.worker_processes,
                          allow_unmanaged_endpointslices=a.allow_unmanaged_endpointslices,
                          allow_loopback_endpoints=a.allow_loopback_endpoints, namespace_budget=a.namespace_match_budget,
                          pod_addresses=a.pod_addresses, nginx_sidecar=a.nginx_sidecar)


