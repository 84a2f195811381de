"""EffectivePolicy objects (GEP-713, "PolicyBinding resource"): next to each object some policy affects,
an object of kind `EffectivePolicy` (group gwpolicy.io) with the object's name, holding the policies
that affect it and, per policy kind, the resultant settings, usable as that kind's settings.

Pure: from an analysis, the object each place should hold. Where an object is kept (docs/webhook.md):
- a namespaced object: its namespace, its name; two kinds of objects sharing a name in a namespace
  (a Service and an HTTPRoute `cake`) share one EffectivePolicy, with one entry under `spec.targets`
  each, and both as owners (it goes when the last of them goes);
- a Namespace: in that namespace, with the Namespace's name;
- another cluster-scoped object (a GatewayClass): in the controller's namespace, with its name.
"""

from __future__ import annotations

from typing import Any

import orjson

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.effective import EffectivePolicy
from gwpolicy.engine.refs import CORE_GROUP, Ref

GROUP, VERSION, KIND, PLURAL = "gwpolicy.io", "v1alpha1", "EffectivePolicy", "effectivepolicies"
API_VERSION = f"{GROUP}/{VERSION}"
CONTROLLER_ANNOTATION = "gwpolicy.io/controller"
Key = tuple[str, str]  # namespace, name


def placement(ref: Ref, home: str) -> Key:
    """Where the EffectivePolicy of an object lives."""
    if ref.namespace is not None:
        return ref.namespace, ref.name
    if ref.group == CORE_GROUP and ref.kind == "Namespace":
        return ref.name, ref.name
    return home, ref.name


def owners_by_key(a: Analysis, home: str) -> dict[Key, list[Ref]]:
    """Every object some policy affects, by the place of its EffectivePolicy."""
    out: dict[Key, list[Ref]] = {}
    for owner in a.affected:
        out.setdefault(placement(owner, home), []).append(owner)
    for refs in out.values():
        refs.sort(key=Ref.sort_key)
    return out


def _targets(a: Analysis, owner: Ref) -> list[Ref]:
    return [owner] + [owner.with_section(s) for s in a.topology.sections.get(owner, [])]


def fingerprint(a: Analysis, owners: list[Ref]) -> tuple:
    """Changes whenever the document would: the results (shared, immutable) on every path."""
    return tuple((t, id(ep.path), id(ep.result)) for owner in owners for t in _targets(a, owner)
                 for ep in a.effective_of(t))


def _ref_json(ref: Ref) -> dict[str, Any]:
    out: dict[str, Any] = {"group": ref.group, "kind": ref.kind}
    if ref.namespace is not None:
        out["namespace"] = ref.namespace
    out["name"] = ref.name
    return out


def _effective_entries(eps: list[EffectivePolicy], section: str | None) -> list[dict[str, Any]]:
    """Per policy kind, one entry per distinct result, naming the paths that have it."""
    groups: dict[tuple, dict[str, Any]] = {}
    for ep in eps:
        key = (ep.kind.key, id(ep.result))
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = {"policyKind": {"group": ep.kind.group, "kind": ep.kind.kind}}
            if section is not None:
                entry["sectionName"] = section
            entry["paths"] = []
            entry["spec"] = ep.result.spec
            entry["policies"] = sorted((_ref_json(p) for p in ep.result.policies),
                                       key=lambda j: (j["kind"], j.get("namespace", ""), j["name"]))
        entry["paths"].append(str(ep.path))
    # the same result reached by another route of the tree is the same result: merge equal specs
    merged: dict[tuple, dict[str, Any]] = {}
    for (kk, _), entry in groups.items():
        k = (kk, entry.get("sectionName"), orjson.dumps(entry["spec"], option=orjson.OPT_SORT_KEYS))
        if k in merged:
            merged[k]["paths"].extend(entry["paths"])
        else:
            merged[k] = entry
    out = list(merged.values())
    for e in out:
        e["paths"].sort()
    out.sort(key=lambda e: (e["policyKind"]["kind"], e["policyKind"]["group"], e["paths"][0]))
    return out


def document(a: Analysis, key: Key, owners: list[Ref], controller: str) -> dict[str, Any]:
    """The EffectivePolicy the place `key` should hold for these owners."""
    targets: list[dict[str, Any]] = []
    all_policies: set[Ref] = set()
    owner_refs = []
    for owner in owners:
        effective: list[dict[str, Any]] = []
        policies: set[Ref] = set()
        for t in _targets(a, owner):
            eps = a.effective_of(t)
            effective.extend(_effective_entries(eps, t.section))
            for ep in eps:
                policies |= ep.result.policies
        if not effective:
            continue
        all_policies |= policies
        targets.append({"targetRef": _ref_json(owner),
                        "policies": sorted((_ref_json(p) for p in policies),
                                           key=lambda j: (j["kind"], j.get("namespace", ""), j["name"])),
                        "effectivePolicies": effective})
        obj = a.index.by_ref.get(owner)
        uid = ((obj.raw.get("metadata") or {}).get("uid") if obj is not None else None)
        if uid:  # (so obj is not None)
            owner_refs.append({"apiVersion": obj.raw.get("apiVersion", "v1"), "kind": owner.kind,  # type: ignore[union-attr]
                               "name": owner.name, "uid": uid, "blockOwnerDeletion": False})
    ns, name = key
    meta: dict[str, Any] = {"name": name, "namespace": ns,
                            "labels": {"app.kubernetes.io/managed-by": "gwpolicy"},
                            "annotations": {CONTROLLER_ANNOTATION: controller}}
    if owner_refs:
        meta["ownerReferences"] = owner_refs
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta,
            "spec": {"controllerName": controller,
                     "targetSummary": ", ".join(f"{t['targetRef']['kind']}/{t['targetRef']['name']}" for t in targets),
                     "policyCount": len(all_policies), "targets": targets}}


def kept_for(a: Analysis, obj: Ref) -> tuple[Key, str] | None:
    """The EffectivePolicy among the analysed objects (live mode reads them) that holds `obj`, and the
    controller that keeps it."""
    homes = {placement(obj, "")} if obj.namespace is not None or obj.kind == "Namespace" else \
        {placement(obj, ns) for ns in a.index.namespaces}
    for key in sorted(homes):
        found = a.index.by_ref.get(Ref(GROUP, KIND, key[0], key[1]))
        spec = found.raw.get("spec") if found is not None else None
        if not isinstance(spec, dict):
            continue
        refs = [t.get("targetRef") for t in spec.get("targets") or [] if isinstance(t, dict)]
        if any(isinstance(r, dict) and r.get("kind") == obj.kind and r.get("name") == obj.name for r in refs):
            return key, str(spec.get("controllerName") or "a controller")
    return None


def ours(obj: dict[str, Any], controller: str) -> bool:
    """Whether an existing EffectivePolicy belongs to this controller (others' are never touched)."""
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    return ann.get(CONTROLLER_ANNOTATION, spec.get("controllerName")) == controller


def same_content(live: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether the stored object already says what we would write (spec, owners, our markers)."""
    lm, wm = live.get("metadata") or {}, want["metadata"]
    return (live.get("spec") == want["spec"]
            and sorted((o.get("uid") for o in lm.get("ownerReferences") or [])) ==
            sorted(o["uid"] for o in wm.get("ownerReferences") or [])
            and (lm.get("annotations") or {}).get(CONTROLLER_ANNOTATION) == wm["annotations"][CONTROLLER_ANNOTATION])
