"""`release` cuts the path nodes of an analysis that in-place edits changed, not only of a fresh one:
after every kind of edit (each builds and prunes nodes of its own), and after the first status,
dropping the released analysis leaves no cyclic garbage (frozen, it would never be freed)."""

from __future__ import annotations

import orjson
import pytest

from gwpolicy.bench.controller_inproc import EDITS, write_status
from gwpolicy.bench.generate import write_yaml
from gwpolicy.controller.model import ClusterModel
from gwpolicy.load import load_paths
from test_controller_release import _cyclic_garbage_of_dropping


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> list[dict]:
    path = tmp_path_factory.mktemp("release") / "c.yaml"
    write_yaml(60, str(path))
    return [orjson.loads(orjson.dumps(o, default=str)) for o in load_paths([str(path)]).objects]


@pytest.mark.parametrize("upto", range(1, len(EDITS) + 1), ids=[name for name, _ in EDITS])
def test_an_analysis_edited_in_place_is_released_whole(objects, upto: int) -> None:
    m = ClusterModel("gwpolicy.io/policy-controller")
    for raw in objects:
        m.event("ADDED", orjson.loads(orjson.dumps(raw)))
    first = m.reconcile()
    for _, make in EDITS[:upto]:
        for etype, raw in make(m.objects):
            m.event(etype, raw)
        m.reconcile()
    assert m.reconciles == 1  # every edit in place
    write_status(m, first)
    assert _cyclic_garbage_of_dropping(m, cut=True) == 0
