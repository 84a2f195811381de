"""The controller's fast path for policy changes gives exactly what a full analysis gives."""

from __future__ import annotations

import copy
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import cluster
from gen import settings as settings_strategy
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.inplace.apply import policy_ref
from gwpolicy.engine.inplace.policies import update_policy
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import effective_list, encode, status_list
from helpers import NOW


def snapshot(a):
    return (encode(effective_list(a), "json"), encode(status_list(a), "json"),
            {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds.items()} for o, kinds in a.affected.items()})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster(), st.randoms(use_true_random=False), settings_strategy)
def test_a_policy_change_in_place_equals_a_full_analysis(objs, rnd: random.Random, new_settings) -> None:
    a = analyse(copy.deepcopy(objs), now=NOW)
    policies = [o for o in objs if o["kind"].endswith("Policy") and policy_ref(a, o) in a.policies]
    if not policies:
        return
    victim = rnd.choice(policies)
    action = rnd.choice(["edit", "retarget", "delete", "add"])
    changed = copy.deepcopy(victim)
    if action == "edit":
        stanza = next((k for k in ("defaults", "overrides") if k in changed["spec"]), None)
        if stanza:
            changed["spec"][stanza] = new_settings
        else:
            changed["spec"] = {k: v for k, v in changed["spec"].items() if k in ("targetRefs", "targetRef")} | new_settings
    elif action == "retarget":
        other = rnd.choice(policies)
        changed["spec"]["targetRefs"] = copy.deepcopy(other["spec"].get("targetRefs") or [other["spec"].get("targetRef")])
    elif action == "add":
        changed["metadata"]["name"] += "-twin"
        changed["metadata"]["creationTimestamp"] = "2023-12-31T00:00:00Z"  # older than all: it wins conflicts
    after = [o for o in objs if o is not victim] + ([] if action == "delete" else [changed])
    if action == "add":
        after.append(victim)
    ref = policy_ref(a, changed)
    result = update_policy(a, ref, None if action == "delete" else copy.deepcopy(changed))
    if result is None:
        return  # the fast path declined: the controller runs a full analysis
    full = analyse(copy.deepcopy(after), now=NOW)
    assert snapshot(a) == snapshot(full)
    # what the fast path says to check covers every object whose status changes
    after_changes = {ch.object: ch for ch in full.status_changes()}
    base = {ch.object: ch for ch in analyse(copy.deepcopy(objs), now=NOW).status_changes()}
    moved = {r for r in set(after_changes) | set(base)
             if (after_changes.get(r) and base.get(r) and after_changes[r].status != base[r].status)
             or (r in after_changes) != (r in base)}
    assert moved <= result | {ref}, moved - result


def canonical(a):
    """Effective items and status as sets: after a route change the order of a backend's paths may
    differ from a fresh analysis (paths are listed as routes reach them), nothing else may."""
    items = sorted(encode(i, "json") for i in effective_list(a)["items"])
    status = sorted(encode(i, "json") for i in status_list(a)["items"])
    affected = {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds.items()} for o, kinds in a.affected.items()}
    return items, status, affected


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster(), st.randoms(use_true_random=False))
def test_a_route_change_in_place_equals_a_full_analysis(objs, rnd: random.Random) -> None:
    from gwpolicy.engine.inplace.hierarchy import update_route

    routes = [o for o in objs if o["kind"] == "HTTPRoute"]
    if not routes:
        return
    a = analyse(copy.deepcopy(objs), now=NOW)
    victim = rnd.choice(routes)
    action = rnd.choice(["hostnames", "parents", "rules", "delete", "add"])
    changed = copy.deepcopy(victim)
    spec = changed["spec"]
    if action == "hostnames":
        spec["hostnames"] = [rnd.choice(["a.example.com", "other.org", "x.example.com"])]
    elif action == "parents":
        spec["parentRefs"] = spec["parentRefs"][:1] if len(spec["parentRefs"]) > 1 else \
            copy.deepcopy(rnd.choice(routes)["spec"]["parentRefs"])
    elif action == "rules":
        spec["rules"] = copy.deepcopy(rnd.choice(routes)["spec"]["rules"])
    elif action == "add":
        changed["metadata"]["name"] += "-new"
    after = [o for o in objs if o is not victim] + ([] if action == "delete" else [changed])
    if action == "add":
        after.append(victim)
    ref = Ref("gateway.networking.k8s.io", "HTTPRoute", changed["metadata"]["namespace"], changed["metadata"]["name"])
    result = update_route(a, ref, None if action == "delete" else copy.deepcopy(changed))
    if result is None:
        return
    full = analyse(copy.deepcopy(after), now=NOW)
    assert canonical(a) == canonical(full)
