"""Putting manifests into a sandbox: CRDs made up for kinds that have none (a playground needs no
CRD authoring), namespaces created for objects that name one, and server-side apply of everything."""

from __future__ import annotations

from typing import Any, Iterable, TextIO

import httpx2 as httpx  # the HTTP client lightkube is built on

from gwpolicy.engine.kinds import KNOWN_KINDS, plural_of, split_api_version
from gwpolicy.engine.model import well_shaped as model_well_shaped
from gwpolicy.sandbox.resources import BUILTINS


def well_shaped(objects: Iterable[dict[str, Any]], origins: Iterable[str], warn: TextIO) -> list[dict[str, Any]]:
    """The objects the engine could analyse (`gwpolicy.engine.shapes`); each other one is named on `warn` and left out,
    so that a sandbox never holds what the controller analysing it would have to skip."""
    warnings: list[str] = []
    kept, _ = model_well_shaped(list(objects), origins, None, warnings)
    for w in warnings:
        print(f"Warning: {w}", file=warn)
    return kept


def synthesize_crds(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A permissive CRD (any fields, a status subresource) for every kind that has neither a CRD nor a built-in."""
    objects = list(objects)
    have = {(o["spec"]["group"], o["spec"]["names"]["kind"]) for o in objects
            if o.get("kind") == "CustomResourceDefinition" and isinstance(o.get("spec"), dict)}
    have |= {(r.group, r.kind) for r in BUILTINS}
    have |= {(g, k) for k, (g, *_rest) in KNOWN_KINDS.items() if g == ""}
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for o in objects:
        group, version = split_api_version(o.get("apiVersion", ""))
        kind = o.get("kind", "")
        if (group, kind) in have or not group:
            continue
        entry = seen.setdefault((group, kind), {"versions": set(), "namespaced": False})
        entry["versions"].add(version)
        entry["namespaced"] = entry["namespaced"] or bool((o.get("metadata") or {}).get("namespace"))
    crds = []
    for (group, kind), info in sorted(seen.items()):
        plural = plural_of(kind)
        versions = sorted(info["versions"])
        crds.append({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "metadata": {"name": f"{plural}.{group}"},
                     "spec": {"group": group, "scope": "Namespaced" if info["namespaced"] else "Cluster",
                              "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": kind + "List"},
                              "versions": [{"name": v, "served": True, "storage": i == 0, "subresources": {"status": {}},
                                            "schema": {"openAPIV3Schema": {"type": "object",
                                                                            "x-kubernetes-preserve-unknown-fields": True}}}
                                           for i, v in enumerate(versions)]}})
    return crds


def ordered(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """CRDs, then namespaces (one for every namespace named), then everything else."""
    objects = list(objects)
    crds = [o for o in objects if o.get("kind") == "CustomResourceDefinition"]
    crds += synthesize_crds(objects)
    names = {(o.get("metadata") or {}).get("namespace") for o in objects} - {None, ""}
    nss = [o for o in objects if o.get("kind") == "Namespace" and o.get("apiVersion") == "v1"]
    have = {o["metadata"]["name"] for o in nss}
    # (None was taken out of `names` above, which mypy does not follow through a set difference)
    nss += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in sorted(names - have)]  # type: ignore[type-var]
    rest = [o for o in objects if o.get("kind") not in ("CustomResourceDefinition",) and not
            (o.get("kind") == "Namespace" and o.get("apiVersion") == "v1")]
    return crds + nss + rest


def url_of(base: str, obj: dict[str, Any], plural: str, namespaced: bool) -> str:
    group, version = split_api_version(obj["apiVersion"])
    prefix = f"{base}/api/{version}" if not group else f"{base}/apis/{group}/{version}"
    ns = (obj.get("metadata") or {}).get("namespace") or "default"
    name = obj["metadata"]["name"]
    return f"{prefix}/namespaces/{ns}/{plural}/{name}" if namespaced else f"{prefix}/{plural}/{name}"


def apply_all(base: str, objects: Iterable[dict[str, Any]], manager: str = "gwpolicy-seed",
              **client: Any) -> list[dict[str, Any]]:
    """Server-side apply every object (in `ordered` order), keeping any status it carries; `client`:
    what the HTTP client needs to reach the sandbox (server.client_options: its token and CA)."""
    out = []
    with httpx.Client(timeout=30, **client) as http:
        resources: dict[tuple[str, str], tuple[str, bool]] = {}

        def lookup(group: str, version: str, kind: str) -> tuple[str, bool]:
            if (group, kind) not in resources:
                url = f"{base}/api/{version}" if not group else f"{base}/apis/{group}/{version}"
                for r in http.get(url).json().get("resources", []):
                    if "/" not in r["name"]:
                        resources[(group, r["kind"])] = (r["name"], r["namespaced"])
            return resources[(group, kind)]

        for obj in ordered(objects):
            group, version = split_api_version(obj["apiVersion"])
            plural, namespaced = lookup(group, version, obj["kind"])
            url = url_of(base, obj, plural, namespaced)
            body = {k: v for k, v in obj.items() if k != "status"}
            r = http.patch(url, params={"fieldManager": manager, "force": "true"}, json=body,
                           headers={"Content-Type": "application/apply-patch+yaml"})
            r.raise_for_status()
            created = r.json()
            if obj.get("status"):
                st = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                      "metadata": {"name": obj["metadata"]["name"]}, "status": obj["status"]}
                r = http.patch(url + "/status", params={"fieldManager": manager, "force": "true"}, json=st,
                               headers={"Content-Type": "application/apply-patch+yaml"})
                r.raise_for_status()
                created = r.json()
            out.append(created)
    return out
