"""FieldMerge (S5): conflicts among policies on one target (S5.4) and the precedence ladder (S5.2).

A `Contribution` is what one stanza of the accepted policies on one level gives: leaf -> (value,
source). Contributions are immutable and shared by every path through their level, so the
ladder for a path is a sequence of contributions, and equal sequences give equal results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from gwpolicy.engine.merge.leaves import LeafPath
from gwpolicy.engine.merge.values import same
from gwpolicy.engine.refs import Ref

OVERRIDES, DIRECT, DEFAULTS, OBJECT = "overrides", "direct", "defaults", "object"


@dataclass(eq=False, slots=True)
class Contribution:
    """Leaves one level gives in one stanza; `source` is None for the target's own value."""

    stanza: str
    leaves: dict[LeafPath, tuple[Any, Ref | None]]


@dataclass(slots=True)
class Candidate:
    """One policy's leaves in one stanza on one target, before conflicts are settled."""

    policy: Ref
    stanza: str
    leaves: dict[LeafPath, Any]


def find_conflict(leaves: dict[LeafPath, Any], taken: dict[LeafPath, tuple[Any, Ref]],
                  prefixes: dict[LeafPath, Ref]) -> Ref | None:
    """The accepted policy whose leaf equals (with another value) or overlaps one of `leaves`."""
    for path, value in leaves.items():
        held = taken.get(path)
        if held is not None:
            if not same(held[0], value):
                return held[1]
            continue
        owner = prefixes.get(path)  # an accepted leaf lies below this one
        if owner is not None:
            return owner
        for i in range(1, len(path)):  # an accepted leaf lies above this one
            held = taken.get(path[:i])
            if held is not None:
                return held[1]
    return None


def settle_conflicts(policies: Sequence[tuple[Ref, list[Candidate]]]) -> tuple[dict[str, Contribution], dict[Ref, Ref]]:
    """S5.4 for one target: policies come oldest first; each is checked against those already accepted.

    Returns the contribution of each stanza and, for each rejected policy, the policy that beat it.
    """
    taken: dict[str, dict[LeafPath, tuple[Any, Ref]]] = {}
    prefixes: dict[str, dict[LeafPath, Ref]] = {}
    losers: dict[Ref, Ref] = {}
    for policy, candidates in policies:
        winner = None
        for cand in candidates:
            winner = find_conflict(cand.leaves, taken.get(cand.stanza, {}), prefixes.get(cand.stanza, {}))
            if winner is not None:
                break
        if winner is not None:
            losers[policy] = winner
            continue
        for cand in candidates:
            t = taken.setdefault(cand.stanza, {})
            pre = prefixes.setdefault(cand.stanza, {})
            for path, value in cand.leaves.items():
                if path not in t:  # equal values: the older policy stays the source (S5.6)
                    t[path] = (value, policy)
                    for i in range(1, len(path)):
                        pre.setdefault(path[:i], policy)
    contributions = {stanza: Contribution(stanza, dict(leaves)) for stanza, leaves in taken.items() if leaves}
    return contributions, losers


def ladder(contributions: Iterable[Contribution]) -> dict[LeafPath, tuple[Any, str, Ref | None]]:
    """S5.2: each leaf from the first contribution that sets it; a leaf overlapped by one taken earlier is skipped."""
    result: dict[LeafPath, tuple[Any, str, Ref | None]] = {}
    prefixes: set[LeafPath] = set()
    for contrib in contributions:
        stanza = contrib.stanza
        for path, (value, source) in contrib.leaves.items():
            if path in result or path in prefixes:
                continue
            if len(path) > 1 and any(path[:i] in result for i in range(1, len(path))):
                continue
            result[path] = (value, stanza, source)
            for i in range(1, len(path)):
                prefixes.add(path[:i])
    return result


__all__ = ["Contribution", "Candidate", "settle_conflicts", "ladder", "find_conflict",
           "OVERRIDES", "DIRECT", "DEFAULTS", "OBJECT"]
