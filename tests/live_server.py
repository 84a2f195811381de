"""One API server for a live test, of either kind: `gwpolicy sandbox` (SandboxProcess) or a real
kube-apiserver (KubeApiServer), with the same face: `kind`, `url`, `kubeconfig` and `http` (the
admin's), `kubectl()`, `apply()`, `identity(sa)` (the kubeconfig a process of deploy/ runs with),
`refused(sa)`, `close()`."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any, Iterable

import yaml

import kube_apiserver
from gwpolicy.files.load import load_paths
from gwpolicy.sandbox.seed import synthesize_crds
from kube_apiserver import DEPLOY, KubeApiServer
from sandbox_proc import GW_CRDS, SandboxProcess

LiveServer = SandboxProcess | KubeApiServer


def require(kind: str) -> str:
    """`kind`, when it can run here; else the test is skipped with the reason (and fails under CI,
    which must run both servers)."""
    import os

    import pytest

    import kube_apiserver

    if kind == "kube":
        why = kube_apiserver.missing()
        if why:
            if os.environ.get("CI") or os.environ.get("GWPOLICY_REQUIRE_KUBE"):
                pytest.fail(why)
            pytest.skip(why)
    return kind


def gateway_api_crds(channel: Path = GW_CRDS) -> list[dict[str, Any]]:
    """The Gateway API CRDs of `channel` (../shared/gateway-api/crd/standard by default)."""
    out: list[dict[str, Any]] = []
    for f in sorted(channel.glob("gateway.networking*.yaml")):
        out += [d for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    return out


def policykind_crd() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "10-policykind-crd.yaml").read_text()) if d]


def real_objects(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """What `gwpolicy sandbox -f` would load, for a real API server: the files' objects, the Gateway API
    CRDs, the PolicyKind CRD, and a permissive CRD for any other kind that has none (the sandbox
    makes those up too)."""
    objs = gateway_api_crds() + policykind_crd() + load_paths([str(p) for p in paths]).objects
    return synthesize_crds(objs) + objs


class _Warm:
    """A cluster made ready ahead: a real API server with the Gateway API CRDs (standard channel), the
    PolicyKind and EffectivePolicy CRDs and deploy/'s RBAC (its ClusterRoles aggregated), as a cluster
    gwpolicy is installed on has them. Making one takes 8-10 s on 2 cores, most of it the CRDs; the
    next is made while a test uses the last, so a test waits for none of it."""

    def __init__(self) -> None:
        self.ready: KubeApiServer | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    @staticmethod
    def make() -> KubeApiServer:
        server = KubeApiServer(kube_apiserver.cluster_folder())
        try:
            server.apply(gateway_api_crds() + policykind_crd())
            server.install_deploy("50-effectivepolicy-crd.yaml")
        except BaseException:
            server.close()
            raise
        return server

    def _fill(self) -> None:
        try:
            self.ready = self.make()
        except BaseException as exc:  # noqa: BLE001 - handed to the next take()
            self.error = exc

    def take(self) -> KubeApiServer:
        if self.thread is not None:
            self.thread.join()
        server, self.ready, self.error = self.ready, None, None
        if server is None:
            server = self.make()
        self.thread = threading.Thread(target=self._fill, name="warm-cluster", daemon=True)
        self.thread.start()
        return server

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.ready is not None:
            self.ready.close()
            self.ready = None


WARM = _Warm()
kube_apiserver.BEFORE_SHUTDOWN.append(WARM.close)


def fresh_kube() -> KubeApiServer:
    """An empty cluster (but for what `_Warm` installs) on a real API server of its own."""
    return WARM.take()


def start(kind: str, tmp: Path, *sandbox_flags: str, files: Iterable[Path | str] = (),
          keep_creation_timestamp: bool = True, loopback_endpoints: bool = True) -> LiveServer:
    """A server of `kind` ("sandbox" or "kube") holding `files`. The sandbox keeps the files'
    creationTimestamps (with `keep_creation_timestamp`); a real API server stamps its own. The
    sandbox takes loopback addresses in EndpointSlices unless `loopback_endpoints` is False (a
    real API server never does)."""
    files = list(files)
    if kind == "sandbox":
        flags = list(sandbox_flags) + (["--keep-creation-timestamp"] if keep_creation_timestamp else [])
        for f in files:
            flags += ["-f", str(f)]
        return SandboxProcess(tmp, *flags, loopback_endpoints=loopback_endpoints)
    server = fresh_kube()
    try:
        if files:
            server.apply(real_objects(files))
    except BaseException:
        server.close()
        raise
    return server


def objects_of(server: LiveServer, kinds: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every object of these (apiVersion, kind)s, cluster-wide, each with its apiVersion and kind."""
    from kube_apiserver import Resources

    res = Resources(server.http)
    out = []
    for api_version, kind in kinds:
        plural, namespaced = res.lookup(api_version, kind)
        path = res.path({"apiVersion": api_version, "kind": kind})
        if namespaced:
            path = path.rsplit("/namespaces/", 1)[0] + "/" + plural
        for o in server.http.get(path).json().get("items") or []:
            o = copy.deepcopy(o)
            o["apiVersion"], o["kind"] = api_version, kind
            out.append(o)
    return out
