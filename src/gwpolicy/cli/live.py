"""Live mode (edge): read the objects gwpolicy analyses from a cluster, read-only."""

from __future__ import annotations

from typing import Any

from lightkube import ApiError, Client

from gwpolicy.kube import client as kube
from gwpolicy.kube.defaults import kube_config


def read_cluster(kubeconfig: str | None, context: str | None) -> list[dict[str, Any]]:
    """CRDs, PolicyKinds, Gateway API objects, policies, XMeshes, Namespaces and Services of the cluster."""
    try:  # the cluster the long-running commands would talk to (kube/defaults.py)
        client = Client(config=kube_config(kubeconfig, context), field_manager="gwpolicy-cli")
    except Exception as exc:  # noqa: BLE001 - any config problem is the user's to fix
        raise RuntimeError(f"cannot reach a cluster: {exc}; give manifests with -f, or a kubeconfig") from exc
    out: list[dict[str, Any]] = []

    def read(k: kube.Kind) -> list[dict[str, Any]]:
        items = []
        for o in client.list(kube.resource_class(k), namespace="*" if k.namespaced else None):
            d = kube.to_dict(o)
            d.setdefault("apiVersion", k.api_version)
            d.setdefault("kind", k.kind)
            items.append(d)
        return items

    try:
        crds = read(kube.CRD)
        out += crds + read(kube.BUILTIN[0]) + read(kube.BUILTIN[1])
        if any(((c.get("metadata") or {}).get("name")) == "effectivepolicies.gwpolicy.io" for c in crds):
            from gwpolicy.controller.effectivepolicies import KIND as EFFECTIVE_POLICY
            out += read(EFFECTIVE_POLICY)  # describe shows them; the analysis reads nothing of them
        pk_kind = next((kube.kind_of_crd(c, set()) for c in crds
                        if (c.get("spec") or {}).get("group") == "gwpolicy.io"
                        and ((c.get("spec") or {}).get("names") or {}).get("kind") == "PolicyKind"), None)
        policykinds = read(pk_kind) if pk_kind else []
        out += policykinds
        named = {((p.get("spec") or {}).get("group", ""), (p.get("spec") or {}).get("kind", "")) for p in policykinds}
        for crd in crds:
            # and the XMesh, which turns the mesh on (docs/mesh.md), as the processes watch it
            k = kube.kind_of_crd(crd, named) or kube.mesh_kind_of_crd(crd)
            if k is not None and k != pk_kind:
                out += read(k)
    except ApiError as exc:
        raise RuntimeError(f"the cluster said: {exc.status.message}") from exc
    except Exception as exc:  # noqa: BLE001 - connection problems: say so, no traceback
        raise RuntimeError(f"cannot read the cluster: {exc}") from exc
    finally:
        client.close() if hasattr(client, "close") else None
    return out
