"""The sandbox's watch window (the last 100k events, for watches from a resourceVersion) holds the
objects as stored, not a copy of each: at 50k routes the copies made the sandbox's peak RSS 2.2 GB.
A write keeps what it did not change shared with the version before it. And every event still
replays the version it was made of, whatever is written after it."""

from __future__ import annotations

import copy
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.sandbox.store import ApiFailure, Store
from helpers import WIDGET_CRD


def _store(window: int = 100_000) -> tuple[Store, Any]:
    store = Store(window=window)
    store.create(store.registry.by_plural[("apiextensions.k8s.io", "customresourcedefinitions")], "", WIDGET_CRD)
    return store, store.registry.by_plural[("example.io", "widgets")]


def _widget(i: int) -> dict[str, Any]:
    """A widget with a spec of some size (as a route's rules are)."""
    return {"apiVersion": "example.io/v1", "kind": "Widget", "metadata": {"name": f"w-{i}", "labels": {"app": "a"}},
            "spec": {"rules": [{"path": f"/p/{i}/{j}", "backends": [{"name": f"svc-{j}", "port": 8080 + j}]}
                               for j in range(20)]}}


def _status(n: int) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "Accepted", "status": "True", "observedGeneration": n}]}}


def _fill(store: Store, widgets: Any, n: int) -> None:
    for i in range(n):
        store.create(widgets, "default", _widget(i), manager="seed")
    for i in range(n):
        store.patch(widgets, "default", f"w-{i}", "application/merge-patch+json", _status(1), subresource="status",
                    manager="gwpolicy")


def test_the_window_holds_the_stored_objects_and_a_write_shares_what_it_did_not_change():
    store, widgets = _store()
    _fill(store, widgets, 3)
    key = ("example.io", "widgets", "default", "w-0")
    live = store.objects[key]
    added, modified = [e for e in store.events if e.plural == "widgets" and e.obj["metadata"]["name"] == "w-0"]
    assert modified.obj is live, "the event of the last write is the stored object itself, not a copy"
    assert added.obj is not live and "status" not in added.obj, "the version before is kept as it was"
    assert added.obj["spec"] is live["spec"], "the status write shares the spec it did not change"
    assert added.obj["metadata"]["labels"] is live["metadata"]["labels"]


def test_the_window_costs_a_fraction_of_the_objects_it_holds():
    """Memory after creating and status-writing 300 widgets, with the window and without one."""
    def used(window: int) -> int:
        tracemalloc.start()
        store, widgets = _store(window)
        _fill(store, widgets, 300)
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(store.events) == min(window, 4 + 1 + 600)  # 4 namespaces, the CRD, 300 ADDED, 300 MODIFIED
        return size

    without, with_window = used(0), used(100_000)
    # with a copy per event the window was more than twice the store (each version whole, twice)
    assert with_window < 1.3 * without, f"the window adds {with_window / without - 1:.0%} to the store"


_OPS = st.lists(st.tuples(st.sampled_from(["create", "spec", "status", "labels", "delete"]), st.integers(0, 2),
                          st.integers(0, 3)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(_OPS)
def test_every_event_in_the_window_replays_the_version_it_was_made_of(ops: list[tuple[str, int, int]]) -> None:
    store, widgets = _store()
    made: dict[int, bytes] = {}  # resourceVersion -> the object as its event had it, when it was made
    store.listeners.append(lambda ev: made.__setitem__(ev.rv, orjson.dumps(ev.obj)))
    start = store.rv
    for op, i, v in ops:
        name = f"w-{i}"
        try:
            if op == "create":
                store.create(widgets, "default", _widget(i), manager="seed")
            elif op == "spec":  # values Python's == takes as one: the store must not
                spec = {"rules": [{"path": "/", "weight": [1, True, 1.0, "1"][v]}]}
                out = store.patch(widgets, "default", name, "application/merge-patch+json", {"spec": spec}, manager="seed")
                assert orjson.dumps(out["spec"]) == orjson.dumps(spec)
            elif op == "status":
                store.patch(widgets, "default", name, "application/merge-patch+json", _status(v),
                            subresource="status", manager="gwpolicy")
            elif op == "labels":
                store.patch(widgets, "default", name, "application/merge-patch+json",
                            {"metadata": {"labels": {"app": str(v)}}}, manager="other")
            else:
                store.delete(widgets, "default", name)
        except ApiFailure as exc:
            assert exc.code in (404, 409)  # not there, or there already
        got = store.get(widgets, "default", name) if (widgets.group, widgets.plural, "default", name) in store.objects else None
        if got is not None:  # what a client is handed is its own: changing it changes nothing stored
            got["spec"]["rules"].clear()
            got["metadata"]["labels"] = {"changed": "by the client"}
    replay = store.events_since(start)
    assert [e.rv for e in replay] == sorted(rv for rv in made if rv > start)
    for e in replay:
        assert orjson.dumps(e.obj) == made[e.rv], f"the event at {e.rv} changed after it was made"
        assert e.obj["metadata"]["resourceVersion"] == str(e.rv)


def test_past_the_window_a_watch_is_gone_and_within_it_resumes():
    store, widgets = _store(window=10)
    first = store.rv
    for i in range(12):
        store.create(widgets, "default", copy.deepcopy(_widget(i)))
    with pytest.raises(ApiFailure) as gone:
        store.events_since(first)
    assert gone.value.code == 410
    recent = store.events_since(store.rv - 3)
    assert [e.obj["metadata"]["name"] for e in recent] == ["w-9", "w-10", "w-11"]


def test_a_value_python_takes_as_equal_is_still_a_change():
    """1, true and 1.0 are three JSON values: a write from one to another is stored as written (a
    shared part of the version before must never stand in for it)."""
    store, widgets = _store()
    store.create(widgets, "default", _widget(0), manager="seed")
    for weight in (1, True, 1.0, 1):
        spec = {"rules": [{"path": "/", "weight": weight}]}
        out = store.patch(widgets, "default", "w-0", "application/merge-patch+json", {"spec": spec}, manager="seed")
        assert orjson.dumps(out["spec"]) == orjson.dumps(spec)
        assert orjson.dumps(store.get(widgets, "default", "w-0")["spec"]) == orjson.dumps(spec)
