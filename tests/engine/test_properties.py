"""Properties of the whole engine: input order never matters, output is deterministic, status is idempotent."""

from __future__ import annotations

import copy
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import cluster
from gwpolicy.analysis import analyse
from gwpolicy.output import effective_list, encode, status_list
from helpers import NOW

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outputs(objs):
    a = analyse(copy.deepcopy(objs), now=NOW)
    return encode(effective_list(a), "json"), encode(status_list(a), "json")


@SETTINGS
@given(cluster(), st.randoms(use_true_random=False))
def test_shuffling_the_input_never_changes_the_output(objs, rnd: random.Random) -> None:
    before = outputs(objs)
    shuffled = list(objs)
    rnd.shuffle(shuffled)
    assert outputs(shuffled) == before


@SETTINGS
@given(cluster())
def test_output_is_deterministic(objs) -> None:
    assert outputs(objs) == outputs(objs)


@SETTINGS
@given(cluster())
def test_status_over_objects_that_carry_it_changes_nothing(objs) -> None:
    a = analyse(copy.deepcopy(objs), now=NOW)
    written = {ch.object: ch for ch in a.status_changes()}
    after = []
    for ref, obj in ((o.ref, o) for o in a.index.by_ref.values()):
        raw = copy.deepcopy(obj.raw)
        ch = written.get(ref)
        if ch is not None:
            raw["status"] = ch.status
            raw["metadata"]["annotations"] = ch.annotations
        after.append(raw)
    again = analyse(after, now="2030-01-01T00:00:00Z")  # a later clock: nothing may move
    assert again.status_changes() == []
    assert encode(effective_list(again), "json") == encode(effective_list(a), "json")
