"""The sandbox's objects are indexed by resource: a list, an admission check and a write read only
their own resource, never a scan of every stored object (at 50k routes a scan per write made the
writes of a controller's first status quadratic: 181 s to first status at 10k, 55 s without it);
and the index always says what a scan would."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.sandbox.admission import Admission
from gwpolicy.sandbox.store import Store
from helpers import WIDGET_CRD


class CountingScans:
    """Wraps the store's objects so that every walk over all of them is counted."""

    def __init__(self, store: Store) -> None:
        self.walks = 0
        counter = self
        base = type(store.objects)

        class Counted(base):  # type: ignore[misc, valid-type]
            def __iter__(self):  # noqa: ANN204
                counter.walks += 1
                return super().__iter__()

            def items(self):  # noqa: ANN201
                counter.walks += 1
                return super().items()

            def keys(self):  # noqa: ANN201
                counter.walks += 1
                return super().keys()

            def values(self):  # noqa: ANN201
                counter.walks += 1
                return super().values()

        counted = Counted()
        for key, obj in dict.items(store.objects):
            counted[key] = obj
        store.objects = counted


def _store_with_config_maps(n: int) -> Store:
    store = Store()
    cms = store.registry.by_plural[("", "configmaps")]
    for i in range(n):
        store.create(cms, "default", {"metadata": {"name": f"cm-{i}"}, "data": {"k": str(i)}})
    return store


def test_a_write_a_list_and_the_admission_check_walk_no_other_objects():
    store = _store_with_config_maps(300)
    store.create(store.registry.by_plural[("apiextensions.k8s.io", "customresourcedefinitions")], "", WIDGET_CRD)
    widgets = store.registry.by_plural[("example.io", "widgets")]
    store.create(widgets, "default", {"apiVersion": "example.io/v1", "kind": "Widget", "metadata": {"name": "w"}})
    scans = CountingScans(store)
    admission = Admission(store)
    assert not admission.active()  # no ValidatingWebhookConfiguration: a write goes straight to the store
    out = store.patch(widgets, "default", "w", "application/merge-patch+json", {"status": {"ready": True}},
                      subresource="status")
    assert out["status"] == {"ready": True}
    assert [o["metadata"]["name"] for o in store.list(widgets, None)] == ["w"]
    assert not admission.hooks(_call_stub())
    assert scans.walks == 0


def _call_stub() -> Any:
    from gwpolicy.sandbox.admission import Call
    r = Store().registry.by_plural[("", "configmaps")]
    return Call(r, "v1", None, "CREATE", "default", "x", {"metadata": {"name": "x"}}, None, False, user="t")


OPS = st.lists(st.tuples(st.sampled_from(["create-cm", "create-secret", "delete", "delete-ns", "dry-create",
                                          "crd", "widget", "delete-crd"]),
                         st.sampled_from(["a", "b"]), st.integers(0, 3)), max_size=25)


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_the_index_says_what_a_scan_of_every_object_says(ops):
    store = Store()
    reg = store.registry.by_plural
    for ns in ("a", "b"):
        store.create(reg[("", "namespaces")], "", {"metadata": {"name": ns}})
    for op, ns, i in ops:
        try:
            if op == "create-cm":
                store.create(reg[("", "configmaps")], ns, {"metadata": {"name": f"c{i}"}})
            elif op == "create-secret":
                store.create(reg[("", "secrets")], ns, {"metadata": {"name": f"s{i}"}})
            elif op == "delete":
                store.delete(reg[("", "configmaps")], ns, f"c{i}")
            elif op == "delete-ns":
                store.delete(reg[("", "namespaces")], "", ns)
            elif op == "dry-create":
                with store.dry_run():
                    store.create(reg[("", "configmaps")], ns, {"metadata": {"name": f"dry{i}"}})
            elif op == "crd":
                store.create(reg[("apiextensions.k8s.io", "customresourcedefinitions")], "", WIDGET_CRD)
            elif op == "widget" and ("example.io", "widgets") in reg:
                store.create(reg[("example.io", "widgets")], ns,
                             {"apiVersion": "example.io/v1", "kind": "Widget", "metadata": {"name": f"w{i}"}})
            elif op == "delete-crd":
                store.delete(reg[("apiextensions.k8s.io", "customresourcedefinitions")], "", WIDGET_CRD["metadata"]["name"])
        except Exception as exc:  # noqa: BLE001 - conflicts, not found, a namespace being deleted
            assert type(exc).__name__ == "ApiFailure", exc
        scanned: dict[tuple[str, str], set] = {}
        for key in dict.keys(store.objects):
            scanned.setdefault(key[:2], set()).add(key)
        assert {gp: set(keys) for gp, keys in store.objects.by_resource.items()} == scanned
        for gp, keys in scanned.items():
            r = reg.get(gp)
            if r is not None:
                whole = [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in store.list(r, None)]
                assert set(whole) == {(k[2], k[3]) for k in keys}
                chunks, after, more = [], None, True
                while more:  # the chunks of a list (?limit=2) are the list
                    page, more = store.page(r, None, None, None, 2, after)
                    chunks += [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in page]
                    after = chunks[-1] if chunks else None
                assert chunks == whole
        assert not any(k[3].startswith("dry") for k in dict.keys(store.objects))


def test_a_list_in_chunks_is_the_whole_list_and_kubectl_reads_it(tmp_path):
    """`?limit=` and `?continue=` as kube-apiserver serves them (client-go's informers list in chunks
    of 500; kubectl in chunks of --chunk-size): the chunks together are the list, each carries the
    first chunk's resourceVersion, a bad token is 400 and one the watch history no longer covers 410."""
    import json

    from sandbox_proc import SandboxProcess

    sb = SandboxProcess(tmp_path)
    try:
        for ns in ("a", "b"):
            sb.http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).raise_for_status()
            for i in range(7):
                sb.http.post(f"/api/v1/namespaces/{ns}/configmaps",
                             json={"metadata": {"name": f"cm-{i}", "labels": {"odd": str(i % 2)}}}).raise_for_status()
        whole = sb.http.get("/api/v1/configmaps").json()
        names = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in whole["items"]]
        for params in ({}, {"labelSelector": "odd=1"}):
            want = [(o["metadata"]["namespace"], o["metadata"]["name"])
                    for o in sb.http.get("/api/v1/configmaps", params=params).json()["items"]]
            got, token, versions = [], None, set()
            while True:
                page = sb.http.get("/api/v1/configmaps", params={**params, "limit": 3,
                                                                 **({"continue": token} if token else {})}).json()
                assert len(page["items"]) <= 3
                got += [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in page["items"]]
                versions.add(page["metadata"]["resourceVersion"])
                token = page["metadata"].get("continue")
                if not token:
                    break
                # a change between chunks: the version stays the first chunk's, so a watch replays it
                sb.http.post("/api/v1/namespaces/a/configmaps", json={"metadata": {"name": f"late-{len(got)}"}})
            assert [n for n in got if not n[1].startswith("late-")] == want  # each once, in order
            assert len(versions) == 1
        assert names == sorted(names)
        out = sb.kubectl("get", "configmaps", "-A", "--chunk-size=2", "-o", "json")
        assert {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in json.loads(out.stdout)["items"]} >= set(names)
        assert sb.http.get("/api/v1/configmaps", params={"limit": 2, "continue": "not-a-token"}).status_code == 400
        assert sb.http.get("/api/v1/configmaps", params={"limit": -1}).status_code == 400
        first = sb.http.get("/api/v1/configmaps", params={"limit": 2}).json()
        sb.http.post("/api/v1/namespaces/a/configmaps", json={"metadata": {"name": "before-compaction"}})
        sb.http.post("/sandbox/faults", json={"compact": True, "dropWatches": False}).raise_for_status()
        gone = sb.http.get("/api/v1/configmaps", params={"limit": 2, "continue": first["metadata"]["continue"]})
        assert gone.status_code == 410 and gone.json()["reason"] == "Expired"
    finally:
        sb.close()
