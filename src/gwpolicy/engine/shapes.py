"""The shape of every field the engine reads, declared once and checked once, when objects are indexed.

The engine reads a few dozen fields of Gateway API objects, Services, Namespaces, ReferenceGrants,
PolicyKinds and CRDs. An object whose fields have the wrong type (`ports: 5`, a parentRef `name` given
as a map, a `hostname: .inf`) would make the engine crash or guess; here it is reported as
`Kind ns/name: field: what is wrong` and left out, so that the rest is analysed. Only the fields
the engine reads are declared (an object may carry anything else), `null` stands for "not set"
as in Kubernetes, and a field marked `Required` must be there because the engine cannot place
the object without it.

Every object must also be representable as JSON, since every output is JSON or YAML: integers
that fit in 64 bits, finite numbers, string keys, no bytes (`!!binary`) or sets (`!!set`), and at
most `MAX_DEPTH` levels of nesting. Checking this here, before anything is computed, is what lets
`effective -o json` stream its output without ever stopping half-way.

Why not JSON Schema against the Gateway API CRDs: see docs/architecture.md ("Input shapes").
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from dataclasses import dataclass
from datetime import date
from typing import Any, Callable, Iterator, Union

import orjson

from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP

#: deepest nesting of an object (the Gateway API CRDs, the deepest objects in practice, nest 24 levels)
MAX_DEPTH = 100
_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 64 - 1  # what the JSON encoder (orjson) writes exactly


@dataclass(frozen=True, slots=True)
class Required:
    """A field that must be set (not absent, not null)."""

    shape: "Shape"


@dataclass(frozen=True, slots=True)
class MapOf:
    """An object with arbitrary keys whose values all have one shape (labels, `properties`)."""

    values: "Shape"


@dataclass(frozen=True, slots=True)
class Lazy:
    """A shape defined later (a recursive one: JSON Schema inside a CRD)."""

    get: Callable[[], "Shape"]


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: any value (its representability is still checked)
ANY = _Any()

#: a shape: a type or tuple of types, an object {field: shape}, a list [shape], or one of the classes above
Shape = Union[type, tuple, dict, list, Required, MapOf, Lazy, _Any]

#: a time as written (RFC 3339 text) or as YAML reads an unquoted one
TIME = (str, date)
#: an integer, or a string (a named port)
INT_OR_STR = (int, str)

TARGET_REF = {"group": str, "kind": str, "namespace": str, "name": str, "sectionName": str}
PARENT_REF = {"group": str, "kind": str, "namespace": str, "name": Required(str), "sectionName": str, "port": int}
BACKEND_REF = {"group": str, "kind": str, "namespace": str, "name": Required(str), "port": int, "weight": int}
CONDITION = {"type": str, "status": str, "reason": str, "message": str, "lastTransitionTime": TIME,
             "observedGeneration": int}
SELECTOR = {"matchLabels": MapOf(str),
            "matchExpressions": [{"key": Required(str), "operator": Required(str), "values": [str]}]}
METADATA = {"name": Required(str), "namespace": str, "labels": MapOf(str), "annotations": MapOf(str),
            "creationTimestamp": TIME, "generation": int, "uid": str, "resourceVersion": str}

ROUTE = {
    "spec": {
        "parentRefs": [PARENT_REF],
        "hostnames": [str],
        "rules": [{"name": str, "backendRefs": [BACKEND_REF]}],
    },
    "status": {"parents": [{"parentRef": PARENT_REF, "controllerName": str, "conditions": [CONDITION]}]},
}
_GATEWAY_STATUS = {"conditions": [CONDITION]}
GATEWAY = {
    "spec": {
        "gatewayClassName": str,
        "listeners": [{
            "name": Required(str), "port": int, "protocol": str, "hostname": str,
            "allowedRoutes": {"namespaces": {"from": str, "selector": SELECTOR}, "kinds": [{"group": str, "kind": Required(str)}]},
        }],
    },
    "status": _GATEWAY_STATUS,
}
SERVICE = {"spec": {"ports": [{"name": str, "port": int, "protocol": str, "targetPort": INT_OR_STR}]}}
REFERENCE_GRANT = {"spec": {
    "from": [{"group": str, "kind": Required(str), "namespace": Required(str)}],
    "to": [{"group": str, "kind": Required(str), "name": str}],
}}
POLICY_KIND = {"spec": {
    "group": str, "kind": str, "attachment": str, "mergeStrategy": str, "statusAncestor": str,
    "targetKinds": [{"group": str, "kind": Required(str)}],
    "fieldMappings": [{"setting": Required(str), "field": Required(str), "targetKind": {"group": str, "kind": str}}],
}}
JSON_SCHEMA: dict[str, Shape] = {
    "type": str,
    "properties": MapOf(Lazy(lambda: JSON_SCHEMA)),
    "items": Lazy(lambda: JSON_SCHEMA),
    "additionalProperties": (bool, dict),
    "x-kubernetes-list-type": str,
    "x-kubernetes-list-map-keys": [str],
    "x-kubernetes-map-type": str,
}
CRD = {"spec": {
    "group": Required(str), "scope": str,
    "names": Required({"kind": Required(str), "plural": str, "singular": str, "shortNames": [str]}),
    "versions": [{"name": str, "storage": bool, "served": bool, "schema": {"openAPIV3Schema": JSON_SCHEMA}}],
}}
#: policies of any kind: what status computation reads of their current status
POLICY_STATUS = {"status": {"ancestors": [{"ancestorRef": PARENT_REF, "controllerName": str, "conditions": [CONDITION]}]}}

#: (group, kind) -> shape of the object besides its metadata
KIND_SHAPES: dict[tuple[str, str], Shape] = {
    (GATEWAY_GROUP, "GatewayClass"): {"spec": {"controllerName": str}, "status": _GATEWAY_STATUS},
    (GATEWAY_GROUP, "Gateway"): GATEWAY,
    **{(GATEWAY_GROUP, k): ROUTE for k in ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute")},
    (GATEWAY_GROUP, "ReferenceGrant"): REFERENCE_GRANT,
    (CORE_GROUP, "Service"): SERVICE,
    (CORE_GROUP, "Namespace"): {},
    ("gwpolicy.io", "PolicyKind"): POLICY_KIND,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): CRD,
}


class CheckedSpecs:
    """The specs found right (shape and JSON) in the last check of a set of objects, by identity: a
    controller's next full analysis checks again only the rest of an object whose spec is the same
    value (its store keeps an unchanged spec across copies, `store.share_unchanged`: after the first
    complete status, every object is a new copy with the same spec). Its user promises that a spec
    it hands over is never changed in place. Holds the specs of the last check only.

    A store can also have each object judged as it comes in (`check`, `forget` when it lets the
    object go): a check of a set of objects then takes the verdict of each object it was given
    (by identity), and checks only the others. Each version of an object is judged once, when it
    arrives, rather than again by every full analysis."""

    __slots__ = ("specs", "verdicts")

    def __init__(self) -> None:
        self.specs: dict[int, tuple[Any, Any, Any]] = {}  # id(spec) -> (spec, apiVersion, kind)
        self.verdicts: dict[int, tuple[Any, str | None]] = {}  # id(object) -> (object, object_problem)

    def check(self, raw: Any, previous: Any = None) -> str | None:
        """Judge an object a store now holds (what `problems` would say of it); `previous`, the copy it
        replaces, is forgotten, and when it was right and `raw` holds the same spec (same kind),
        only the rest of `raw` is checked."""
        was = self.verdicts.pop(id(previous), None) if previous is not None else None
        spec = raw.get("spec") if type(raw) is dict else None
        if was is not None and was[0] is previous and was[1] is None and type(previous) is dict \
                and (type(spec) is dict or type(spec) is list) and previous.get("spec") is spec \
                and previous.get("apiVersion") == raw.get("apiVersion") and previous.get("kind") == raw.get("kind"):
            verdict = _problems([{k: v for k, v in raw.items() if k != "spec"}])[0]
        else:
            verdict = _problems([raw])[0]
        self.verdicts[id(raw)] = (raw, verdict)
        return verdict

    def forget(self, raw: Any) -> None:
        """The store let `raw` go."""
        was = self.verdicts.get(id(raw))
        if was is not None and was[0] is raw:
            del self.verdicts[id(raw)]


_checked: contextvars.ContextVar[CheckedSpecs | None] = contextvars.ContextVar("gwpolicy_checked_specs", default=None)


@contextlib.contextmanager
def remembering(checked: CheckedSpecs) -> Iterator[None]:
    """`problems` inside this block reuses and updates `checked`."""
    token = _checked.set(checked)
    try:
        yield
    finally:
        _checked.reset(token)


def problems(raws: list[Any]) -> list[str | None]:
    """`object_problem` of each object; with `remembering`, an object whose spec was found right by
    the last check has only the rest of it checked."""
    checked = _checked.get()
    if checked is None:
        return _problems(raws)
    verdicts = checked.verdicts
    if verdicts:  # judged as they came in: only the others are checked here
        judged: list[str | None] = []
        others: list[Any] = []
        where_others: list[int] = []
        for i, raw in enumerate(raws):
            hit = verdicts.get(id(raw))
            if hit is not None and hit[0] is raw:
                judged.append(hit[1])
            else:
                judged.append(None)
                others.append(raw)
                where_others.append(i)
        if others:
            for i, verdict in zip(where_others, _problems_remembering(checked, others)):
                judged[i] = verdict
        return judged
    return _problems_remembering(checked, raws)


def _problems_remembering(checked: CheckedSpecs, raws: list[Any]) -> list[str | None]:
    known, fresh = checked.specs, {}
    todo, rest, where = [], [], []
    for i, raw in enumerate(raws):
        spec = raw.get("spec") if type(raw) is dict else None
        hit = known.get(id(spec)) if type(spec) is dict or type(spec) is list else None
        if hit is not None and hit[0] is spec and hit[1] == raw.get("apiVersion") and hit[2] == raw.get("kind"):
            # the spec was right and has not changed: what is wrong is elsewhere, if anywhere (the
            # first fault of the object is then the first fault of the rest, in the same order)
            rest.append({k: v for k, v in raw.items() if k != "spec"})
            fresh[id(spec)] = hit
        else:
            rest.append(raw)
            todo.append(i)
        where.append(spec)
    out = _problems(rest)
    for i in todo:
        spec = where[i]
        if out[i] is None and (type(spec) is dict or type(spec) is list):
            fresh[id(spec)] = (spec, raws[i].get("apiVersion"), raws[i].get("kind"))
    checked.specs = fresh
    return out


def _problems(raws: list[Any]) -> list[str | None]:
    # lists found right, by identity and item shape, while every value checked is held by `raws` (a
    # store that holds equal lists once, `controller.store`, has the conditions under a route's
    # parents checked once)
    _local.seen = {}
    try:
        out = [object_problem(raw, json=False) for raw in raws]
    finally:
        _local.seen = None
    # one encoding per object, not one of them all: no copy of the whole cluster in memory (130 MB
    # at 50k routes carrying status), and an object with a null (a NaN or an infinity is written
    # as null) is walked without encoding everything a second time
    dumps, error = orjson.dumps, orjson.JSONEncodeError
    outer = _deep(None)
    inner = _local.chains[0][1]
    try:
        for i, raw in enumerate(raws):
            inner[0] = raw
            try:
                encoded = dumps(outer)
            except error:
                encoded = b"null"
            if b"null" in encoded and out[i] is None:
                out[i] = _walk_json(raw, "", 0)
    finally:
        inner[0] = None
    return out


def object_problem(raw: Any, json: bool = True) -> str | None:
    """Why an object cannot be analysed, as `field: what is wrong`, or None when its shape is right.

    The object's apiVersion and kind are checked first, then what the engine reads of its kind
    (policies and unknown kinds: metadata and `status.ancestors`), then (unless `json` is false)
    that JSON can hold it.
    """
    try:
        problem = _shape_problem(raw)
    except RecursionError:  # a JSON Schema nested hundreds of levels deep, in a CRD
        problem = unrepresentable(raw) or "(the object): nests too deeply to check"
    if problem is not None or not json:
        return problem
    return unrepresentable(raw)


def _shape_problem(raw: Any) -> str | None:
    if type(raw) is not dict:
        return f"must be an object, not {describe(raw)}"
    for name in ("apiVersion", "kind"):
        value = raw.get(name)
        if type(value) is not str or not value:
            return f"{name}: is required" if value is None else f"{name}: must be a non-empty string, not {describe(value)}"
    api_version: str = raw["apiVersion"]
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else CORE_GROUP
    checker = _CHECKERS.get((group, raw["kind"]), _OTHER)
    fault = _check_metadata(raw.get("metadata")) or checker(raw)
    if fault is not None:
        return fault.text()
    if not raw["metadata"]["name"]:
        return "metadata.name: must not be empty"
    return None


def unrepresentable(raw: Any) -> str | None:
    """`field: why` for the first value JSON cannot hold exactly, or None.

    The encoder checks most of it at C speed; the walk in Python runs only where it failed or
    where a `null` may hide a NaN or an infinity (which the encoder would write as null).
    """
    try:
        encoded = orjson.dumps(_deep(raw))
    except orjson.JSONEncodeError:
        encoded = b"null"
    finally:
        _deep(None)
    if b"null" not in encoded:
        return None
    return _walk_json(raw, "", 0)


# The encoder stops at 254 levels: checking the value inside 254 - MAX_DEPTH lists makes that limit
# fall at exactly MAX_DEPTH levels of the value. Chains of lists kept per thread, reused.
_WRAP_DEPTH = 254 - MAX_DEPTH
_local = threading.local()


def _deep(value: Any, levels: int = 0) -> list[Any]:
    """The value, `levels` deep already, inside `_WRAP_DEPTH - levels` nested lists (the innermost holds it
    until the next call)."""
    chains = getattr(_local, "chains", None)
    if chains is None:
        chains = _local.chains = {}
    chain = chains.get(levels)
    if chain is None:
        outer: list[Any]
        inner: list[Any]
        outer = inner = [None]
        for _ in range(_WRAP_DEPTH - levels - 1):
            inner[0] = [None]
            inner = inner[0]
        chain = chains[levels] = (outer, inner)
    chain[1][0] = value
    return chain[0]


def _walk_json(value: Any, path: str, depth: int) -> str | None:
    """`depth`: how many objects and lists hold `value`."""
    t = type(value)
    if (t is dict or t is list) and depth >= MAX_DEPTH:
        where = path if len(path) <= 60 else path[:40] + "..." + path[-12:]
        return f"{where or '(the object)'}: nests more than {MAX_DEPTH} levels deep"
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                return f"{path or '(the object)'}: has a key that is not a string ({_show(k)}); JSON keys are strings"
            p = _join(path, k)
            problem = _walk_json(v, p, depth + 1)
            if problem:
                return problem
        return None
    if t is list:
        for i, v in enumerate(value):
            problem = _walk_json(v, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    if t is str or t is bool or value is None or isinstance(value, date):
        return None
    where = path or "(the object)"
    if t is int:
        if _INT_MIN <= value <= _INT_MAX:
            return None
        return f"{where}: the integer {_show(value)} does not fit in 64 bits"
    if t is float:
        return None if math.isfinite(value) else f"{where}: {value} is not a number JSON can hold"
    if isinstance(value, (bytes, bytearray)):
        return f"{where}: binary data (!!binary) is not a JSON value; encode it as a base64 string"
    if isinstance(value, (set, frozenset)):
        return f"{where}: a set (!!set) is not a JSON value; write a list"
    return f"{where}: a {t.__name__} is not a JSON value"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Fault:
    """What is wrong and where: the path's segments are added innermost first, as the checkers return."""

    __slots__ = ("segments", "message")

    def __init__(self, message: str, segment: str | int | None = None) -> None:
        self.message = message
        self.segments: list[str | int | _Key] = [] if segment is None else [segment]

    def at(self, segment: str | int | _Key) -> "_Fault":
        self.segments.append(segment)
        return self

    def text(self) -> str:
        path = ""
        for seg in reversed(self.segments):
            if type(seg) is int:
                path += f"[{seg}]"
            elif type(seg) is _Key:
                path += f"[{seg.key!r}]"
            else:
                path += f".{seg}" if path else str(seg)
        return f"{path or '(the object)'}: {self.message}"


class _Key:
    """A map key that cannot be written after a dot (it holds a dot, or is no string)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


_Checker = Callable[[Any], "_Fault | None"]


def _compile(shape: Shape, done: dict[int, _Checker]) -> _Checker:
    """A function that checks a (non-null) value against `shape`; compiled once per shape, so that
    checking an object costs a few calls per field it has, and nothing is formatted unless it is wrong."""
    if id(shape) in done:
        return done[id(shape)]
    if type(shape) is Lazy:
        target = shape.get()
        holder: list[_Checker] = []
        done[id(shape)] = lambda v: holder[0](v)  # recursive shapes: resolved once compiled
        holder.append(_compile(target, done))
        return holder[0]
    if shape is ANY:
        return lambda v: None
    if type(shape) is dict:
        fields = {key: _compile(sub.shape if type(sub) is Required else sub, done) for key, sub in shape.items()}
        required = tuple(key for key, sub in shape.items() if type(sub) is Required)
        lookup = fields.get
        # the types a field's checker accepts outright, seen without calling it (most fields are strings
        # or integers: at 50k routes carrying status, the calls were most of the check)
        accepted = {key: ok for key, sub in shape.items() if (ok := _accepted_outright(sub))}.get

        def check_object(value: Any) -> _Fault | None:
            if type(value) is not dict:
                return _Fault(_wrong(value, "an object"))
            for key in required:
                if value.get(key) is None:
                    return _Fault("is required", key)
            # the object's own keys, not the shape's: an object sets few of the fields a shape declares
            for key, v in value.items():
                ok = accepted(key)
                if ok is not None and type(v) in ok:
                    continue
                sub = lookup(key)
                if sub is not None and v is not None:
                    fault = sub(v)
                    if fault is not None:
                        return fault.at(key)
            return None
        done[id(shape)] = check_object
        return check_object
    if type(shape) is list:
        item = _compile(shape[0], done)
        items_ok = _accepted_outright(shape[0])

        def check_list(value: Any) -> _Fault | None:
            if type(value) is not list:
                return _Fault(_wrong(value, "a list"))
            if items_ok is not None:
                for v in value:
                    if type(v) not in items_ok:
                        break
                else:
                    return None
            seen = getattr(_local, "seen", None)
            if seen is not None and seen.get(id(value)) is item:
                return None  # the same list, found right under this shape already
            for i, v in enumerate(value):
                fault = _Fault("must not be null") if v is None else item(v)
                if fault is not None:
                    return fault.at(i)
            if seen is not None:
                seen[id(value)] = item
            return None
        done[id(shape)] = check_list
        return check_list
    if type(shape) is MapOf:
        values = _compile(shape.values, done)
        values_ok = _accepted_outright(shape.values)

        def check_map(value: Any) -> _Fault | None:
            if type(value) is not dict:
                return _Fault(_wrong(value, "an object"))
            if values_ok is not None:
                for v in value.values():
                    if type(v) not in values_ok and v is not None:
                        break
                else:
                    return None
            for k, v in value.items():
                if v is None:
                    continue
                fault = values(v)
                if fault is not None:
                    return fault.at(k if type(k) is str and "." not in k else _Key(k))
            return None
        done[id(shape)] = check_map
        return check_map
    types = shape if type(shape) is tuple else (shape,)
    expected = _expected(types)
    if len(types) == 1 and types[0] in (str, int, bool):
        exact = types[0]  # `type(v) is int` also keeps true/false out of an integer

        def check_type(value: Any) -> _Fault | None:
            return None if type(value) is exact else _Fault(_wrong(value, expected))
    else:
        def check_type(value: Any) -> _Fault | None:
            if isinstance(value, types) and (type(value) is not bool or bool in types):
                return None
            return _Fault(_wrong(value, expected))
    done[id(shape)] = check_type
    return check_type


def _accepted_outright(shape: Shape) -> frozenset[type] | None:
    """The exact types that the checker of a type shape accepts (its check_type returns None for
    any value of these types), for checking them inline; None for other shapes."""
    if type(shape) is Required:
        shape = shape.shape
    if type(shape) is type:
        types: tuple = (shape,)
    elif type(shape) is tuple and all(type(t) is type for t in shape):
        types = shape
    else:
        return None
    ok = frozenset(t for t in (str, int, bool, float, dict, list) if t in types)
    return ok or None


_NAMES = {str: "a string", int: "an integer", bool: "true or false", float: "a number", dict: "an object",
          list: "a list", date: "a time"}


def _expected(types: tuple) -> str:
    return " or ".join(_NAMES.get(t, t.__name__) for t in types)


def _wrong(value: Any, expected: str) -> str:
    return f"must be {expected}, not {describe(value)}"


def describe(value: Any) -> str:
    """What a value is, in words, with a short excerpt: `a number (1.5)`, `an object`."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"a number ({_show(value)})"
    if isinstance(value, str):
        return f"a string ({_show(value)})"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, date):
        return f"a time ({value.isoformat()})"
    return f"a {type(value).__name__}"


def _show(value: Any, limit: int = 40) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"{'-' if value < 0 else ''}2^{value.bit_length() - 1} or more"  # str() of a huge int is refused
    text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_target_ref = None


def target_ref_problem(tref: dict[str, Any]) -> str | None:
    """`field: what is wrong` for a policy's targetRef whose fields have the wrong type (a number as
    `sectionName` or `namespace` would otherwise be dropped, and the policy's scope silently widen);
    the policy is then Invalid, naming the field, rather than left out: its author must be told."""
    global _target_ref
    if _target_ref is None:
        _target_ref = _compile(TARGET_REF, _compiled)
    fault = _target_ref(tref)
    return None if fault is None else fault.text()


def spec_schema_of_crd(crd: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of `spec` in a (well-shaped) CRD, of the version the engine merges by: the storage
    version, else the first (as `policies` chooses it)."""
    versions = [v for v in crd["spec"].get("versions") or () if isinstance(v, dict)]
    chosen = next((v for v in versions if v.get("storage")), versions[0] if versions else None)
    schema = ((chosen or {}).get("schema") or {}).get("openAPIV3Schema") or {}
    spec = (schema.get("properties") or {}).get("spec")
    return spec if isinstance(spec, dict) else None


def list_map_problem(value: Any, schema: dict[str, Any], path: str) -> str | None:
    """Where a list the CRD schema declares a map (`x-kubernetes-list-type: map`) has an item whose key
    is not a string, number or boolean: the merge identifies list-map items by their keys (S5.1),
    and a real API server would have refused the object against its schema."""
    if type(value) is dict:
        props = schema.get("properties")
        if not props:
            return None
        for k, v in value.items():
            sub = props.get(k)
            if type(sub) is dict and v is not None:
                problem = list_map_problem(v, sub, f"{path}.{k}")
                if problem:
                    return problem
        return None
    if type(value) is list and schema.get("x-kubernetes-list-type") == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or ()
        for i, item in enumerate(value):
            if type(item) is dict:
                for key in keys:
                    if isinstance(item.get(key), (dict, list)):
                        return (f"{path}[{i}].{key}: must be a string, number or boolean (a key of this list, "
                                f"x-kubernetes-list-map-keys), not {describe(item[key])}")
    return None


_compiled: dict[int, _Checker] = {}
_CHECKERS: dict[tuple[str, str], _Checker] = {key: _compile(shape, _compiled) for key, shape in KIND_SHAPES.items()}
_OTHER = _compile(POLICY_STATUS, _compiled)
_metadata = _compile(METADATA, _compiled)


def _check_metadata(meta: Any) -> _Fault | None:
    fault = _Fault("is required") if meta is None else _metadata(meta)
    return None if fault is None else fault.at("metadata")


def object_label(raw: Any, default_namespace: str | None = None) -> str:
    """`Kind ns/name` of an object as far as it can be told (for messages about a malformed one)."""
    if not isinstance(raw, dict):
        return "object"
    kind = raw.get("kind") if isinstance(raw.get("kind"), str) and raw.get("kind") else "object"
    meta: Any = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
    name = meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else "(no name)"
    ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) and meta.get("namespace") else None
    if ns is None and default_namespace is not None and kind in _NAMESPACED_KINDS:
        ns = default_namespace
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


_NAMESPACED_KINDS = {"Gateway", "HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute", "ReferenceGrant",
                     "Service", "BackendTLSPolicy"}
