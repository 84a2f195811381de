"""`gwpolicy sandbox -f FILE` lets the objects it parsed go once they are stored: the store keeps its
own version of each, and the parsed ones (40 MB at the 20k-route cluster) were held for the whole
life of the server by the command's and the server's locals."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

import gwpolicy.cli.main as cli
from gwpolicy.sandbox import seed, server

PARABLE = Path(__file__).resolve().parents[2] / "examples" / "parable"


class Parsed(dict):
    """A parsed object that can be watched with a weak reference (a plain dict cannot)."""


class Stop(Exception):
    pass


def test_the_objects_of_f_are_let_go_once_stored(monkeypatch, tmp_path):
    """Every object parsed from `-f` that is still alive when the server starts listening is one
    the store holds: nothing else (the command's locals, the server's arguments) keeps one."""
    watched: list[weakref.ref] = []
    real_well_shaped = seed.well_shaped

    def well_shaped_watched(objects: list[dict[str, Any]], origins: Any, warn: Any) -> list[dict[str, Any]]:
        """The real check, then each object kept replaced by a watched copy, in the loader's list too."""
        kept = real_well_shaped(objects, origins, warn)
        copies = {id(o): Parsed(o) for o in kept}
        objects[:] = [copies.get(id(o), o) for o in objects]
        watched.extend(weakref.ref(c) for c in copies.values())
        return [copies[id(o)] for o in kept]

    seen: dict[str, Any] = {}

    async def start(self: server.SandboxServer) -> int:  # what the server holds when it would listen
        gc.collect()
        stored = {id(o) for o in self.sandbox.store.objects.values()}
        alive = [r() for r in watched if r() is not None]
        seen.update(stored=len(self.sandbox.store.objects), parsed=len(watched),
                    held=[o for o in alive if id(o) not in stored])
        raise Stop

    monkeypatch.setattr(seed, "well_shaped", well_shaped_watched)
    monkeypatch.setattr(server.SandboxServer, "start", start)
    with pytest.raises(Stop):
        cli.sandbox_main(["-f", str(PARABLE)])
    assert seen["parsed"] > 10 and seen["stored"] > seen["parsed"] // 2, seen
    held = seen["held"]
    assert not held, f"{len(held)} parsed objects held outside the store, e.g. {held[0].get('kind')} " \
                     f"{held[0].get('metadata', {}).get('name')}"


def test_f_may_name_the_namespaces_a_sandbox_starts_with(monkeypatch, tmp_path):
    """Objects in `default` or `kube-system`, and a `default` Namespace carrying labels, load as
    `kubectl apply` would take them on a new cluster: the namespace there gets the labels."""
    manifest = tmp_path / "default.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: default, labels: {team: shop}}\n---\n"
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec: {ports: [{port: 80}]}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: kube-system}\ndata: {a: b}\n")
    seen: dict[str, Any] = {}

    async def start(self: server.SandboxServer) -> int:
        seen.update(self.sandbox.store.objects)
        raise Stop

    monkeypatch.setattr(server.SandboxServer, "start", start)
    with pytest.raises(Stop):
        cli.sandbox_main(["-f", str(manifest)])
    assert ("", "services", "default", "web") in seen
    assert ("", "configmaps", "kube-system", "c") in seen
    assert seen[("", "namespaces", "", "default")]["metadata"]["labels"]["team"] == "shop"
