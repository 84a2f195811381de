"""The index of path nodes by level that `prepare` reads off a full analysis' paths (rather than
walking the tree) holds exactly the tree's nodes, on random clusters, on the synthetic benchmark
cluster and the shared scenarios, and stays so through in-place changes made after it."""

from __future__ import annotations

import copy
import random

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import cluster
from gen import settings as settings_strategy
from gwpolicy.bench.generate import cluster as cluster_of
from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.inplace.apply import apply_change, prepare
from gwpolicy.engine.inplace.base import nodes_at
from gwpolicy.engine.refs import Ref
from helpers import NOW, scenario_files
from test_incremental_topology import CHANGES, canonical, draw_change, key, tree_by_level


def index_by_level(a: Analysis) -> dict[Ref, set[int]]:
    return {lv: {id(n) for n in nodes} for lv, nodes in nodes_at(a).items() if nodes}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster())
def test_the_index_prepare_builds_holds_every_node_of_the_tree(objs) -> None:
    a = analyse(copy.deepcopy(objs), now=NOW)
    prepare(a)
    assert index_by_level(a) == tree_by_level(a)


def test_the_index_on_the_synthetic_cluster_and_the_scenarios() -> None:
    clusters = [list(cluster_of(300))] + [yaml.safe_load(p.read_text())["manifests"] for p in scenario_files()]
    for objs in clusters:
        a = analyse(objs, now=NOW)
        namespaced_levels = [lv for lv in a.topology.paths if lv.namespace is not None]
        prepare(a)
        assert index_by_level(a) == tree_by_level(a)
    assert namespaced_levels  # the last cluster had objects in namespaces at all


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster(), st.randoms(use_true_random=False), settings_strategy, st.lists(st.sampled_from(CHANGES), min_size=1, max_size=4))
def test_changes_in_place_after_prepare_keep_the_index_and_equal_a_full_analysis(objs, rnd: random.Random, new_settings,
                                                                                 sequence) -> None:
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    prepare(a)  # as the controller and the gateway do, so that changes start from the index read off the paths
    for what in sequence:
        old, new = draw_change(what, state, rnd, new_settings)
        if old is None and new is None:
            continue
        raw = old if old is not None else new
        if new is None:
            del state[key(old)]
        else:
            state[key(new)] = new
        if apply_change(a, copy.deepcopy(raw), copy.deepcopy(new)) is None:
            a = analyse(copy.deepcopy(list(state.values())), now=NOW)
            prepare(a)
            continue
        assert index_by_level(a) == tree_by_level(a), (what, old, new)
        assert canonical(a) == canonical(analyse(copy.deepcopy(list(state.values())), now=NOW)), (what, old, new)
