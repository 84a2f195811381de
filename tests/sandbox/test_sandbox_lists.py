"""Lists as kube-apiserver v1.32 serves them, where the sandbox used to differ: a `resourceVersion=0`
list is the watch cache's (whole, whatever the limit), a chunk of a list without selectors says how
many objects are left (`remainingItemCount`), and objects come in etcd's key order
(`<namespace>/<name>` as bytes), which kubectl shows as it gets it. And a restarted server's watch
window starts empty: a watch from before the restart is 410 Gone, never a replay or a gap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.sandbox.store import Store, etcd_key
from sandbox_proc import SandboxProcess
from test_sandbox_snapshot import InProcessSandbox

CM = "/api/v1/configmaps"
#: namespaces whose names are prefixes of one another: `a-b` sorts before `a` in etcd ('-', the one
#: character of a namespace name below '/', ends the shared prefix), `a0` after it; (namespace, name)
#: order has `a` first
NAMESPACES = ("a", "a-b", "a-b-c", "a0", "ab")
NAMES = ("x", "x-y", "x.y", "x0")


def cm_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps"


def etcd_order(pairs: Any) -> list[tuple[str, str]]:
    """What a real API server's cluster-wide list returns: sorted by the etcd key's bytes."""
    return sorted(pairs, key=lambda p: f"/registry/configmaps/{p[0]}/{p[1]}".encode())


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("sandbox")) as s:
        for ns in NAMESPACES:
            s.http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).raise_for_status()
            for name in NAMES:
                s.http.post(cm_path(ns), json={"metadata": {"name": name, "labels": {"ns": ns}},
                                               "data": {"k": "v"}}).raise_for_status()
        yield s


def pairs(listing: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in listing["items"]]


def test_a_list_at_resource_version_0_is_whole_whatever_the_limit(sb):
    """kube-apiserver serves `resourceVersion=0` from its watch cache, which (v1.32) ignores `limit`:
    the whole list, no continue token, no remainingItemCount; `NotOlderThan` with 0 too. Without
    the 0 the same limit pages (from etcd)."""
    whole = sb.http.get(CM).json()
    assert len(whole["items"]) == len(NAMESPACES) * len(NAMES)
    for params in ({"resourceVersion": "0", "limit": 1}, {"resourceVersion": "0", "limit": 3},
                   {"resourceVersion": "0", "resourceVersionMatch": "NotOlderThan", "limit": 2}):
        got = sb.http.get(CM, params=params)
        assert got.status_code == 200, got.text
        body = got.json()
        assert pairs(body) == pairs(whole), params
        assert "continue" not in body["metadata"] and "remainingItemCount" not in body["metadata"], params
        assert int(body["metadata"]["resourceVersion"]) >= int(whole["metadata"]["resourceVersion"])
    paged = sb.http.get(CM, params={"limit": 1}).json()
    assert len(paged["items"]) == 1 and paged["metadata"]["continue"]
    # a namespace's list at 0 likewise, and a continue token with resourceVersion=0 still goes on
    ns_whole = sb.http.get(cm_path("a"), params={"resourceVersion": "0", "limit": 1}).json()
    assert pairs(ns_whole) == [("a", n) for n in NAMES] and "continue" not in ns_whole["metadata"]
    nxt = sb.http.get(CM, params={"resourceVersion": "0", "limit": 1, "continue": paged["metadata"]["continue"]}).json()
    assert len(nxt["items"]) == 1 and pairs(nxt) == pairs(whole)[1:2]


def test_an_informers_list_at_0_then_watch_from_its_version_sees_every_later_write(sb):
    """client-go's reflector: list at resourceVersion=0 with limit=500, watch from the list's version."""
    listed = sb.http.get(cm_path("ab"), params={"resourceVersion": "0", "limit": 500}).json()
    rv = listed["metadata"]["resourceVersion"]
    sb.http.post(cm_path("ab"), json={"metadata": {"name": "later"}}).raise_for_status()
    events = []
    with httpx.stream("GET", sb.url + cm_path("ab"), params={"watch": "true", "resourceVersion": rv,
                                                           "timeoutSeconds": "1"}, timeout=10, **sb.client) as resp:
        for line in resp.iter_lines():
            if line.strip():
                events.append(json.loads(line))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "later")]
    sb.http.delete(cm_path("ab") + "/later").raise_for_status()


def test_a_chunk_says_how_many_objects_are_left_but_not_with_a_selector(sb):
    """remainingItemCount: the objects after the chunk (etcd's count of the keys left, less the
    limit), on every chunk but the last; none with a label or a field selector."""
    total = len(NAMESPACES) * len(NAMES)
    token, counts = None, []
    while True:
        body = sb.http.get(CM, params={"limit": 3, **({"continue": token} if token else {})}).json()
        token = body["metadata"].get("continue")
        counts.append(body["metadata"].get("remainingItemCount"))
        if not token:
            break
    assert counts == [total - 3 * (i + 1) for i in range(len(counts) - 1)] + [None]
    in_ns = sb.http.get(cm_path("a-b"), params={"limit": 1}).json()
    assert in_ns["metadata"]["remainingItemCount"] == len(NAMES) - 1
    for selector in ({"labelSelector": "ns=a"}, {"fieldSelector": "metadata.name=x"}, {"labelSelector": "ns"}):
        chunk = sb.http.get(CM, params={"limit": 1, **selector}).json()
        assert chunk["metadata"]["continue"] and "remainingItemCount" not in chunk["metadata"], selector
    table = sb.http.get(CM, params={"limit": 2}, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert table.json()["metadata"]["remainingItemCount"] == total - 2


def test_remaining_item_count_is_counted_at_the_lists_version():
    """Chunks read at the first chunk's version (objects created and deleted since) count what is
    left of that version, not of the objects now."""
    store = Store()
    cms, nss = store.registry.by_plural[("", "configmaps")], store.registry.by_plural[("", "namespaces")]
    store.create(nss, "", {"metadata": {"name": "n"}})
    for i in range(6):
        store.create(cms, "n", {"metadata": {"name": f"c{i}"}})
    at = store.rv
    first, more = store.page(cms, None, None, None, 2, None)
    assert more and store.remaining(cms, None, ("n", "c1")) == 4
    store.delete(cms, "n", "c3")
    for i in range(6, 9):
        store.create(cms, "n", {"metadata": {"name": f"c{i}"}})
    assert store.remaining(cms, None, ("n", "c1"), at) == 4  # c2..c5 then
    assert store.remaining(cms, "n", ("n", "c1")) == 6  # c2, c4..c8 now


def test_a_cluster_wide_list_comes_in_etcd_key_order_in_chunks_and_through_kubectl(sb):
    """A real API server lists from etcd (and its watch cache keeps etcd's order): by the key's
    bytes, so namespace `a-b` before `a`. The chunks of a list follow that order across their
    continue tokens, and kubectl prints the rows in it."""
    whole = sb.http.get(CM).json()
    want = etcd_order((ns, n) for ns in NAMESPACES for n in NAMES)
    # `a-b-c/` < `a-b/` < `a/` < `a0/`: not ("a", ...) first, as (namespace, name) has it
    assert [ns for ns, _ in want[::len(NAMES)]] == ["a-b-c", "a-b", "a", "a0", "ab"]
    assert pairs(whole) == want
    token, chunked = None, []
    while True:
        body = sb.http.get(CM, params={"limit": 3, **({"continue": token} if token else {})}).json()
        chunked += pairs(body)
        token = body["metadata"].get("continue")
        if not token:
            break
    assert chunked == want
    for args in (("--chunk-size=2",), ("--chunk-size=2", "-o", "json")):
        out = sb.kubectl("get", "configmaps", "-A", "--no-headers", *args).stdout
        rows = pairs(json.loads(out)) if "json" in args else [tuple(line.split()[:2]) for line in out.splitlines()]
        assert rows == want, args
    names = sb.kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert names == sorted(names)  # cluster-scoped: `/registry/namespaces/<name>`, by name


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "a-b", "a-bc", "a0", "b", "a-0"]),
                          st.sampled_from(["x", "x-y", "x.y", "x0", "y", "x.0"])), min_size=1, unique=True),
       st.integers(1, 4), st.sampled_from([None, "a", "a-b"]))
def test_chunks_are_the_etcd_ordered_list_at_every_limit_and_scope(keys, limit, ns):
    """Every object once, in etcd's byte order of `/registry/configmaps/<ns>/<name>`, in every chunking,
    cluster-wide or in one namespace (one whose name is a prefix of others' included)."""
    store = Store()
    cms, nss = store.registry.by_plural[("", "configmaps")], store.registry.by_plural[("", "namespaces")]
    for space in {k[0] for k in keys}:
        store.create(nss, "", {"metadata": {"name": space}})
    for space, name in keys:
        store.create(cms, space, {"metadata": {"name": name}})
    want = etcd_order(k for k in keys if ns is None or k[0] == ns)
    got, after, more = [], None, True
    while more:
        page, more = store.page(cms, ns, None, None, limit, after)
        got += [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in page]
        if more:
            assert store.remaining(cms, ns, got[-1]) == len(want) - len(got)
        after = got[-1] if got else None
    assert got == want
    assert [etcd_key(k) for k in got] == sorted(etcd_key(k) for k in got)


def test_a_watch_from_before_a_restart_is_410_gone_and_one_from_the_restart_resumes(tmp_path):
    """kube-apiserver restarted starts its watch cache from a list at the current resourceVersion:
    a watch from an older one gets 410 Gone (`too old resource version: X (R)`), so the client
    lists again; one from that version resumes. The sandbox restarted in process kept its window
    and replayed the history instead, as a server that never restarted would. Lists at older
    versions are etcd's to serve and are still served."""
    inproc = InProcessSandbox(tmp_path)
    try:
        store = inproc.store
        cms = store.registry.by_plural[("", "configmaps")]
        store.create(cms, "default", {"metadata": {"name": "before"}})
        old = store.rv
        store.create(cms, "default", {"metadata": {"name": "also-before"}})
        http = httpx.Client(base_url=f"http://127.0.0.1:{inproc.server.port}", timeout=10)
        first = http.get(cm_path("default"), params={"limit": 1}).json()
        asyncio.run_coroutine_threadsafe(inproc.server.restart(down=0.05), inproc.loop).result(10)
        at_restart = store.rv
        url = f"http://127.0.0.1:{inproc.server.port}{cm_path('default')}"

        def watch(rv: int) -> list[dict[str, Any]]:
            out = []
            with httpx.stream("GET", url, params={"watch": "true", "resourceVersion": str(rv), "timeoutSeconds": "1"},
                              timeout=10) as resp:
                for line in resp.iter_lines():
                    if line.strip():
                        out.append(json.loads(line))
            return out

        gone = watch(old)
        assert [e["type"] for e in gone] == ["ERROR"]
        status = gone[0]["object"]
        assert (status["code"], status["reason"]) == (410, "Expired")
        assert status["message"] == f"too old resource version: {old} ({at_restart})"
        assert watch(at_restart - 1)[0]["object"]["code"] == 410
        store.create(cms, "default", {"metadata": {"name": "after"}})
        resumed = watch(at_restart)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in resumed] == [("ADDED", "after")]
        # lists at a version before the restart are etcd's to serve, and still are: a continue token
        # goes on at its version, an Exact list is that version
        rest = http.get(cm_path("default"), params={"limit": 5, "continue": first["metadata"]["continue"]}).json()
        assert [o["metadata"]["name"] for o in first["items"] + rest["items"]] == ["also-before", "before"]
        exact = http.get(cm_path("default"), params={"resourceVersion": str(old), "resourceVersionMatch": "Exact"})
        assert [o["metadata"]["name"] for o in exact.json()["items"]] == ["before"]
        http.close()
    finally:
        inproc.close()
