"""One API server for a live test, of either kind: `gwpolicy sandbox` (SandboxProcess) or a real
kube-apiserver (KubeApiServer), with the same face: `kind`, `url`, `kubeconfig` and `http` (the
admin's), `kubectl()`, `apply()`, `identity(sa)` (the kubeconfig a process of deploy/ runs with),
`refused(sa)`, `close()`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import yaml

from gwpolicy.load import load_paths
from gwpolicy.sandbox.seed import synthesize_crds
from kube_apiserver import DEPLOY, KubeApiServer
from sandbox_proc import GW_CRDS, SandboxProcess

LiveServer = SandboxProcess | KubeApiServer


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


def start(kind: str, tmp: Path, *sandbox_flags: str, files: Iterable[Path | str] = (),
          keep_creation_timestamp: bool = True) -> LiveServer:
    """A server of `kind` ("sandbox" or "kube") holding `files`. The sandbox keeps the files'
    creationTimestamps (with `keep_creation_timestamp`); a real API server stamps its own."""
    files = list(files)
    if kind == "sandbox":
        flags = list(sandbox_flags) + (["--keep-creation-timestamp"] if keep_creation_timestamp else [])
        for f in files:
            flags += ["-f", str(f)]
        return SandboxProcess(tmp, *flags)
    server = KubeApiServer(tmp / "kube")
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
