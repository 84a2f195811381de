"""The cluster as the controller knows it: the objects its informers hold and the analysis of them.

Changes that can alter the analysis (spec, labels, new or deleted objects) mark it stale; changes to
status or to our annotation only (among them the echo of our own writes) do not: those objects are
only compared again with what they should carry. What an object should carry is always computed
from its newest copy, so other controllers' entries and transition times are kept.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from itertools import chain, repeat
from typing import Any

from gwpolicy.controller.store import kept, share_unchanged
from gwpolicy.engine.analysis import Analysis, analyse, utc_now
from gwpolicy.engine.inplace.apply import apply_change, prepare
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.model import Obj
from gwpolicy.engine.refs import Ref, sort_by_ref
from gwpolicy.engine.shapes import CheckedSpecs, remembering
from gwpolicy.engine.status import ANNOTATION, breadcrumbs, policy_status

_VOLATILE_META = ("resourceVersion", "managedFields", "generation")
FREEZE_EVERY = 5000  # events


def _same_version(old: dict[str, Any], raw: dict[str, Any]) -> bool:
    """Both copies carry one resourceVersion (the API server gives every write of an object a new
    one, so they hold the same object); False when either has none."""
    meta = raw.get("metadata")
    rv = meta.get("resourceVersion") if type(meta) is dict else None
    return type(rv) is str and rv != "" and old.get("metadata", {}).get("resourceVersion") == rv


def _essence(raw: dict[str, Any]) -> dict[str, Any]:
    """What the analysis reads of an object: everything but status, bookkeeping and our annotation."""
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k not in _VOLATILE_META}
    ann = meta.pop("annotations", None)
    if isinstance(ann, dict):
        ann = {k: v for k, v in ann.items() if k != ANNOTATION}
        if ann:  # no annotations and only ours are the same thing
            meta["annotations"] = ann
    return {"spec": raw.get("spec"), "metadata": meta, "rest": {k: v for k, v in raw.items()
                                                                 if k not in ("spec", "metadata", "status")}}


def release(a: Analysis) -> None:
    """Cut the cycles of an analysis no longer used, so that dropping it frees it without the cyclic
    collector: each path node's children (a child keeps its parent, so a path held elsewhere still
    reads its levels). A test checks that nothing cyclic is left of it."""
    topo = a.topology
    idx = getattr(topo, "_nodes_at", None)
    if idx is not None:
        # every node below the root, by level (`prepare` builds it, in-place updates keep it so):
        # cut in one loop in C rather than a walk in Python (535k nodes at 50k routes)
        deque(map(setattr, chain.from_iterable(idx.values()), repeat("children"), repeat(None)), maxlen=0)
        topo.root.children = None
        return
    stack = [topo.root]
    while stack:
        n = stack.pop()
        if n.children:
            stack.extend(n.children.values())
            n.children = None


class ClusterModel:
    def __init__(self, controller: str, default_namespace: str = "default") -> None:
        self.controller = controller
        self.default_namespace = default_namespace
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.analysis: Analysis | None = None
        self.stale = True
        self.touched: set[Ref] = set()
        self.last_reconcile_seconds = 0.0
        self.last_update_seconds = 0.0
        self.reconciles = 0
        self.incremental_updates = 0
        self.incremental = True
        self._events_since_freeze = 0
        self._checked = CheckedSpecs()

    @staticmethod
    def key(raw: dict[str, Any]) -> tuple[str, str, str, str]:
        group, _ = split_api_version(raw.get("apiVersion", ""))
        meta = raw.get("metadata") or {}
        return (group, raw.get("kind", ""), meta.get("namespace") or "", meta.get("name") or "")

    @staticmethod
    def ref_of(raw: dict[str, Any]) -> Ref:
        g, k, ns, n = ClusterModel.key(raw)
        return Ref(g, k, ns or None, n)

    def event(self, etype: str, raw: dict[str, Any]) -> None:
        """An informer's event. What is kept of the object is its compact form (`store.kept`): the
        analysis, the in-place updates and the status writes all read that form."""
        self._events_since_freeze += 1
        if self._events_since_freeze >= FREEZE_EVERY:
            # The objects events bring live until the next event about the same object: keep the
            # cyclic collector off them too, or its full collections pause the controller for
            # seconds once the echoes of a first status (one per object) have come in.
            self._events_since_freeze = 0
            gc.collect(1)  # young cyclic garbage first, so that none is frozen
            gc.freeze()
        key = self.key(raw)
        if etype == "DELETED":
            gone = self.objects.pop(key, None)
            if gone is not None:
                self._checked.forget(gone)
                self._changed(gone, None)  # the last copy known (an informer's relist reports only the key)
            return
        old = self.objects.get(key)
        if old is not None and _same_version(old, raw):
            # the echo of our own write (already taken from the write's answer), or a relist: one
            # resourceVersion is one content, so nothing is copied or compared (at 50k routes the
            # echoes of a first status are 121k objects, about 55 us each to keep and compare)
            return
        new = kept(raw)
        if old is not None:
            if old == new:
                return  # the same content under another version (an update that changed nothing)
            share_unchanged(old, new)
        # its shape judged once, now, not by every full analysis (shapes.CheckedSpecs.check): at 50k
        # routes carrying status that was 2 s of each, and the events arrive spread out
        self._checked.check(new, old)
        self.objects[key] = new
        if old is not None and _essence(old) == _essence(new):
            self.touched.add(self.ref_of(new))  # status or our annotation only: compare it again
        else:
            self._changed(new, new)

    def _changed(self, raw: dict[str, Any], new: dict[str, Any] | None) -> None:
        """A change the analysis must see: applied in place (`inplace.apply.apply_change`: policies,
        routes, Gateways, Services, Namespaces, ReferenceGrants), else by a new analysis."""
        if self.stale or self.analysis is None or not self.incremental:
            self.stale = True
            return
        t = time.perf_counter()
        check = apply_change(self.analysis, raw, new)
        if check is None:
            self.stale = True
            return
        self.touched |= check
        self.incremental_updates += 1
        self.last_update_seconds = time.perf_counter() - t

    def current(self, ref: Ref) -> dict[str, Any] | None:
        return self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))

    def reconcile(self) -> list[Ref]:
        """Bring the analysis up to date; the objects whose status or annotations must be checked."""
        if not self.stale:
            out, self.touched = list(self.touched), set()
            sort_by_ref(out)
            return out
        t = time.perf_counter()
        raws = list(self.objects.values())
        # The analysis lives until the next full one: keep the cyclic collector off it (gc.freeze),
        # and off the millions of objects an analysis allocates while it runs. The previous one is
        # let go by reference counting: its only cycles (a path node and its children) are cut
        # first, so nothing is unfrozen and no full collection walks the objects (2 s at 50k
        # routes once they carry status).
        old, self.analysis = self.analysis, None
        if old is not None:
            release(old)
        del old
        gc.disable()
        try:
            with remembering(self._checked):  # each object was judged as it came in: not again
                self.analysis = analyse(raws, default_namespace=self.default_namespace, controller=self.controller,
                                        by_target=True)
            self.stale = False
            self.touched = set()
            changes = [ch.object for ch in self.analysis.status_changes()]  # builds `affected` too
            self.analysis._status = self.analysis._status_by_ref = None  # dropped now, not during the next change
            if self.incremental:  # pay once, now, what the first change would otherwise pay
                prepare(self.analysis)
            gc.freeze()
        finally:
            gc.enable()
        self.last_reconcile_seconds = time.perf_counter() - t
        self.reconciles += 1
        return changes

    def desired(self, ref: Ref) -> tuple[dict[str, Any], dict[str, str]] | None:
        """The status and annotations the object should carry now, from its newest copy."""
        a = self.analysis
        raw = self.current(ref)
        if a is None or raw is None:
            return None
        known = a.index.by_ref.get(ref)
        if known is None:
            return None
        obj = Obj(raw, known.ref, known.version, known.origin)
        now = utc_now()
        if ref in a.policies:
            policy = a.policies[ref]
            fresh = type(policy)(obj, policy.kind, policy.cls, policy.stanzas, policy.target_refs,
                                 policy.target_field, policy.invalid)
            status = policy_status(fresh, a.outcomes[ref], a.topology, self.controller, now)
            ann = dict(raw["metadata"].get("annotations") or {})
            return status, ann
        if ref in a.topology.paths:
            kinds = [kk[1] for kk in a.affected.get(ref, {})]
            return breadcrumbs(obj, kinds, a.topology, self.controller, now)
        return None
