"""A list served in chunks (`?limit=N&continue=TOKEN`: client-go's reflector, `kubectl get --chunk-size`)
is read, chunk after chunk, at the first chunk's resourceVersion, as kube-apiserver reads it from one
snapshot: an object created, changed or deleted between two chunks does not show in the later chunks,
or shows as it was. So are `resourceVersionMatch=Exact` lists. Past the watch window: 410 Expired in
kube-apiserver's words."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.sandbox.server import CONTINUE_EXPIRED, Sandbox, SandboxServer, write_kubeconfig
from gwpolicy.sandbox.store import LIST_EXPIRED, ApiFailure, Store
from sandbox_proc import SandboxProcess

CM = "/api/v1/configmaps"


def cm_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps"


def configmap(name: str, v: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"odd": str(v % 2)}}, "data": {"v": str(v)}}


def items(listing: dict[str, Any]) -> list[bytes]:
    """A list's items, each as its JSON: equal when the objects are, every field and version."""
    return [orjson.dumps(o, option=orjson.OPT_SORT_KEYS) for o in listing["items"]]


def chunks(http: Any, path: str, limit: int, between: Callable[[int], None] = lambda n: None,
           **params: Any) -> tuple[list[bytes], set[str]]:
    """A list fetched `limit` at a time, `between(n)` called after the n-th chunk; its items and the
    resourceVersions its chunks carried."""
    got, versions, token = [], set(), None
    for n in itertools.count():
        page = http.get(path, params={**params, "limit": limit, **({"continue": token} if token else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        got += items(body)
        versions.add(body["metadata"]["resourceVersion"])
        token = body["metadata"].get("continue")
        if not token:
            return got, versions
        between(n)


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("sandbox")) as s:
        yield s


def _namespace(sb: SandboxProcess, name: str) -> None:
    sb.http.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()


def test_chunks_between_writes_are_the_list_at_the_first_chunks_version(sb):
    """Creates (before and after the cursor), updates (of objects served and not yet served, one that
    takes an object out of the label selector and one that brings another in), deletes (one deleted
    and created again) between the chunks: the chunks are exactly the one-shot list taken at the
    first chunk's version, object for object; and so is an Exact list at that version afterwards."""
    for ns in ("snap-a", "snap-b"):
        _namespace(sb, ns)
        for i in range(6):
            sb.http.post(cm_path(ns), json=configmap(f"cm-{i}", i)).raise_for_status()
    writes = itertools.cycle([
        lambda: sb.http.patch(f"{cm_path('snap-a')}/cm-0", json={"data": {"v": "changed"}},  # served already
                              headers={"Content-Type": "application/merge-patch+json"}),
        lambda: sb.http.patch(f"{cm_path('snap-b')}/cm-5", json=configmap("cm-5", 6),  # not yet served, out of odd=1
                              headers={"Content-Type": "application/merge-patch+json"}),
        lambda: sb.http.patch(f"{cm_path('snap-b')}/cm-4", json=configmap("cm-4", 7),  # into odd=1
                              headers={"Content-Type": "application/merge-patch+json"}),
        lambda: sb.http.delete(f"{cm_path('snap-b')}/cm-3"),  # not yet served
        lambda: sb.http.delete(f"{cm_path('snap-a')}/cm-1"),  # served already
        lambda: sb.http.post(cm_path("snap-a"), json=configmap("cm-00")),  # after the cursor
        lambda: sb.http.post(cm_path("snap-b"), json=configmap("cm-9", 1)),
        lambda: (sb.http.post("/api/v1/namespaces", json={"metadata": {"name": "snap-0"}}),  # before every key
                 sb.http.post(cm_path("snap-0"), json=configmap("early", 1))),
        lambda: (sb.http.delete(f"{cm_path('snap-b')}/cm-2"), sb.http.post(cm_path("snap-b"), json=configmap("cm-2", 9))),
    ])

    def write(n: int) -> None:
        next(writes)()

    for path, params, limit in ((CM, {}, 2), (CM, {"labelSelector": "odd=1"}, 1), (cm_path("snap-b"), {}, 1)):
        whole = sb.http.get(path, params=params).json()  # the list at the moment the chunks start
        got, versions = chunks(sb.http, path, limit, write, **params)
        assert versions == {whole["metadata"]["resourceVersion"]}
        assert got == items(whole)
        exact = sb.http.get(path, params={**params, "resourceVersion": whole["metadata"]["resourceVersion"],
                                          "resourceVersionMatch": "Exact"}).json()
        assert exact["metadata"]["resourceVersion"] == whole["metadata"]["resourceVersion"]
        assert items(exact) == items(whole)
        now = sb.http.get(path, params=params).json()
        assert items(now) != items(whole), f"the writes changed the list {path} {params} (else this shows nothing)"
    # with a limit and no match, a resourceVersion is read exactly (the legacy rule); without one, not older than
    legacy = sb.http.get(CM, params={"limit": 500, "resourceVersion": whole["metadata"]["resourceVersion"]}).json()
    assert legacy["metadata"]["resourceVersion"] == whole["metadata"]["resourceVersion"]
    current = sb.http.get(CM, params={"resourceVersion": whole["metadata"]["resourceVersion"]}).json()
    assert int(current["metadata"]["resourceVersion"]) > int(whole["metadata"]["resourceVersion"])


def test_a_token_past_the_window_is_410_expired_with_a_token_to_go_on_inconsistently(sb):
    _namespace(sb, "snap-gone")
    for i in range(5):
        sb.http.post(cm_path("snap-gone"), json=configmap(f"cm-{i}")).raise_for_status()
    first = sb.http.get(cm_path("snap-gone"), params={"limit": 2}).json()
    at = first["metadata"]["resourceVersion"]
    sb.http.post(cm_path("snap-gone"), json=configmap("cm-late")).raise_for_status()
    sb.http.post("/sandbox/faults", json={"compact": True, "dropWatches": False}).raise_for_status()
    gone = sb.http.get(cm_path("snap-gone"), params={"limit": 2, "continue": first["metadata"]["continue"]})
    assert gone.status_code == 410
    status = gone.json()
    assert (status["kind"], status["status"], status["reason"], status["code"]) == ("Status", "Failure", "Expired", 410)
    assert status["message"] == CONTINUE_EXPIRED
    assert status["message"].startswith("The provided continue parameter is too old to display a consistent list result.")
    # the token it hands out goes on after the last key served, at the latest version (the late one shows)
    rest = sb.http.get(cm_path("snap-gone"), params={"limit": 10, "continue": status["metadata"]["continue"]}).json()
    assert [o["metadata"]["name"] for o in rest["items"]] == ["cm-2", "cm-3", "cm-4", "cm-late"]
    assert int(rest["metadata"]["resourceVersion"]) > int(at)
    old = sb.http.get(cm_path("snap-gone"), params={"resourceVersion": at, "resourceVersionMatch": "Exact"})
    assert old.status_code == 410 and old.json()["reason"] == "Expired" and old.json()["message"] == LIST_EXPIRED
    assert sb.http.get(cm_path("snap-gone"), params={"limit": 1, "resourceVersion": at}).status_code == 410


def test_list_options_are_refused_as_kube_apiserver_refuses_them(sb):
    def refused(**params: Any) -> dict[str, Any]:
        r = sb.http.get(CM, params=params)
        assert r.status_code == 422, r.text
        return r.json()

    one = refused(resourceVersionMatch="Exact")
    assert one["message"] == ('ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                              "resourceVersionMatch is forbidden unless resourceVersion is provided")
    assert one["details"]["kind"] == "ListOptions" and one["details"]["group"] == "meta.k8s.io"
    assert one["details"]["causes"][0]["field"] == "resourceVersionMatch"
    assert refused(resourceVersion="0", resourceVersionMatch="Exact")["message"].endswith(
        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
    assert refused(resourceVersion="1", resourceVersionMatch="Newest")["message"].endswith(
        'Unsupported value: "Newest": supported values: "Exact", "NotOlderThan", ""')
    token = sb.http.get(CM, params={"limit": 1}).json()["metadata"].get("continue")
    if token:
        assert "forbidden when continue is provided" in refused(
            resourceVersion="1", resourceVersionMatch="NotOlderThan", **{"continue": token})["message"]
        bad = sb.http.get(CM, params={"continue": token, "resourceVersion": "5"})
        assert bad.status_code == 400
        assert bad.json()["message"] == "specifying resource version is not allowed when using continue"


# ---------- random writes between the chunks of several lists at once ----------

_STEP = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 7), st.integers(0, 3)),
    st.tuples(st.just("update"), st.integers(0, 7), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("start"), st.integers(1, 3), st.integers(0, 3)),  # a new list: its limit, its scope and selector
    st.tuples(st.just("next"), st.integers(0, 5), st.just(0)),  # the next chunk of one of the lists begun
)
_namespaces = itertools.count()


@pytest.fixture(scope="module")
def psb(tmp_path_factory):
    """A sandbox of its own: a list of all namespaces then holds only the example's objects."""
    with SandboxProcess(tmp_path_factory.mktemp("sandbox")) as s:
        yield s


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(_STEP, max_size=40))
def test_every_list_in_chunks_is_the_list_at_its_version_whatever_is_written_between(psb, steps):
    """Lists in chunks begun at random points, their chunks asked for between random creates,
    updates (a label the selector reads, too) and deletes: each list is the one-shot list at the
    moment it began, and an Exact list at any version met is the list as it was then."""
    sb = psb
    ns = f"prop-{next(_namespaces)}"
    _namespace(sb, ns)
    base = cm_path(ns)
    lists: list[dict[str, Any]] = []  # each: path, params, limit, expected items, version, items so far, token
    seen: dict[str, list[bytes]] = {}  # version -> the namespace's whole list then

    def remember() -> None:
        whole = sb.http.get(base).json()
        seen[whole["metadata"]["resourceVersion"]] = items(whole)

    def next_chunk(lst: dict[str, Any]) -> None:
        page = sb.http.get(lst["path"], params={**lst["params"], "limit": lst["limit"], "continue": lst["token"]})
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["metadata"]["resourceVersion"] == lst["rv"]
        lst["got"] += items(body)
        lst["token"] = body["metadata"].get("continue")

    try:
        for op, a, b in steps:
            name = f"cm-{a}"
            if op == "create":
                sb.http.post(base, json=configmap(name, b))
            elif op == "update":
                sb.http.patch(f"{base}/{name}", json=configmap(name, b + 10),
                              headers={"Content-Type": "application/merge-patch+json"})
            elif op == "delete":
                sb.http.delete(f"{base}/{name}")
            elif op == "start":
                path = base if b < 2 else CM  # all namespaces: the other examples' namespaces are gone
                params = {"labelSelector": "odd=1"} if b % 2 else {}
                whole = sb.http.get(path, params=params).json()
                lst = {"path": path, "params": params, "limit": a, "want": items(whole),
                       "rv": whole["metadata"]["resourceVersion"], "got": [], "token": ""}
                next_chunk(lst)
                lists.append(lst)
            elif lists:
                open_ = [x for x in lists if x["token"]]
                if open_:
                    next_chunk(open_[a % len(open_)])
            remember()
        for lst in lists:  # the rest of each list, with a write between every two chunks
            while lst["token"]:
                sb.http.post(base, json=configmap(f"late-{len(lst['got'])}-{lst['rv']}", 1))
                next_chunk(lst)
            assert lst["got"] == lst["want"], f"the list at {lst['rv']} ({lst['path']} {lst['params']})"
        for rv, want in seen.items():
            exact = sb.http.get(base, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"}).json()
            assert items(exact) == want, f"the Exact list at {rv}"
    finally:
        sb.http.delete(f"/api/v1/namespaces/{ns}")


# ---------- the store: the window's edge ----------

def test_a_version_is_served_while_the_window_holds_every_event_after_it_and_410_after():
    store = Store(window=4)
    cms = store.registry.by_plural[("", "configmaps")]
    for i in range(3):
        store.create(cms, "default", configmap(f"cm-{i}"))
    at = store.rv
    want = [orjson.dumps(o) for o in store.list(cms, None)]
    store.patch(cms, "default", "cm-0", "application/merge-patch+json", {"data": {"v": "1"}})
    store.delete(cms, "default", "cm-1")
    store.create(cms, "default", configmap("cm-1", 5))
    store.create(cms, "default", configmap("cm-3"))  # the fourth write since `at`: the window holds them all
    assert [orjson.dumps(o) for o in store.list(cms, None, at=at)] == want
    assert [orjson.dumps(o) for o in store.page(cms, "default", None, None, 1, ("default", "cm-0"), at=at)[0]] == want[1:2]
    store.create(cms, "default", configmap("cm-4"))  # the fifth: the first write after `at` is out of the window
    with pytest.raises(ApiFailure) as gone:
        store.list(cms, None, at=at)
    assert gone.value.code == 410 and gone.value.message == LIST_EXPIRED


_STORE_STEP = st.one_of(
    st.tuples(st.just("create"), st.sampled_from("ab"), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("update"), st.sampled_from("ab"), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from("ab"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("drop-namespace"), st.sampled_from("ab"), st.just(0), st.just(0)),
    st.tuples(st.just("start"), st.sampled_from(["a", "b", "*"]), st.integers(1, 3), st.integers(0, 1)),
    st.tuples(st.just("next"), st.just(""), st.integers(0, 30), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_STORE_STEP, max_size=60), window=st.sampled_from([8, 30, 100_000]))
def test_the_store_pages_every_list_at_its_version_or_says_410(steps, window):
    """The store alone, many more interleavings: namespaces deleted with their objects and made
    again, more lists open at once than it keeps versions for (THEN_KEPT), and windows small enough
    to wrap. Every chunk is the list at its version, or 410 when the window no longer reaches it;
    and what is left after a chunk (remainingItemCount) is counted at that version."""
    store = Store(window=window)
    store.THEN_KEPT = 3  # fewer than the lists open: a version forgotten is built again
    cms, nss = store.registry.by_plural[("", "configmaps")], store.registry.by_plural[("", "namespaces")]
    lists: list[dict[str, Any]] = []

    def dumped(objs: list[dict[str, Any]]) -> list[bytes]:
        return [orjson.dumps(o, option=orjson.OPT_SORT_KEYS) for o in objs]

    def scope(ns: str) -> str | None:
        return None if ns == "*" else ns

    for ns in "ab":  # objects to begin with: lists of several chunks from the first steps on
        store.create(nss, "", {"metadata": {"name": ns}})
        for i in range(4):
            store.create(cms, ns, configmap(f"cm-{i}", i))
    for op, ns, i, v in steps:
        try:
            if op == "create":
                if ("", "namespaces", "", ns) not in store.objects:
                    store.create(nss, "", {"metadata": {"name": ns}})
                store.create(cms, ns, configmap(f"cm-{i}", v))
            elif op == "update":
                store.patch(cms, ns, f"cm-{i}", "application/merge-patch+json", configmap(f"cm-{i}", v + 10))
            elif op == "delete":
                store.delete(cms, ns, f"cm-{i}")
            elif op == "drop-namespace":
                store.delete(nss, "", ns)
            elif op == "start":
                labels = "odd=1" if v else None
                lst = {"ns": scope(ns), "labels": labels, "limit": i, "rv": store.rv, "got": [], "after": None,
                       "want": dumped(store.list(cms, scope(ns), labels)), "more": True}
                lists.append(lst)
            elif lists:
                lst = lists[i % len(lists)]
                if not lst["more"]:
                    continue
                try:
                    page, lst["more"] = store.page(cms, lst["ns"], lst["labels"], None, lst["limit"], lst["after"],
                                                   None if lst["rv"] == store.rv else lst["rv"])
                except ApiFailure as exc:
                    assert exc.code == 410 and not store.reaches(lst["rv"])
                    lists.remove(lst)
                    continue
                assert store.reaches(lst["rv"])
                lst["got"] += dumped(page)
                if page:
                    lst["after"] = (page[-1]["metadata"]["namespace"], page[-1]["metadata"]["name"])
                if page and lst["more"] and lst["labels"] is None:  # remainingItemCount, at the list's version
                    assert store.remaining(cms, lst["ns"], lst["after"], None if lst["rv"] == store.rv else lst["rv"]) \
                        == len(lst["want"]) - len(lst["got"])
                if not lst["more"]:
                    assert lst["got"] == lst["want"]
        except ApiFailure as exc:
            assert exc.code in (404, 409)
    for lst in lists:  # what the window still reaches reads to the end as it was
        if store.reaches(lst["rv"]):
            page, _ = store.page(cms, lst["ns"], lst["labels"], None, sys.maxsize, lst["after"],
                                 None if lst["rv"] == store.rv else lst["rv"])
            assert lst["got"] + dumped(page) == lst["want"]


def test_a_deleted_objects_event_shares_its_parts_with_the_last_version():
    """A DELETED event holds the last version with its new resourceVersion, not a copy of it (a
    namespace's deletion put a copy of each of its objects in the window)."""
    store = Store()
    cms = store.registry.by_plural[("", "configmaps")]
    store.create(cms, "default", configmap("cm"))
    live = store.objects[("", "configmaps", "default", "cm")]
    store.delete(cms, "default", "cm")
    ev = store.events[-1]
    assert ev.type == "DELETED" and ev.prev is live and ev.obj["data"] is live["data"]
    assert ev.obj["metadata"]["resourceVersion"] == str(ev.rv) != live["metadata"]["resourceVersion"]


# ---------- through real kubectl ----------

class InProcessSandbox:
    """The sandbox's server on 127.0.0.1 in a thread of this process, so that a test can act inside
    it between two of kubectl's requests (deterministically: before the answer to the first is sent)."""

    def __init__(self, tmp: Path) -> None:
        self.sandbox = Sandbox(Store(), bookmark_interval=0.2)
        self.store = self.sandbox.store
        self.server = SandboxServer(self.sandbox)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.kubeconfig = tmp / "kubeconfig"
        write_kubeconfig(str(self.kubeconfig), port)
        self.cache = tmp / "kubectl-cache"

    def kubectl(self, *args: str) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        out = subprocess.run(["kubectl", "--cache-dir", str(self.cache), *args], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out.stdout

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def inproc(tmp_path):
    s = InProcessSandbox(tmp_path)
    try:
        yield s
    finally:
        s.close()


def test_kubectl_get_in_chunks_of_one_shows_the_list_at_its_first_chunks_version(inproc, monkeypatch):
    """`kubectl get --chunk-size=1`, with a create, an update and a delete done inside the server
    after each chunk is read (before kubectl has it, so before it asks for the next): kubectl prints
    the list as it was when it began, in JSON and in its table (whose chunks carry the token too)."""
    store, sandbox = inproc.store, inproc.sandbox
    cms = store.registry.by_plural[("", "configmaps")]
    ns_r = store.registry.by_plural[("", "namespaces")]
    for ns in ("a", "b"):
        store.create(ns_r, "", {"metadata": {"name": ns}})
        for i in range(4):
            store.create(cms, ns, configmap(f"cm-{i}", i))
    counter = itertools.count()
    served = []

    def write_between() -> None:
        n = next(counter)
        ns = "ab"[n % 2]
        store.create(cms, ns, configmap(f"cm-{n}-new"))
        for key in [k for k in store.objects.keys_of("", "configmaps") if k[2] == ns and not k[3].endswith("-new")][:1]:
            store.patch(cms, key[2], key[3], "application/merge-patch+json", {"data": {"v": f"changed-{n}"}})
        for key in [k for k in store.objects.keys_of("", "configmaps") if k[2] != ns][-1:]:
            store.delete(cms, key[2], key[3])

    original = sandbox.list_objects

    async def list_then_write(request: Any, r: Any, ns: Any) -> Any:
        objs, meta = await original(request, r, ns)
        served.append(len(objs))
        if r.plural == "configmaps" and meta.get("continue"):
            write_between()  # after this chunk was read, before kubectl asks for the next
        return objs, meta

    monkeypatch.setattr(sandbox, "list_objects", list_then_write)

    want = [(o["metadata"]["namespace"], o["metadata"]["name"], o["data"]["v"], o["metadata"]["resourceVersion"])
            for o in store.list(cms, None)]
    out = json.loads(inproc.kubectl("get", "configmaps", "-A", "--chunk-size=1", "-o", "json"))
    got = [(o["metadata"]["namespace"], o["metadata"]["name"], o["data"]["v"], o["metadata"]["resourceVersion"])
           for o in out["items"]]
    assert got == want
    assert len(served) >= len(want) and set(served) == {1}, "kubectl asked one object at a time"
    assert [(o[0], o[1], o[2]) for o in want] != [
        (o["metadata"]["namespace"], o["metadata"]["name"], o["data"]["v"]) for o in store.list(cms, None)]

    want_rows = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in store.list(cms, None)]
    table = inproc.kubectl("get", "configmaps", "-A", "--chunk-size=1", "--no-headers")
    assert [tuple(line.split()[:2]) for line in table.splitlines() if line.strip()] == want_rows


def test_a_watch_without_a_version_misses_no_write_made_while_its_list_is_sent(inproc, monkeypatch):
    """A watch from no resourceVersion sends the list as ADDED events, then what came after it. A
    write made after the list was read but before the watch was done sending it came neither in the
    list nor after it (the watch counted it as sent)."""
    import httpx2 as httpx

    store = inproc.store
    cms = store.registry.by_plural[("", "configmaps")]
    for i in range(3):
        store.create(cms, "default", configmap(f"cm-{i}"))
    listed = store.list

    def list_then_write(*args: Any, **kw: Any) -> Any:
        out = listed(*args, **kw)
        store.create(cms, "default", configmap("while-sending"))  # after the list was read
        return out

    monkeypatch.setattr(store, "list", list_then_write)
    port = inproc.server.port
    names = []
    with httpx.stream("GET", f"http://127.0.0.1:{port}{cm_path('default')}", params={"watch": "true", "timeoutSeconds": "1"},
                      timeout=10) as resp:
        for line in resp.iter_lines():
            if line.strip():
                ev = json.loads(line)
                names.append((ev["type"], ev["object"]["metadata"]["name"]))
    assert names == [("ADDED", "cm-0"), ("ADDED", "cm-1"), ("ADDED", "cm-2"), ("ADDED", "while-sending")]
