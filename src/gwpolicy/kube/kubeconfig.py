"""Kubeconfig reading for the CLI: the files kubectl reads, merged as kubectl merges them.

`--kubeconfig FILE` reads that file alone. Otherwise `KUBECONFIG` lists files (joined by `:`,
`;` on Windows); missing or unreadable ones are skipped. kubectl's merge rules: the first file that
sets `current-context` wins; a cluster, user or context is taken from the first file that names it
(a later file cannot replace it); paths in a file are relative to that file.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

#: fields that hold a file path, per section, resolved against the file that holds them
_PATH_FIELDS = {"clusters": ("cluster", ("certificate-authority",)),
                "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


def kubeconfig_paths(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    env = os.environ.get("KUBECONFIG")
    if env:
        seen: list[str] = []
        for p in env.split(os.pathsep):
            if p and p not in seen:
                seen.append(p)
        return seen
    return [os.path.expanduser("~/.kube/config")]


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def _absolute(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The document with its relative file paths made absolute against `path`'s folder."""
    base = os.path.dirname(os.path.abspath(path))
    out = dict(doc)
    for section, (inner, fields) in _PATH_FIELDS.items():
        entries = []
        for entry in doc.get(section) or []:
            if isinstance(entry, dict) and isinstance(entry.get(inner), dict):
                body = dict(entry[inner])
                for f in fields:
                    v = body.get(f)
                    if isinstance(v, str) and v and not os.path.isabs(v):
                        body[f] = os.path.join(base, v)
                entry = {**entry, inner: body}
            entries.append(entry)
        if section in doc:
            out[section] = entries
    return out


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfigs: first current-context, first of each name."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": []}
    for doc in docs:
        if not merged.get("current-context") and isinstance(doc.get("current-context"), str) and doc["current-context"]:
            merged["current-context"] = doc["current-context"]
        for section in ("clusters", "users", "contexts"):
            names = {e.get("name") for e in merged[section]}
            for entry in doc.get(section) or []:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"] not in names:
                    merged[section].append(entry)
                    names.add(entry["name"])
        if "preferences" not in merged and isinstance(doc.get("preferences"), dict):
            merged["preferences"] = doc["preferences"]
    return merged


def load_kubeconfig(explicit: str | None) -> dict[str, Any]:
    """The merged kubeconfig of the files kubectl would read, or {} when none is readable (file mode needs none)."""
    docs = [_absolute(d, p) for p in kubeconfig_paths(explicit) if (d := _read(p)) is not None]
    if not docs:
        return {}
    return docs[0] if explicit else merge(docs)


def context_namespace(explicit: str | None, context: str | None) -> str:
    """The namespace kubectl would use: the context's namespace, else `default`."""
    cfg = load_kubeconfig(explicit)
    name = context or cfg.get("current-context")
    for ctx in cfg.get("contexts") or []:
        if isinstance(ctx, dict) and ctx.get("name") == name:
            ns = (ctx.get("context") or {}).get("namespace") if isinstance(ctx.get("context"), dict) else None
            if isinstance(ns, str) and ns:
                return ns
    return "default"
