"""Strategic merge patch for the built-in kinds the sandbox serves: lists merged by their patch merge
keys (a Service's ports by `port`, containers by `name`, ...) as the Kubernetes API types declare
them, with the `$patch`, `$setElementOrder`, `$deleteFromPrimitiveList` and `$retainKeys`
directives kubectl sends. Custom resources have no merge keys: the server answers 415, as kube-apiserver does."""

from __future__ import annotations

from typing import Any

_POD = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
        "imagePullSecrets": "name", "hostAliases": "ip", "topologySpreadConstraints": "topologyKey",
        "resourceClaims": "name"}
_CONTAINER = {"ports": "containerPort", "env": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
              "resizePolicy": "resourceName"}
_META = {"finalizers": "", "ownerReferences": "uid"}  # "": a list of scalars merged as a set


def _pod_keys(prefix: str) -> dict[str, str]:
    out = {f"{prefix}.{k}": v for k, v in _POD.items()}
    for c in ("containers", "initContainers", "ephemeralContainers"):
        out.update({f"{prefix}.{c}[].{k}": v for k, v in _CONTAINER.items()})
    return out


MERGE_KEYS: dict[str, dict[str, str]] = {
    "Service": {"spec.ports": "port"},
    "Deployment": {**_pod_keys("spec.template.spec"), "spec.template.spec.containers[].ports": "containerPort"},
    "ServiceAccount": {"secrets": "name", "imagePullSecrets": "name"},
    "Namespace": {"spec.finalizers": ""},
}


def _keys_for(kind: str) -> dict[str, str]:
    out = {f"metadata.{k}": v for k, v in _META.items()}
    out.update(MERGE_KEYS.get(kind, {}))
    return out


class PatchError(ValueError):
    pass


def strategic_merge(kind: str, original: Any, patch: Any) -> Any:
    """`original` with the strategic merge `patch` applied (a new value; neither argument changes)."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    return _merge_map(original if isinstance(original, dict) else {}, patch, "", _keys_for(kind))


def _merge_map(orig: dict[str, Any], patch: dict[str, Any], path: str, keys: dict[str, str]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    out = dict(orig)
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith("$setElementOrder/") or k.startswith("$deleteFromPrimitiveList/"):
            continue
        child = f"{path}.{k}" if path else k
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            if isinstance(v, dict) and v.get("$patch") == "delete":
                out.pop(k, None)
            else:
                # (an isinstance on a second .get(), which mypy does not carry over)
                out[k] = _merge_map(out.get(k) if isinstance(out.get(k), dict) else {}, v, child, keys)  # type: ignore[arg-type]
        elif isinstance(v, list) and child in keys:
            out[k] = _merge_list(out.get(k) if isinstance(out.get(k), list) else [], v, child, keys)  # type: ignore[arg-type]
        else:
            out[k] = v
    for k, v in patch.items():
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            if isinstance(out.get(name), list) and isinstance(v, list):
                out[name] = [x for x in out[name] if x not in v]
    for k, v in patch.items():
        if k.startswith("$setElementOrder/"):
            name = k.split("/", 1)[1]
            if isinstance(out.get(name), list) and isinstance(v, list):
                out[name] = _order(out[name], v, keys.get(f"{path}.{name}" if path else name, ""))
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(orig: list[Any], patch: list[Any], path: str, keys: dict[str, str]) -> list[Any]:
    key = keys[path]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [p for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    if not key:  # a set of scalars
        return orig + [p for p in patch if p not in orig]
    out = [dict(o) if isinstance(o, dict) else o for o in orig]
    item_path = path + "[]"
    for p in patch:
        if not isinstance(p, dict) or key not in p:
            raise PatchError(f"{path}: every element of a strategic merge list needs its merge key {key!r}")
        at = next((i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == p[key]), None)
        if p.get("$patch") == "delete":
            if at is not None:
                del out[at]
            continue
        if at is None:
            out.append(_merge_map({}, p, item_path, keys))
        else:
            out[at] = _merge_map(out[at], p, item_path, keys)
    return out


def _order(items: list[Any], order: list[Any], key: str) -> list[Any]:
    """Items in the order `$setElementOrder` gives; items it does not name keep their place after."""
    ident = (lambda x: x.get(key) if isinstance(x, dict) else x) if key else (lambda x: x)
    wanted = [ident(o) for o in order]
    rank = {w: i for i, w in enumerate(wanted) if isinstance(w, (str, int, float, bool))}
    # (only items whose identity is in `rank` are sorted, so it is never None there)
    named = sorted((x for x in items if ident(x) in rank), key=lambda x: rank[ident(x)])  # type: ignore[index]
    return named + [x for x in items if ident(x) not in rank]
