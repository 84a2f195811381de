"""Custom resources as kube-apiserver takes them: a CRD version's `openAPIV3Schema` compiled once
into a tree of nodes, then, on every write, unknown fields pruned, nulls dropped, defaults applied,
the structural and value constraints checked and the `x-kubernetes-validations` CEL rules evaluated
(transition rules against the old object), each failure a field error named as the real server
names it (`spec.rules[0].matches[1].path.value: Invalid value: ...`).

CEL is evaluated by cel-expr-python (the CEL project's Python binding of cel-cpp) with its strings
extension and the Kubernetes library functions the Gateway API rules call (`isIP`, ...): see
docs/architecture.md for why this library.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

import orjson

_ABSENT = object()  # no old value at this place (a create, or nothing to correlate with)


@dataclass(frozen=True)
class FieldError:
    """One entry of a Status's details.causes: the field, the reason, and the text after `field: `."""

    field: str
    reason: str
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}" if self.field else self.body


def _shown(value: Any) -> str:
    """A value as kube-apiserver quotes it in `Invalid value: ...`: strings in quotes, objects by type."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return orjson.dumps(value, default=str).decode()


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {detail}")


def type_invalid(path: str, actual: str, want: str | None) -> FieldError:
    return FieldError(path, "FieldValueTypeInvalid",
                      f'Invalid value: "{actual}": {path} in body must be of type {want}: "{actual}"')


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


# ---------- formats kube-apiserver knows (an unknown format is ignored, as there) ----------

_DURATION = re.compile(r"^(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d|w)((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d|w))*$")
_HOSTNAME = re.compile(r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*$")


def _is_datetime(s: str) -> bool:
    try:
        datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
        return "T" in s.upper() or " " in s
    except ValueError:
        return False


def _is_ip(s: str, version: int | None = None) -> bool:
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return False
    return version is None or ip.version == version


def _is_cidr(s: str) -> bool:
    try:
        ipaddress.ip_network(s, strict=False)
        return "/" in s
    except ValueError:
        return False


def _is_uuid(s: str) -> bool:
    try:
        uuid.UUID(s)
        return True
    except ValueError:
        return False


def _is_byte(s: str) -> bool:
    try:
        base64.b64decode(s, validate=True)
        return True
    except ValueError:
        return False


FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": _is_datetime, "datetime": _is_datetime,
    "date": lambda s: bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", s)),
    "duration": lambda s: bool(_DURATION.match(s.replace(" ", ""))),
    "ipv4": lambda s: _is_ip(s, 4), "ipv6": lambda s: _is_ip(s, 6), "cidr": _is_cidr,
    "uuid": _is_uuid, "hostname": lambda s: len(s) <= 255 and bool(_HOSTNAME.match(s)),
    "byte": _is_byte,
}


# ---------- CEL ----------

class CelError(Exception):
    """A rule that does not compile (the CRD is refused, as kube-apiserver refuses it)."""


_ENV: Any = None

# Kubernetes' CEL `format` library (`format.dns1123Label().validate(s) == null`): a format is its name,
# `validate` answers null for a valid string, else the list of what is wrong.
_K8S_FORMATS: dict[str, tuple[Callable[[str], bool], str]] = {
    "dns1123Label": (lambda s: len(s) <= 63 and bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", s)),
                     "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                     "and must start and end with an alphanumeric character"),
    "dns1123Subdomain": (lambda s: len(s) <= 253 and bool(re.fullmatch(
        r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", s)),
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character"),
    "dns1035Label": (lambda s: len(s) <= 63 and bool(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", s)),
                     "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
                     "an alphabetic character, and end with an alphanumeric character"),
    "labelValue": (lambda s: len(s) <= 63 and bool(re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", s)),
                   "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'"),
    "uuid": (_is_uuid, "does not match the UUID format"),
    "byte": (_is_byte, "is not valid base64"),
    "date": (FORMATS["date"], "is not a valid date"),
    "datetime": (_is_datetime, "is not a valid RFC 3339 date-time"),
}


def _cel_env() -> Any:
    """One CEL environment for every rule: `self` and `oldSelf` of any type, the strings extension,
    and the Kubernetes library functions that plain CEL lacks (`isIP`, `isCIDR`, `isURL`, `format.*`)."""
    global _ENV
    if _ENV is None:
        # (cel-expr-python ships neither stubs nor py.typed)
        from cel_expr_python import cel  # type: ignore[import-untyped]
        from cel_expr_python.ext import ext_strings  # type: ignore[import-untyped]

        def overload(name: str, impl: Callable[[str], bool]) -> Any:
            return cel.FunctionDecl(name, [cel.Overload(f"{name}_string", cel.Type.BOOL, [cel.Type.STRING], impl=impl)])

        def validate(fmt: str, s: str) -> list[str] | None:
            check, why = _K8S_FORMATS[fmt]
            return None if check(s) else [why]

        formats = [cel.FunctionDecl(name, [cel.Overload(f"format_{name}", cel.Type.STRING, [cel.Type.STRING],
                                                        is_member=True, impl=lambda _f, name=name: name)])
                   for name in _K8S_FORMATS]
        formats.append(cel.FunctionDecl("validate", [cel.Overload("format_validate", cel.Type.DYN,
                                                                  [cel.Type.STRING, cel.Type.STRING],
                                                                  is_member=True, impl=validate)]))
        _ENV = cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN, "format": cel.Type.STRING},
                          extensions=[ext_strings.ExtStrings()],
                          functions=[overload("isIP", lambda s: _is_ip(s)), overload("isCIDR", _is_cidr),
                                     overload("isURL", lambda s: bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", s))),
                                     *formats])
    return _ENV


@dataclass(frozen=True)
class Rule:
    program: Any
    text: str
    message: str
    reason: str
    field_path: str
    transition: bool  # uses oldSelf: evaluated on updates only, where the old value is known
    message_expression: Any = None  # a CEL program giving the message; `message` when it fails


def _compile_rule(spec: dict[str, Any], where: str) -> Rule:
    text = spec.get("rule")
    if not isinstance(text, str) or not text.strip():
        raise CelError(f"{where}.rule: Required value")
    try:
        program = _cel_env().compile(text)
    except RuntimeError as exc:
        raise CelError(f"{where}.rule: Invalid value: {orjson.dumps(text).decode()}: compilation failed: {exc}") from exc
    message_expression = None
    if isinstance(spec.get("messageExpression"), str):
        try:
            message_expression = _cel_env().compile(spec["messageExpression"])
        except RuntimeError as exc:
            raise CelError(f"{where}.messageExpression: Invalid value: {orjson.dumps(spec['messageExpression']).decode()}: "
                           f"compilation failed: {exc}") from exc
    return Rule(program, text, spec.get("message") or f"failed rule: {text}",
                spec.get("reason") or "FieldValueInvalid", spec.get("fieldPath") or "",
                bool(re.search(r"\boldSelf\b", text)), message_expression)


# ---------- the compiled schema ----------

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


@dataclass
class Node:
    """One schema node, compiled: what to keep, what to default and what to check at this place."""

    type: str | None = None
    nullable: bool = False
    int_or_string: bool = False
    preserve_unknown: bool = False
    embedded: bool = False
    properties: dict[str, "Node"] | None = None
    additional: "Node | bool | None" = None
    items: "Node | None" = None
    required: tuple[str, ...] = ()
    default: Any = _ABSENT
    enum: list[Any] | None = None
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    format: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_min: bool = False
    exclusive_max: bool = False
    multiple_of: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    unique_items: bool = False
    min_properties: int | None = None
    max_properties: int | None = None
    list_type: str | None = None
    map_keys: tuple[str, ...] = ()
    any_of: list["Node"] = field(default_factory=list)
    one_of: list["Node"] = field(default_factory=list)
    all_of: list["Node"] = field(default_factory=list)
    not_: "Node | None" = None
    rules: list[Rule] = field(default_factory=list)


def compile_node(s: Any, where: str = "openAPIV3Schema") -> Node:
    if not isinstance(s, dict):
        return Node(preserve_unknown=True)
    n = Node(type=s.get("type"), nullable=bool(s.get("nullable")),
             int_or_string=bool(s.get("x-kubernetes-int-or-string")),
             preserve_unknown=bool(s.get("x-kubernetes-preserve-unknown-fields")),
             embedded=bool(s.get("x-kubernetes-embedded-resource")),
             required=tuple(s.get("required") or ()), enum=s.get("enum"), format=s.get("format"),
             minimum=s.get("minimum"), maximum=s.get("maximum"), exclusive_min=bool(s.get("exclusiveMinimum")),
             exclusive_max=bool(s.get("exclusiveMaximum")), multiple_of=s.get("multipleOf"),
             min_length=s.get("minLength"), max_length=s.get("maxLength"), min_items=s.get("minItems"),
             max_items=s.get("maxItems"), unique_items=bool(s.get("uniqueItems")),
             min_properties=s.get("minProperties"), max_properties=s.get("maxProperties"),
             list_type=s.get("x-kubernetes-list-type"), map_keys=tuple(s.get("x-kubernetes-list-map-keys") or ()))
    if "default" in s:
        n.default = s["default"]
    if isinstance(s.get("pattern"), str):
        n.pattern_text = s["pattern"]
        try:
            n.pattern = re.compile(s["pattern"])
        except re.error:
            n.pattern = None  # RE2 syntax Python's re lacks (\p{L}, ...): unchecked, rather than a CRD refused
    if isinstance(s.get("properties"), dict):
        n.properties = {k: compile_node(v, f"{where}.properties[{k}]") for k, v in s["properties"].items()}
    add = s.get("additionalProperties")
    if isinstance(add, dict):
        n.additional = compile_node(add, f"{where}.additionalProperties")
    elif isinstance(add, bool):
        n.additional = add
    if isinstance(s.get("items"), dict):
        n.items = compile_node(s["items"], f"{where}.items")
    for key, attr in (("anyOf", "any_of"), ("oneOf", "one_of"), ("allOf", "all_of")):
        if isinstance(s.get(key), list):
            setattr(n, attr, [compile_node(x, f"{where}.{key}[{i}]") for i, x in enumerate(s[key])])
    if isinstance(s.get("not"), dict):
        n.not_ = compile_node(s["not"], f"{where}.not")
    for i, r in enumerate(s.get("x-kubernetes-validations") or []):
        n.rules.append(_compile_rule(r if isinstance(r, dict) else {}, f"{where}.x-kubernetes-validations[{i}]"))
    return n


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(node: Node, value: Any) -> bool:
    if node.int_or_string:
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    t = node.type
    if t is None:
        return True
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    want = _TYPES.get(t)
    return want is None or isinstance(value, want)


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Walk:
    """One pass over an object: prunes and defaults in place, collects errors and unknown fields."""

    def __init__(self, check_rules: bool = True) -> None:
        self.errors: list[FieldError] = []
        self.unknown: list[str] = []
        self.check_rules = check_rules
        self.pending: list[tuple[Node, Any, str, Any]] = []

    def value(self, node: Node, value: Any, path: str, old: Any) -> Any:
        """The value kept at `path` (pruned and defaulted); errors go to self.errors."""
        if value is None:
            if not node.nullable:
                self.errors.append(type_invalid(path, "null", node.type or "object"))
            return value
        if not _type_ok(node, value):
            self.errors.append(type_invalid(path, json_type_name(value), "integer or string" if node.int_or_string else node.type))
            return value
        if isinstance(value, dict) and not node.int_or_string:
            value = self._object(node, value, path, old)
        elif isinstance(value, list):
            value = self._array(node, value, path, old)
        self._constraints(node, value, path, self.errors)
        if self.check_rules and node.rules:
            self.pending.append((node, value, path, old))  # evaluated after the schema, as there
        return value

    def run_rules(self) -> None:
        """The CEL rules, unless the schema found a wrong type or an unsupported value: kube-apiserver
        does not evaluate rules on such an object, and says so."""
        if any(e.reason in ("FieldValueTypeInvalid", "FieldValueNotSupported") for e in self.errors):
            self.errors.append(FieldError("", "FieldValueInvalid", 'Invalid value: "null": some validation rules were not '
                                          "checked because the object was invalid; correct the existing errors to "
                                          "complete validation"))
            return
        for node, value, path, old in self.pending:
            self._rules(node, value, path, old)

    def _object(self, node: Node, value: dict[str, Any], path: str, old: Any) -> dict[str, Any]:
        props = node.properties or {}
        olds = old if isinstance(old, dict) else {}
        out: dict[str, Any] = {}
        for k, v in value.items():
            sub = props.get(k)
            if sub is None and isinstance(node.additional, Node):
                sub = node.additional
            if sub is None:
                if node.preserve_unknown or node.additional is True or (node.properties is None and node.additional is None
                                                                        and node.type != "object"):
                    out[k] = v
                elif path == "" and k in ("apiVersion", "kind", "metadata"):
                    out[k] = v
                else:
                    self.unknown.append(_child(path, k))
                continue
            if v is None and not sub.nullable:
                continue  # a null where null is not allowed is dropped (and defaulted below), as there
            out[k] = v
        for k, sub in props.items():
            if k not in out and sub.default is not _ABSENT:
                out[k] = orjson.loads(orjson.dumps(sub.default))
        for k in list(out):
            sub = props.get(k) or (node.additional if isinstance(node.additional, Node) else None)
            if sub is None or (path == "" and k == "metadata"):
                continue
            out[k] = self.value(sub, out[k], _child(path, k), olds.get(k, _ABSENT) if olds else _ABSENT)
        for k in node.required:
            if k not in out:
                self.errors.append(required(_child(path, k)))
        return out

    def _array(self, node: Node, value: list[Any], path: str, old: Any) -> list[Any]:
        if node.items is None:
            return value
        olds: dict[tuple[Any, ...], Any] = {}
        if node.list_type == "map" and isinstance(old, list):
            olds = {self._map_key(node, o): o for o in old if isinstance(o, dict)}
        out = []
        for i, item in enumerate(value):
            o = olds.get(self._map_key(node, item), _ABSENT) if olds and isinstance(item, dict) else _ABSENT
            if item is None and not node.items.nullable and node.items.default is not _ABSENT:
                item = orjson.loads(orjson.dumps(node.items.default))
            out.append(self.value(node.items, item, f"{path}[{i}]", o))
        k: bytes | tuple[Any, ...]  # an item's encoding (a set) or its map keys (a map)
        if node.list_type == "set" or node.unique_items:
            seen: set[bytes] = set()
            for i, item in enumerate(out):
                k = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
                if k in seen:
                    self.errors.append(FieldError(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {_shown(item)}"))
                seen.add(k)
        elif node.list_type == "map":
            keys: set[tuple[Any, ...]] = set()
            for i, item in enumerate(out):
                if not isinstance(item, dict):
                    continue
                k = self._map_key(node, item)
                if k in keys:
                    shown = orjson.dumps({n: item.get(n) for n in node.map_keys}).decode()
                    self.errors.append(FieldError(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {shown}"))
                keys.add(k)
        return out

    @staticmethod
    def _map_key(node: Node, item: Any) -> tuple[Any, ...]:
        if not isinstance(item, dict):
            return ()
        return tuple(orjson.dumps(item.get(k)) for k in node.map_keys)

    def _constraints(self, node: Node, value: Any, path: str, errors: list[FieldError]) -> None:
        """Value validations (also those of anyOf/oneOf/allOf/not branches, which neither prune nor default)."""
        if node.enum is not None and value not in node.enum:
            allowed = ", ".join(orjson.dumps(e).decode() for e in node.enum)
            errors.append(FieldError(path, "FieldValueNotSupported",
                                     f"Unsupported value: {_shown(value)}: supported values: {allowed}"))
        if isinstance(value, str):
            n = len(value)
            if node.max_length is not None and n > node.max_length:
                errors.append(FieldError(path, "FieldValueTooLong", f"Too long: may not be more than {node.max_length} bytes"))
            if node.min_length is not None and n < node.min_length:
                errors.append(invalid(path, value, f"{path} in body should be at least {node.min_length} chars long"))
            if node.pattern is not None and not node.pattern.search(value):
                errors.append(invalid(path, value, f"{path} in body should match '{node.pattern_text}'"))
            check = FORMATS.get(node.format or "")
            if check is not None and not check(value):
                errors.append(invalid(path, value, f"{path} in body must be of type {node.format}: {_shown(value)}"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if node.minimum is not None and (value <= node.minimum if node.exclusive_min else value < node.minimum):
                errors.append(invalid(path, value, f"{path} in body should be greater than "
                                      f"{'' if node.exclusive_min else 'or equal to '}{_num(node.minimum)}"))
            if node.maximum is not None and (value >= node.maximum if node.exclusive_max else value > node.maximum):
                errors.append(invalid(path, value, f"{path} in body should be less than "
                                      f"{'' if node.exclusive_max else 'or equal to '}{_num(node.maximum)}"))
            if node.multiple_of and (value / node.multiple_of) % 1:
                errors.append(invalid(path, value, f"{path} in body should be a multiple of {_num(node.multiple_of)}"))
        elif isinstance(value, list):
            if node.max_items is not None and len(value) > node.max_items:
                errors.append(FieldError(path, "FieldValueTooMany",
                                         f"Too many: {len(value)}: must have at most {node.max_items} items"))
            if node.min_items is not None and len(value) < node.min_items:
                errors.append(invalid(path, len(value), f"{path} in body should have at least {node.min_items} items"))
        elif isinstance(value, dict):
            if node.max_properties is not None and len(value) > node.max_properties:
                errors.append(FieldError(path, "FieldValueTooMany",
                                         f"Too many: {len(value)}: must have at most {node.max_properties} items"))
            if node.min_properties is not None and len(value) < node.min_properties:
                errors.append(invalid(path, value, f"{path} in body should have at least {node.min_properties} properties"))
        for branch in node.all_of:
            self._branch(branch, value, path, errors)
        if node.any_of:
            tries = [self._branch_errors(b, value, path) for b in node.any_of]
            if all(tries):
                # (mypy solves min's type from extend's Iterable, which len does not take; tries is a list of lists)
                errors.extend(min(tries, key=len))  # type: ignore[arg-type]
                errors.append(invalid(path, value, f"{path} in body must validate at least one schema (anyOf)"))
        if node.one_of:
            tries = [self._branch_errors(b, value, path) for b in node.one_of]
            passed = sum(1 for t in tries if not t)
            if passed != 1:
                if passed == 0:
                    errors.extend(min(tries, key=len))  # type: ignore[arg-type]  # (as for anyOf above)
                errors.append(invalid(path, value, f"{path} in body must validate one and only one schema (oneOf)"))
        if node.not_ is not None and not self._branch_errors(node.not_, value, path):
            errors.append(invalid(path, value, f"{path} in body should not validate the schema (not)"))

    def _branch_errors(self, node: Node, value: Any, path: str) -> list[FieldError]:
        errs: list[FieldError] = []
        self._branch(node, value, path, errs)
        return errs

    def _branch(self, node: Node, value: Any, path: str, errors: list[FieldError]) -> None:
        if value is not None and (node.type or node.int_or_string) and not _type_ok(node, value):
            errors.append(invalid(path, json_type_name(value), f"{path} in body must be of type {node.type}"))
            return
        self._constraints(node, value, path, errors)
        if isinstance(value, dict) and node.properties:
            for k, sub in node.properties.items():
                if k in value:
                    self._branch(sub, value[k], _child(path, k), errors)
        if isinstance(value, dict):
            for k in node.required:
                if k not in value:
                    errors.append(required(_child(path, k)))
        if isinstance(value, list) and node.items is not None:
            for i, item in enumerate(value):
                self._branch(node.items, item, f"{path}[{i}]", errors)

    def _rules(self, node: Node, value: Any, path: str, old: Any) -> None:
        data = {"self": value, "format": "format"}
        if old is not _ABSENT:
            data["oldSelf"] = old
        activation = _cel_env().Activation(data=data)  # converted once for all the node's rules
        for rule in node.rules:
            if rule.transition and old is _ABSENT:
                continue
            try:
                result = rule.program.eval(activation)
                out = result.plain_value()
                failed_eval = result.type().name() == "error"
            except Exception as exc:  # noqa: BLE001 - the library's error is the message
                out, failed_eval = str(exc), True
            where = path + rule.field_path if rule.field_path else path
            shown = node.type or json_type_name(value)
            if failed_eval or not isinstance(out, bool):
                self.errors.append(FieldError(where, "FieldValueInvalid",
                                              f'Invalid value: "{shown}": rule evaluation error: {rule.text}: {out}'))
            elif not out:
                message = rule.message
                if rule.message_expression is not None:
                    try:
                        got = rule.message_expression.eval(activation).plain_value()
                        if isinstance(got, str) and got.strip():
                            message = got
                    except Exception:  # noqa: BLE001 - kube-apiserver falls back to `message` too
                        pass
                self.errors.append(_rule_error(where, dataclasses.replace(rule, message=message), shown))


def _rule_error(path: str, rule: Rule, shown: str) -> FieldError:
    if rule.reason == "FieldValueRequired":
        return FieldError(path, rule.reason, f"Required value: {rule.message}")
    if rule.reason == "FieldValueForbidden":
        return FieldError(path, rule.reason, f"Forbidden: {rule.message}")
    if rule.reason == "FieldValueDuplicate":
        return FieldError(path, rule.reason, f'Duplicate value: "{shown}": {rule.message}')
    return FieldError(path, "FieldValueInvalid", f'Invalid value: "{shown}": {rule.message}')


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass
class Outcome:
    obj: dict[str, Any]
    errors: list[FieldError]
    unknown: list[str]


class CompiledSchema:
    """A CRD version's schema, compiled once (when the CRD is written), applied on every write."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = compile_node(schema)

    def admit(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> Outcome:
        """Prune, default and validate `obj` (`old`: the stored object an update replaces)."""
        walk = Walk()
        out = walk.value(self.root, obj, "", old if old is not None else _ABSENT)
        walk.run_rules()
        return Outcome(out if isinstance(out, dict) else obj, walk.errors, walk.unknown)


_COMPILED: dict[bytes, CompiledSchema] = {}


def crd_schemas(crd: dict[str, Any]) -> dict[str, CompiledSchema]:
    """Every served version's compiled schema; CelError when a rule or pattern does not compile.
    A schema already compiled (the CRD checked before it is stored, then registered) is not again."""
    out = {}
    spec = crd.get("spec") or {}
    top = (spec.get("validation") or {}).get("openAPIV3Schema")
    for i, v in enumerate(spec.get("versions") or []):
        schema = (v.get("schema") or {}).get("openAPIV3Schema") or top
        if isinstance(schema, dict) and v.get("served", True):
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
            try:
                if key not in _COMPILED:
                    if len(_COMPILED) > 256:
                        _COMPILED.clear()
                    _COMPILED[key] = CompiledSchema(schema)
                out[v["name"]] = _COMPILED[key]
            except CelError as exc:
                raise CelError(f"spec.versions[{i}].schema.{exc}") from exc
    return out
