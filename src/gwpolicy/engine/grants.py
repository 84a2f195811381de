"""ReferenceGrant checks: cross-namespace backendRefs (S1.3) and policy targets (S3.4)."""

from __future__ import annotations

from typing import Any

from gwpolicy.engine.model import ObjectIndex
from gwpolicy.engine.refs import GATEWAY_GROUP


class ReferenceGrants:
    """Grants indexed by the namespace they live in (the namespace of what they allow access to),
    each `from` list as a set: a grant shared by every namespace of a cluster (hundreds of `from`
    entries) is asked once per backendRef into its namespace."""

    def __init__(self, index: ObjectIndex) -> None:
        self._by_ns: dict[str, list[tuple[frozenset[tuple[str, str, str]], list[dict]]]] = {}
        for group in (GATEWAY_GROUP,):
            for obj in index.of_kind(group, "ReferenceGrant"):
                spec = obj.spec if isinstance(obj.spec, dict) else {}
                frm = frozenset(grant_from_key(f) for f in spec.get("from") or [] if isinstance(f, dict)) - {None}
                to = [t for t in spec.get("to") or [] if isinstance(t, dict)]
                self._by_ns.setdefault(obj.namespace or "", []).append((frm, to))  # type: ignore[arg-type]

    def allows(self, from_group: str, from_kind: str, from_ns: str,
               to_group: str, to_kind: str, to_ns: str, to_name: str) -> bool:
        """True when a grant in `to_ns` lets `from_*` refer to the named object."""
        key = (from_group, from_kind, from_ns)
        for frm, to in self._by_ns.get(to_ns, ()):
            if key not in frm:
                continue
            if any((t.get("group") or "") == to_group and t.get("kind") == to_kind
                   and (not t.get("name") or t.get("name") == to_name) for t in to):
                return True
        return False


def grant_from_key(f: dict[str, Any]) -> tuple[str, str, str] | None:
    """A `from` entry as (group, kind, namespace); None when it can match nothing (a value that is
    not a string never equals the referrer's group, kind or namespace)."""
    key = (f.get("group") or "", f.get("kind"), f.get("namespace"))
    return key if all(isinstance(v, str) for v in key) else None  # type: ignore[return-value]
