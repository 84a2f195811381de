"""The edits the controller benchmarks apply, and a `ClusterModel` fed a synthetic cluster's objects
as its informers would feed them (the workload `controller_inproc` and `instructions` share)."""

from __future__ import annotations

import copy
from typing import Any, Callable

GW = "gateway.networking.k8s.io"
P = "policy.example.io"


# Each edit: (name, what it does) -> a list of events [(type, raw)] made from the model's objects.
Edit = Callable[[dict[tuple[str, str, str, str], dict[str, Any]]], list[tuple[str, dict[str, Any]]]]


def _changed(objs: dict, key: tuple[str, str, str, str], change: Callable[[dict[str, Any]], None]) -> list[tuple[str, dict[str, Any]]]:
    raw = copy.deepcopy(objs[key])
    change(raw)
    raw["metadata"]["generation"] = raw["metadata"].get("generation", 1) + 1
    return [("MODIFIED", raw)]


def _route_policy(objs: dict) -> tuple[str, str, str, str]:
    return next(k for k in sorted(objs) if k[1] == "RetryPolicy" and k[3].startswith("route-") and k[3].endswith("-retries"))


def _first_ns(objs: dict) -> str:
    return min(k[3] for k in objs if k[1] == "Namespace" and k[3].startswith("app-"))


def _second_ns(objs: dict) -> str:
    return sorted(k[3] for k in objs if k[1] == "Namespace" and k[3].startswith("app-"))[1]


def _route(objs: dict, name: str) -> tuple[str, str, str, str]:
    return next(k for k in objs if k[1] == "HTTPRoute" and k[3] == name)


def _svc(objs: dict, name: str) -> tuple[str, str, str, str]:
    return next(k for k in objs if k[1] == "Service" and k[3] == name)


def _new_listener(raw: dict[str, Any]) -> None:
    raw["spec"]["listeners"].append({"name": "admin", "port": 9443, "protocol": "HTTPS", "hostname": "admin.example.com",
                                     "allowedRoutes": {"namespaces": {"from": "Same"}}})


def _https_hostname(host: str) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        for l in raw["spec"]["listeners"]:
            if l["name"] == "https":
                l["hostname"] = host
    return change


def _labels(labels: dict[str, str]) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        raw["metadata"]["labels"] = labels
    return change


def _ports(ports: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        raw["spec"]["ports"] = ports
    return change


def _retry(raw: dict[str, Any]) -> None:
    raw["spec"]["defaults"]["maxRetries"] = 8


def _backoff(raw: dict[str, Any]) -> None:
    raw["spec"]["defaults"]["backoff"]["max"] = "2s"


def _hostnames(raw: dict[str, Any]) -> None:
    raw["spec"]["hostnames"] = ["renamed.example.com"]


_GATEWAY = (GW, "Gateway", "infra", "gw-001")
_SAVED: dict[str, dict[str, Any]] = {}  # objects deleted by one edit, created again by the next


def _delete(key_of: Callable[[dict], tuple[str, str, str, str]], slot: str) -> Edit:
    def edit(objs: dict) -> list[tuple[str, dict[str, Any]]]:
        _SAVED[slot] = copy.deepcopy(objs[key_of(objs)])
        return [("DELETED", copy.deepcopy(_SAVED[slot]))]
    return edit


def _create(slot: str) -> Edit:
    return lambda objs: [("ADDED", copy.deepcopy(_SAVED[slot]))]


def _new_namespace(objs: dict) -> list[tuple[str, dict[str, Any]]]:
    return [("ADDED", {"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": "bench-new", "creationTimestamp": "2025-02-01T00:00:00Z", "labels": {"tier": "api"}}})]


def _new_grant(objs: dict) -> list[tuple[str, dict[str, Any]]]:
    ns, other = _second_ns(objs), _first_ns(objs)
    return [("ADDED", {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant",
                       "metadata": {"name": "bench-grant", "namespace": ns, "creationTimestamp": "2025-02-01T00:00:00Z"},
                       "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": other}],
                                "to": [{"group": "", "kind": "Service"}]}})]


#: the edits, in the order they are applied (each on the state the previous ones left)
EDITS: list[tuple[str, Edit]] = [
    ("policy edit (a route's RetryPolicy)", lambda o: _changed(o, _route_policy(o), _retry)),
    ("route edit (hostnames)", lambda o: _changed(o, _route(o, "route-000001"), _hostnames)),
    ("namespace-wide policy edit", lambda o: _changed(o, (P, "RetryPolicy", _first_ns(o), "namespace-retries"), _backoff)),
    ("Gateway: a listener added", lambda o: _changed(o, _GATEWAY, _new_listener)),
    ("Gateway: https hostname changed (its routes leave)", lambda o: _changed(o, _GATEWAY, _https_hostname("*.example.org"))),
    ("Gateway: https hostname back (its routes return)", lambda o: _changed(o, _GATEWAY, _https_hostname("*.example.com"))),
    ("Service: ports changed", lambda o: _changed(o, _svc(o, "svc-000002"), _ports([{"name": "http", "port": 8080},
                                                                                  {"name": "admin", "port": 9091}]))),
    ("Service: deleted", _delete(lambda o: _svc(o, "svc-000003"), "svc")),
    ("Service: created", _create("svc")),
    ("shared Service: a port added", lambda o: _changed(o, _svc(o, "shared-auth"), _ports([{"name": "http", "port": 8080},
                                                                                          {"name": "grpc", "port": 9000}]))),
    ("Namespace: labels changed", lambda o: _changed(o, ("", "Namespace", "", _second_ns(o)), _labels({"tier": "api"}))),
    ("Namespace: created", _new_namespace),
    ("Namespace: deleted", lambda o: [("DELETED", copy.deepcopy(o[("", "Namespace", "", "bench-new")]))]),
    ("ReferenceGrant: created", _new_grant),
    ("ReferenceGrant: deleted", lambda o: [("DELETED", copy.deepcopy(o[(GW, "ReferenceGrant", _second_ns(o), "bench-grant")]))]),
    ("shared ReferenceGrant: deleted (routes lose the shared backend)",
     _delete(lambda o: (GW, "ReferenceGrant", _first_ns(o), "routes-to-auth"), "grant")),
    ("shared ReferenceGrant: created again", _create("grant")),
]


def informer_objects(path: str) -> list[dict[str, Any]]:
    """The objects of a cluster file as an informer delivers them: decoded JSON, each object its own."""
    import orjson

    from gwpolicy.files.load import load_paths

    loaded = load_paths([path])
    return [orjson.loads(orjson.dumps(o, default=str)) for o in loaded.objects]


def fed(raws: list[dict[str, Any]]) -> Any:
    """A `ClusterModel` fed the objects, one ADDED event each, not yet analysed."""
    from gwpolicy.controller.model import ClusterModel

    model = ClusterModel("gwpolicy.io/policy-controller")
    for raw in raws:
        model.event("ADDED", raw)
    return model


def fed_model(path: str) -> tuple[Any, int, int]:
    """`fed` on a cluster file's objects; and the number of objects and of routes."""
    raws = informer_objects(path)
    return fed(raws), len(raws), sum(1 for r in raws if r.get("kind") == "HTTPRoute")
