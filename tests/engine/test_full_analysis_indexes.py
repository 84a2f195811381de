"""`analyse(by_target=True)` (what the controller runs) indexes the effective policies by target and
path, and what affects each object, as the list is made: exactly what the analysis derives from
the list on first use, in the same order, on random clusters and the synthetic benchmark cluster."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings

from gen import cluster
from gwpolicy.analysis import analyse
from gwpolicy.bench.generate import cluster as cluster_of
from gwpolicy.refs import Ref
from helpers import NOW


def _indexes(a):
    by = a._effective_by_target()
    per_path = [(t, [(n, [(k.key, id(r)) for k, r in pairs]) for n, pairs in pp.items()]) for t, pp in by.items()]
    affected = [(o, list(kinds.items())) for o, kinds in a.affected.items()]
    return per_path, affected


def _same(objs) -> None:
    made = analyse(copy.deepcopy(objs), now=NOW, by_target=True)
    assert made._by_effective_target is not None and made._affected is not None  # made with the list
    derived = analyse(copy.deepcopy(objs), now=NOW)
    assert derived._by_effective_target is None and derived._affected is None
    # results are identity-compared: derive the second index from the same analysis' list (made,
    # sorted, from the index: the index itself holds the targets in no particular order)
    made_by, made_affected = _indexes(made)
    assert made._effective is None
    listed = made.effective
    assert [ep.target for ep in listed] == sorted((ep.target for ep in listed), key=Ref.sort_key)
    made._by_effective_target = made._affected = None
    made._effective = listed
    again_by, again_affected = _indexes(made)
    assert dict(again_by) == dict(made_by) and dict(again_affected) == dict(made_affected)
    # and the list equals a plain analysis' list, item for item
    assert [(ep.target, tuple(ep.path), ep.kind.key, ep.result.leaves) for ep in listed] == \
        [(ep.target, tuple(ep.path), ep.kind.key, ep.result.leaves) for ep in derived.effective]
    # and the two analyses agree on what affects what
    assert {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds} for o, kinds in made_affected} == \
        {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds.items()} for o, kinds in derived.affected.items()}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster())
def test_the_indexes_made_with_the_list_are_the_ones_derived_from_it(objs) -> None:
    _same(objs)


def test_the_indexes_on_the_synthetic_cluster() -> None:
    _same(list(cluster_of(400)))


def test_objects_of_a_kind_are_in_reference_order_even_when_some_have_no_namespace() -> None:
    import random

    from gwpolicy.model import build_index

    # a kind nobody declares: namespaced when it names a namespace, else cluster-scoped, so one kind
    # holds references with and without a namespace (they do not compare as tuples)
    objs = [{"apiVersion": "example.io/v1", "kind": "Thing", "metadata": {"name": f"t{i}", **({"namespace": ns} if ns else {})}}
            for i, ns in enumerate(["a", None, "b", None, "a"])]
    objs += [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": n, "namespace": ns}} for n, ns in
             [("s2", "b"), ("s1", "b"), ("s3", "a")]]
    random.Random(4).shuffle(objs)
    index = build_index(objs)
    for key in (("example.io", "Thing"), ("", "Service")):
        refs = [o.ref for o in index.by_kind[key]]
        assert refs == sorted(refs, key=Ref.sort_key)
    assert [o.ref.namespace for o in index.by_kind[("example.io", "Thing")]][:2] == [None, None]
