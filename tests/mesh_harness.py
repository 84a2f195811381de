"""A mesh on this machine: an API server, one network namespace per client namespace (tests/netns.py)
with `gwpolicy mesh` serving every Service's cluster IP there, and echo backends in the root
namespace on the fabric, published through EndpointSlices.

Each client namespace's host reaches the API server through a relay on its own loopback, binds the
Services' cluster IPs on its loopback (only its own proxy serves them to it) and reaches the
backends' addresses on the fabric; nothing else. `send` makes one HTTP request from inside a
client's host. The XMesh CRD (the experimental channel's) and an XMesh of the mesh controller are
there from the start (`xmesh=None`: neither; or another XMesh), as a mesh needs them to apply
routes and policies. `get_object` reads an object for the status checks of tests/gwconformance.py."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

import kube_apiserver
import live_server
import netns
from gateway_proc import request, wait_until
from gwpolicy.engine.mesh import MESH_CONTROLLER
from gwpolicy.gateway.echo import EchoServer
from sandbox_proc import BIN

#: the sandbox's Service range in these tests (kube-apiserver's is tests/kube_apiserver.py's SERVICE_RANGE)
SERVICE_CIDR = str(netns.CLUSTER_IPS)
XMESH_CRD = kube_apiserver.DEPLOY / "gateway-api" / "experimental" / "gateway.networking.x-k8s.io_xmeshes.yaml"
XMESH = {"apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XMesh", "metadata": {"name": "gwpolicy"},
         "spec": {"controllerName": MESH_CONTROLLER}}


def namespace(name: str) -> dict[str, Any]:
    """A Namespace object to apply."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def policy_crds(*files: str) -> list[dict[str, Any]]:
    """deploy/'s CRDs in `files` as they are (their targetRef declares the `namespace` the mesh rule needs)."""
    return [d for f in files for d in yaml.safe_load_all((kube_apiserver.DEPLOY / f).read_text())
            if d and d.get("kind") == "CustomResourceDefinition"]


def pod_name(prefix: str) -> str:
    """`<prefix>-<replicaset hash>-<pod hash>`, as a Deployment names its pods."""
    return f"{prefix}-{secrets.token_hex(4)[:9]}-{secrets.token_hex(3)[:5]}"


class Mesh:
    def __init__(self, kind: str, tmp: Path, clients: list[str], xmesh: dict[str, Any] | None = XMESH) -> None:
        self.kind, self.tmp = kind, tmp
        self.fabric = netns.Fabric()
        self.server: Any = None
        self.closers: list[Any] = []
        self.echoes: list[EchoServer] = []
        self.proxies: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.bound: set[str] = set()
        self.orphans: list[Path] = []  # state directories of killed proxies, whose NGINX serves on
        self.backends: dict[str, EchoServer] = {}  # by pod name prefix
        try:
            self.server = live_server.start(kind, tmp, "--service-cidr", SERVICE_CIDR)
            address = "127.0.0.1" if kind == "sandbox" else kube_apiserver.ADDRESS
            port = int(self.server.url.rsplit(":", 1)[1])
            self.hosts = {}
            for ns in clients:
                host = self.fabric.add_host(ns)
                self.hosts[ns] = host
                self.closers.append(netns.forward_into(host, port, address=address))
            if xmesh:
                self.server.kubectl("apply", "--server-side", "-f", str(XMESH_CRD))
                self.server.kubectl("wait", "--for=condition=Established", "crd/xmeshes.gateway.networking.x-k8s.io",
                                    "--timeout=30s")
                self.apply([xmesh])
        except BaseException:
            self.close()
            raise

    # -- objects
    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.server.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(objects))

    def delete(self, objects: list[dict[str, Any]]) -> None:
        self.server.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(objects))

    def get(self, resource: str, ns: str, name: str) -> dict[str, Any]:
        return json.loads(self.server.kubectl("get", resource, name, "-n", ns, "-o", "json").stdout)

    def get_object(self, kind: str, ns: str | None, name: str) -> dict[str, Any] | None:
        """An HTTPRoute or the XMesh as the server holds it, None when there is none."""
        paths = {"HTTPRoute": "/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/{name}",
                 "XMesh": "/apis/gateway.networking.x-k8s.io/v1alpha1/xmeshes/{name}"}
        r = self.server.http.get(paths[kind].format(ns=ns, name=name))
        return r.json() if r.status_code == 200 else None  # type: ignore[no-any-return]

    def cluster_ip(self, ns: str, name: str) -> str:
        return str(self.get("service", ns, name)["spec"]["clusterIP"])

    def backend(self, namespace: str, prefix: str, port: int = 0, delays: dict[str, float] | None = None) -> EchoServer:
        """An echo server in the root namespace on an address of its own on the fabric."""
        echo = EchoServer(pod_name(prefix), namespace, address=self.fabric.add_root_address(), port=port,
                          delays=delays).start()
        self.echoes.append(echo)
        self.backends[prefix] = echo
        return echo

    def publish(self, namespace: str, service: str, echoes: list[EchoServer], ports: dict[str, int],
                name: str | None = None) -> dict[str, Any]:
        """An EndpointSlice of `service` with the echoes' addresses and the named ports (name -> port)."""
        slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": name or f"{service}-harness", "namespace": namespace,
                               "labels": {"kubernetes.io/service-name": service}},
                  "addressType": "IPv4", "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports.items()],
                  "endpoints": [{"addresses": [e.address], "conditions": {"ready": True}} for e in echoes]}
        self.apply([slice_])
        return slice_

    def bind_cluster_ips(self) -> None:
        """Every Service's cluster IP on every client host's loopback (127.0.0.0/8 is there already)."""
        listed = json.loads(self.server.kubectl("get", "services", "-A", "-o", "json").stdout)["items"]
        for s in listed:
            ip = (s.get("spec") or {}).get("clusterIP")
            if not ip or ip == "None" or ip in self.bound:
                continue
            self.bound.add(ip)
            if ipaddress.ip_address(ip).is_loopback:
                continue
            for host in self.hosts.values():
                host.add_address(ip)

    # -- proxies
    def start_proxies(self, *flags: str, kubeconfig: Path | None = None) -> None:
        """A proxy per client namespace in its host, with `flags` besides the harness's own."""
        self.bind_cluster_ips()
        for ns in self.hosts:
            self.start_proxy(ns, *flags, kubeconfig=kubeconfig)

    def start_proxy(self, ns: str, *flags: str, kubeconfig: Path | None = None) -> subprocess.Popen:
        log = self.tmp / f"mesh-{ns}.log"
        self.logs[ns] = log
        with open(log, "ab") as out:
            self.proxies[ns] = self.hosts[ns].popen(
                [str(BIN / "gwpolicy"), "mesh", "--namespace", ns,
                 "--kubeconfig", str(kubeconfig or self.server.kubeconfig),
                 "--state-dir", str(self.tmp / f"mesh-{ns}"), "--allow-unmanaged-endpointslices",
                 "--worker-processes", "1", "--debounce", "0.1", "--listen", "127.0.0.1:0", "--identity", f"mesh-{ns}",
                 *flags],
                stdout=out, stderr=subprocess.STDOUT)
        return self.proxies[ns]

    def kill(self, ns: str) -> None:
        """Kill namespace `ns`'s proxy with SIGKILL, as a crash: it gives up nothing (its Lease expires).
        Its NGINX, which outlives it, is stopped at `close`."""
        self.proxies[ns].kill()
        self.proxies[ns].wait(10)
        self.orphans.append(self.tmp / f"mesh-{ns}")

    def log(self, ns: str) -> str:
        try:
            return self.logs[ns].read_text()[-3000:]
        except OSError:
            return ""

    def send(self, client: str, address: str, port: int, path: str, *, method: str = "GET", host: str | None = None,
             headers: dict[str, str] | None = None, timeout: float = 10.0,
             body: bytes | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
        """One request from inside client namespace `client`'s host."""
        with self.hosts[client].enter():
            return request(address, port, path, method=method, host=host, headers=headers, timeout=timeout, body=body)

    def wait_serving(self, client: str, address: str, port: int, timeout: float = 60.0) -> None:
        def answered() -> bool:
            try:
                return self.send(client, address, port, "/", timeout=5)[0] < 500
            except OSError:
                return False
        wait_until(answered, timeout, what=f"the proxy of {client} serving {address}:{port}: {self.log(client)}")

    def close(self) -> None:
        for p in self.proxies.values():
            if p.poll() is None:
                p.terminate()
        for p in self.proxies.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for state in self.orphans:
            try:
                os.kill(int(json.loads((state / "nginx.json").read_text())["pid"]), signal.SIGTERM)
            except (OSError, ValueError, KeyError):
                pass
        for c in self.closers:
            c()
        for e in self.echoes:
            e.stop()
        if self.server is not None:
            self.server.close()
        self.fabric.close()
