"""A full analysis lets the previous one go without the cyclic collector: `release` cuts its cycles,
so nothing of it is left for a collection to find (it would otherwise stay frozen, never freed)."""

from __future__ import annotations

import gc

import orjson

from gwpolicy.bench.controller_inproc import EDITS, write_status
from gwpolicy.bench.generate import write_yaml
from gwpolicy.controller.model import ClusterModel, release
from gwpolicy.load import load_paths


def _model(tmp_path) -> ClusterModel:
    path = tmp_path / "c.yaml"
    write_yaml(60, str(path))
    m = ClusterModel("gwpolicy.io/policy-controller")
    for o in load_paths([str(path)]).objects:
        m.event("ADDED", orjson.loads(orjson.dumps(o, default=str)))
    return m


def _cyclic_garbage_of_dropping(m: ClusterModel, cut: bool) -> int:
    gc.unfreeze()
    gc.collect()
    old, m.analysis = m.analysis, None
    if cut:
        release(old)
    del old
    try:
        return gc.collect()
    finally:
        gc.freeze()


def test_a_released_analysis_leaves_no_cycles_after_every_kind_of_edit(tmp_path) -> None:
    m = _model(tmp_path)
    first = m.reconcile()
    for _, make in EDITS:  # in-place changes build and cut path nodes of their own
        for etype, raw in make(m.objects):
            m.event(etype, raw)
        m.reconcile()
    write_status(m, first)
    assert m.reconciles == 1
    assert _cyclic_garbage_of_dropping(m, cut=False) > 1000  # what a full collection had to find
    m.stale = True
    m.reconcile()
    assert _cyclic_garbage_of_dropping(m, cut=True) == 0


def test_a_full_analysis_after_the_first_status_writes_nothing_new(tmp_path) -> None:
    m = _model(tmp_path)
    first = m.reconcile()
    assert write_status(m, first) == len(first) > 0
    m.stale = True
    assert m.reconcile() == []
    m.stale = True  # and again: the previous analysis was released, the new one is whole
    assert m.reconcile() == []
    assert write_status(m, first) == 0
