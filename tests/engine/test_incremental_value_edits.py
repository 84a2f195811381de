"""Edits that change only a policy's values (the level's entry keeps its contributions, given the
new leaves in place, and every summary below stands) give what a full analysis gives, one after
another: no result computed from the old values may be found again, not by a later edit of
another object, nor by a path that comes back."""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import cluster
from gen import settings as settings_strategy
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.inplace.apply import apply_change, policy_ref
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import effective_list, encode, status_list
from helpers import NOW, assert_lists_unchanged, path_lists


def canonical(a):
    items = sorted(encode(i, "json") for i in effective_list(a)["items"])
    status = sorted(encode(i, "json") for i in status_list(a)["items"])
    affected = {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds.items()} for o, kinds in a.affected.items()}
    return items, status, affected


def other_values(value: Any) -> Any:
    """The same shape with every leaf changed."""
    if isinstance(value, dict):
        return {k: other_values(v) for k, v in value.items()}
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return 1 - value if value in (0, 1) else value + 1
    if isinstance(value, str):
        return "2s" if value == "1s" else "1s"
    if isinstance(value, list):
        return [{"x": "y", "y": "x"}.get(v, v) for v in value] or ["x"]
    return 0 if value is None else value


def _key(o: dict[str, Any]) -> tuple[str, str, str, str]:
    m = o["metadata"]
    return (o["apiVersion"], o["kind"], m.get("namespace") or "", m["name"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster(), st.randoms(use_true_random=False), st.lists(settings_strategy, min_size=4, max_size=4))
def test_value_edits_then_other_edits_equal_a_full_analysis(objs, rnd: random.Random, new_settings) -> None:
    a = analyse(copy.deepcopy(objs), now=NOW)
    current = {_key(o): copy.deepcopy(o) for o in objs}
    gone: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for step in range(6):
        policies = [o for o in current.values() if o["kind"].endswith("Policy") and policy_ref(a, o) in a.policies]
        routes = [o for o in current.values() if o["kind"] == "HTTPRoute"]
        action = rnd.choice(["values", "values", "values", "settings", "route-out", "route-back"])
        if action == "route-back" and gone:
            k = rnd.choice(sorted(gone))
            old, new = gone[k], gone.pop(k)
        elif action == "route-out" and routes:
            victim = rnd.choice(routes)
            old, new = victim, None
            gone[_key(victim)] = victim
        elif policies:
            victim = rnd.choice(policies)
            new = copy.deepcopy(victim)
            spec = new["spec"]
            stanzas = [s for s in ("defaults", "overrides") if isinstance(spec.get(s), dict)] or [None]
            stanza = rnd.choice(stanzas)
            if action == "values":  # the same leaves, other values: the in-place refresh
                if stanza is None:
                    new["spec"] = {k: (v if k in ("targetRefs", "targetRef") else other_values(v)) for k, v in spec.items()}
                else:
                    spec[stanza] = other_values(spec[stanza])
            elif stanza is None:
                new["spec"] = {k: v for k, v in spec.items() if k in ("targetRefs", "targetRef")} | new_settings[step % 4]
            else:
                spec[stanza] = new_settings[step % 4]
            new["metadata"]["generation"] += 1
            old = victim
        else:
            continue
        if new is None:
            del current[_key(old)]
        else:
            current[_key(new)] = new
        held = path_lists(a)
        result = apply_change(a, copy.deepcopy(old), copy.deepcopy(new) if new is not None else None)
        assert_lists_unchanged(held)
        if result is None:
            a = analyse(copy.deepcopy(list(current.values())), now=NOW)  # what the controller does
            continue
        full = analyse(copy.deepcopy(list(current.values())), now=NOW)
        assert canonical(a) == canonical(full), (step, action)
