"""Location order: which locations a virtual host needs and, per location, its match rules in the
spec's precedence (Exact, RegularExpression, PathPrefix; a longer prefix falls back to a shorter
one whose conditions hold), as NGINX's location tree and the match maps will walk them."""

from __future__ import annotations

import bisect

from gwpolicy.gateway import pathregex
from gwpolicy.gateway.dataplane.model import REGULAR_EXPRESSION, Location, MatchRule, VirtualHost


def segment_prefix(prefix: str, path: str) -> bool:
    """PathPrefix semantics: `/abc` matches `/abc`, `/abc/`, `/abc/d`, not `/abcd`."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def place_locations(vh: VirtualHost, rules: list[MatchRule]) -> None:
    """Every location of a virtual host and its candidate rules, in precedence order.

    One location per Exact path and one per PathPrefix (render matches `<path>/` so a prefix
    location is segment-wise). A request reaching the /v2 prefix location has a path under /v2, so
    every PathPrefix rule whose prefix is a segment prefix of /v2 matches it too: those are its
    fallbacks when the /v2 rules' header, query or method conditions fail (the spec's precedence is
    across all rules).

    A RegularExpression rule is a candidate of every location a path it matches can reach (see
    _regex_reach), ranked after the location's Exact rules and before its PathPrefix ones, its
    path a condition NGINX checks at run time; with such rules a virtual host has the `/` prefix
    location, so a path no Exact or PathPrefix rule covers still reaches them.
    """
    keys: set[tuple[bool, str]] = set()
    regex = False
    for r in rules:
        if r.action.path_type == REGULAR_EXPRESSION:
            regex = True
        else:
            keys.add((r.action.path_type == "Exact", r.action.path_value))
    reach: dict[tuple[bool, str], set[int]] = {}
    if regex:
        keys.add((False, "/"))
        reach = _regex_reach([r for r in rules if r.action.path_type == REGULAR_EXPRESSION], keys)
    ordered = sorted(rules, key=MatchRule.precedence)
    for exact, path in sorted(keys):
        if regex:
            got = reach.get((exact, path), _NO_IDS)
            cands = [r for r in ordered if (exact and r.action.path_type == "Exact" and r.action.path_value == path)
                     or (r.action.path_type == REGULAR_EXPRESSION and id(r) in got)
                     or (r.action.path_type == "PathPrefix" and segment_prefix(r.action.path_value, path))]
        else:  # the common case, kept as cheap as before regex paths
            cands = [r for r in ordered if (exact and r.action.path_type == "Exact" and r.action.path_value == path)
                     or (r.action.path_type == "PathPrefix" and segment_prefix(r.action.path_value, path))]
        cut: list[MatchRule] = []
        for c in cands:
            cut.append(c)
            if c.unconditional:
                break
        if cut:  # only the `/` added for regex rules can be left without one (all theirs are elsewhere)
            vh.locations[(exact, path)] = Location(exact, path, cut)


_NO_IDS: set[int] = set()


def _regex_reach(regex_rules: list[MatchRule], keys: set[tuple[bool, str]]) -> dict[tuple[bool, str], set[int]]:
    """Location -> the regex rules (ids) that can match a path NGINX sends there. Every path an
    expression matches starts with its literal prefix L (pathregex.literal_prefix), so it can reach
    an Exact location P only if P starts with L, and a prefix location Q only if Q starts with L
    or Q is L's "home": the longest prefix location with L under it segment-wise (`/api` for
    `/api/v1/`, else `/`), which takes every such path that no longer location takes. A prefix
    location shorter than the home never sees one: the home (or a longer one) takes them all."""
    prefixes = sorted(p for e, p in keys if not e)
    prefix_set = set(prefixes)
    exacts = sorted(p for e, p in keys if e)
    out: dict[tuple[bool, str], set[int]] = {}
    for r in regex_rules:
        literal = pathregex.literal_prefix(r.action.path_value)
        home = "/"
        for i in range(1, len(literal)):
            if literal[i] == "/" and literal[:i] in prefix_set:
                home = literal[:i]
        out.setdefault((False, home), set()).add(id(r))
        for exact, sorted_paths in ((False, prefixes), (True, exacts)):
            for p in _starting_with(sorted_paths, literal):
                out.setdefault((exact, p), set()).add(id(r))
    return out


def _starting_with(sorted_paths: list[str], literal: str) -> list[str]:
    """The paths of a sorted list that start with `literal` (a contiguous run of it)."""
    lo = bisect.bisect_left(sorted_paths, literal)
    hi = lo
    while hi < len(sorted_paths) and sorted_paths[hi].startswith(literal):
        hi += 1
    return sorted_paths[lo:hi]
