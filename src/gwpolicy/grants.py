"""ReferenceGrant checks: cross-namespace backendRefs (S1.3) and policy targets (S3.4)."""

from __future__ import annotations

from gwpolicy.model import ObjectIndex
from gwpolicy.refs import GATEWAY_GROUP


class ReferenceGrants:
    """Grants indexed by the namespace they live in (the namespace of what they allow access to)."""

    def __init__(self, index: ObjectIndex) -> None:
        self._by_ns: dict[str, list[tuple[list[dict], list[dict]]]] = {}
        for group in (GATEWAY_GROUP,):
            for obj in index.of_kind(group, "ReferenceGrant"):
                spec = obj.spec if isinstance(obj.spec, dict) else {}
                frm = [f for f in spec.get("from") or [] if isinstance(f, dict)]
                to = [t for t in spec.get("to") or [] if isinstance(t, dict)]
                self._by_ns.setdefault(obj.namespace or "", []).append((frm, to))

    def allows(self, from_group: str, from_kind: str, from_ns: str,
               to_group: str, to_kind: str, to_ns: str, to_name: str) -> bool:
        """True when a grant in `to_ns` lets `from_*` refer to the named object."""
        for frm, to in self._by_ns.get(to_ns, ()):
            if not any((f.get("group") or "") == from_group and f.get("kind") == from_kind
                       and f.get("namespace") == from_ns for f in frm):
                continue
            if any((t.get("group") or "") == to_group and t.get("kind") == to_kind
                   and (not t.get("name") or t.get("name") == to_name) for t in to):
                return True
        return False
