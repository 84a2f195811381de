"""Just enough kubeconfig reading for the CLI: the namespace of the current (or named) context."""

from __future__ import annotations

import os
from typing import Any

import yaml


def kubeconfig_paths(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return [os.path.expanduser("~/.kube/config")]


def load_kubeconfig(explicit: str | None) -> dict[str, Any]:
    """The first readable kubeconfig, or {} (file mode needs none)."""
    for path in kubeconfig_paths(explicit):
        try:
            with open(path, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            return doc
    return {}


def context_namespace(explicit: str | None, context: str | None) -> str:
    """The namespace kubectl would use: the context's namespace, else `default`."""
    cfg = load_kubeconfig(explicit)
    name = context or cfg.get("current-context")
    for ctx in cfg.get("contexts") or []:
        if isinstance(ctx, dict) and ctx.get("name") == name:
            ns = (ctx.get("context") or {}).get("namespace")
            if isinstance(ns, str) and ns:
                return ns
    return "default"
