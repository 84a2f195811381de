"""Status lists shared by several controllers (GEP-713): for every list, each writer's update keeps the
others' entries where they are, and two writers taking turns agree after one turn each."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.controller.app import unordered
from gwpolicy.status import keep_places

CONTROLLERS = ["a.example/c", "b.example/c", "c.example/c"]
entries = st.lists(st.tuples(st.sampled_from(CONTROLLERS), st.integers(0, 4), st.integers(0, 2)), max_size=10)


def entry(t: tuple[str, int, int]) -> dict:
    controller, ancestor, value = t
    return {"controllerName": controller, "ancestorRef": {"name": f"gw-{ancestor}"}, "value": value}


def key(e: dict) -> tuple:
    return (e["controllerName"], e["ancestorRef"]["name"])


def unique(es: list[dict]) -> list[dict]:
    seen, out = set(), []
    for e in es:
        if key(e) not in seen:
            seen.add(key(e))
            out.append(e)
    return out


def update(existing: list[dict], me: str, mine: list[dict]) -> list[dict]:
    return keep_places(existing, [e for e in mine if e["controllerName"] == me],
                       lambda e: e["controllerName"] == me, key)


@given(entries, entries)
@settings(max_examples=300, deadline=None)
def test_an_update_keeps_the_others_in_place_and_sets_ours(existing_t, mine_t) -> None:
    existing = unique([entry(t) for t in existing_t])
    me = CONTROLLERS[0]
    mine = unique([entry(t) for t in mine_t if t[0] == me])
    out = update(existing, me, mine)
    assert [e for e in out if e["controllerName"] != me] == [e for e in existing if e["controllerName"] != me]
    assert sorted(map(key, (e for e in out if e["controllerName"] == me))) == sorted(map(key, mine))
    assert all(e in mine for e in out if e["controllerName"] == me)
    # ours that stay keep their position relative to everything else
    kept = [key(e) for e in existing if key(e) in set(map(key, mine))]
    assert [key(e) for e in out if key(e) in set(kept)] == kept
    assert update(out, me, mine) == out  # a second pass writes nothing


@given(entries, entries, entries)
@settings(max_examples=300, deadline=None)
def test_two_writers_taking_turns_agree_after_one_turn_each(start_t, a_t, b_t) -> None:
    a, b = CONTROLLERS[0], CONTROLLERS[1]
    status = unique([entry(t) for t in start_t])
    mine_a = unique([entry(t) for t in a_t if t[0] == a])
    mine_b = unique([entry((b,) + t[1:]) for t in b_t])
    status = update(status, a, mine_a)
    status = update(status, b, mine_b)
    # every later turn changes nothing, so neither writes again
    assert update(status, a, mine_a) == status
    assert update(status, b, mine_b) == status


@given(entries)
@settings(max_examples=200, deadline=None)
def test_the_order_of_entries_is_not_a_difference(es) -> None:
    listed = unique([entry(t) for t in es])
    assert unordered({"ancestors": listed}) == unordered({"ancestors": list(reversed(listed))})
