"""(edge) What the long-running commands share (`controller`, `gateway`, `webhook`, `mesh`), defined once so
that they cannot drift apart: the cluster they talk to (`--kubeconfig`, `--context`), who they are
(`--identity`), where their own HTTP endpoints listen (`--listen`), and where their leader-election
Lease lives (`--lease-namespace`). Each command adds these flags with `add_arguments` and resolves
them with the functions below; only the port of its endpoints is its own.

- Cluster: `--kubeconfig FILE`, else `$KUBECONFIG` (several files merged as kubectl merges them),
  else the pod's service account, else `~/.kube/config`; `--context` picks a context of it.
- Listen: loopback outside a cluster (a laptop's gateway is not reachable from the network, and its
  endpoints never meet a Gateway's address), every interface in a pod (probes and scrapes come
  from outside it).
- Lease namespace: `--lease-namespace`, else `$POD_NAMESPACE`, else the namespace of the
  kubeconfig context (in a pod, its service account's), else `default`.
- Identity: `$POD_NAME` (set by deploy/'s Deployments), else `HOSTNAME-PID`.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, field
from typing import Any

#: the port of each command's /healthz, /readyz and /metrics: one each, so that all three can run
#: side by side on one machine
PORTS = {"controller": 8080, "gateway": 8081, "webhook": 8082, "mesh": 8083}
#: the webhook's HTTPS port for admission reviews (/validate), apart from its health port above
ADMISSION_PORT = 9443


def in_cluster() -> bool:
    """Whether we run in a pod (the kubelet sets this variable in every container)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def host() -> str:
    """The address a command's own servers bind by default: loopback outside a cluster, every
    interface in a pod."""
    return "0.0.0.0" if in_cluster() else "127.0.0.1"


def listen(command: str) -> str:
    """The default HOST:PORT of `command`'s health and metrics endpoints."""
    return f"{host()}:{PORTS[command]}"


def identity() -> str:
    """This replica's name in a Lease."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def lease_namespace(explicit: str | None, context_namespace: str | None) -> str:
    """Where the Lease lives: the flag, the pod's namespace, the kubeconfig context's, `default`."""
    return explicit or os.environ.get("POD_NAMESPACE") or context_namespace or "default"


def kube_config(kubeconfig: str | None, context: str | None) -> Any:
    """The lightkube KubeConfig to connect with (the order in the module docstring); ConfigError
    (serve.run prints it as one line) when there is none."""
    from lightkube import KubeConfig
    from lightkube.core.exceptions import ConfigError

    from gwpolicy.kube.kubeconfig import load_kubeconfig

    config: Any
    if kubeconfig:
        config = KubeConfig.from_file(kubeconfig)
    elif os.environ.get("KUBECONFIG"):
        merged = load_kubeconfig(None)
        if not merged.get("contexts"):
            raise ConfigError(f"no readable kubeconfig in KUBECONFIG={os.environ['KUBECONFIG']}")
        config = KubeConfig.from_dict(merged)
    else:
        try:
            config = KubeConfig.from_service_account()
        except ConfigError:
            config = KubeConfig.from_file(os.path.expanduser("~/.kube/config"))
    if context:
        config = config.get(context_name=context)
    return config


@dataclass
class ProcessOptions:
    """The options every long-running command has (its own dataclass adds the rest)."""

    kubeconfig: str | None = None
    context: str | None = None
    listen: str | None = None  # None: listen(command)
    lease_namespace: str | None = None  # None: lease_namespace(None, the context's namespace)
    lease_duration: float = 15.0
    identity: str = field(default_factory=identity)
    leader_election: bool = True


def add_arguments(p: argparse.ArgumentParser, command: str, *, listen_flag: str = "--listen",
                  leader_election: bool = True) -> None:
    """The shared flags, with the same names, defaults and help in every command."""
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then the pod's service account, "
                   "then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: its current context)")
    p.add_argument(listen_flag, dest="listen", metavar="HOST:PORT", default=None,
                   help=f"address of /healthz, /readyz, /metrics (default: 127.0.0.1:{PORTS[command]}, "
                        f"in a pod 0.0.0.0:{PORTS[command]}; port 0: any free port)")
    if leader_election:
        p.add_argument("--lease-namespace", default=None, help="namespace of the leader-election Lease (default: "
                       "$POD_NAMESPACE, else the kubeconfig context's namespace, in a pod its own)")
        p.add_argument("--lease-duration", type=float, default=15.0,
                       help="seconds a leader holds the lease without renewing")
        p.add_argument("--identity", default=None, help="this replica's name in the Lease (default: $POD_NAME, "
                       "else HOSTNAME-PID)")
        p.add_argument("--no-leader-election", action="store_true",
                       help="write without holding a lease (one replica only)")
    p.add_argument("-v", "--verbose", action="store_true")


def options(a: argparse.Namespace) -> dict[str, Any]:
    """The ProcessOptions fields from parsed `add_arguments` flags, as keyword arguments."""
    out: dict[str, Any] = {"kubeconfig": a.kubeconfig, "context": a.context, "listen": a.listen}
    if hasattr(a, "lease_namespace"):
        out.update(lease_namespace=a.lease_namespace, lease_duration=a.lease_duration,
                   leader_election=not a.no_leader_election)
        if a.identity:
            out["identity"] = a.identity
    else:
        out["leader_election"] = False
    return out
