"""Policy kinds and policy objects: recognition (S2.1), classes and stanzas (S2.3), descriptors (S7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref

POLICY_LABEL = "gateway.networking.k8s.io/policy"
STRATEGIES = ("FieldMerge", "Atomic", "Patch", "None")
STANZAS = (("overrides", "override"), ("defaults", "default"))
TARGET_FIELDS = ("targetRef", "targetRefs")


@dataclass(frozen=True)
class FieldMapping:
    """S7: a setting that controls a field of the target (rule 4 of S5.2)."""

    setting: tuple[str, ...]
    target_group: str
    target_kind: str
    field: tuple[str, ...]


@dataclass
class PolicyKind:
    """What is known about one policy kind and how it was recognised."""

    group: str
    kind: str
    recognized_by: str  # descriptor | crd-label | built-in | name-heuristic
    attachment: str | None = None  # Inherited | Direct | None (undeclared)
    strategy: str = "FieldMerge"
    status_ancestor: str = "Target"
    target_kinds: tuple[tuple[str, str], ...] | None = None
    field_mappings: tuple[FieldMapping, ...] = ()
    schema: dict[str, Any] | None = None  # the CRD's openAPIV3Schema, when the input has the CRD
    warnings: list[str] = field(default_factory=list)
    # a data plane's check of a policy's spec (e.g. the gateway's unsupported fields): a message
    # makes the policy Invalid, so it contributes nothing anywhere (set by analyse(kind_checks=))
    check: Callable[[dict[str, Any]], str | None] | None = None
    # (group, kind), built once: it is read for every item of the output and every merge. A field,
    # not a cached property: the compiled core reads a field directly, a property by name
    key: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = (self.group, self.kind)

    def to_json(self) -> dict[str, str]:
        return {"group": self.group, "kind": self.kind}


def _crd_schema(crd: Obj, version: str | None = None) -> dict[str, Any] | None:
    spec = crd.spec if isinstance(crd.spec, dict) else {}
    versions = [v for v in spec.get("versions") or [] if isinstance(v, dict)]
    chosen = next((v for v in versions if v.get("name") == version), None) if version else None
    chosen = chosen or next((v for v in versions if v.get("storage")), None) or (versions[0] if versions else None)
    schema = ((chosen or {}).get("schema") or {}).get("openAPIV3Schema")
    return schema if isinstance(schema, dict) else None


def build_kinds(index: ObjectIndex) -> dict[tuple[str, str], PolicyKind]:
    """Every policy kind of the input, recognised in the order of S2.1."""
    kinds: dict[tuple[str, str], PolicyKind] = {}
    for obj in index.of_kind("gwpolicy.io", "PolicyKind"):
        spec = obj.spec if isinstance(obj.spec, dict) else {}
        group, kind = spec.get("group"), spec.get("kind")
        if not isinstance(group, str) or not isinstance(kind, str) or not kind:
            index.warnings.append(f"{obj.origin}: PolicyKind {obj.name}: spec.group and spec.kind are required; ignored")
            continue
        pk = PolicyKind(group, kind, "descriptor")
        _apply_descriptor(pk, spec, obj)
        kinds[pk.key] = pk
    btls = (GATEWAY_GROUP, "BackendTLSPolicy")
    if btls not in kinds:  # built in, second only to a descriptor: its own labelled CRD does not change it
        kinds[btls] = PolicyKind(GATEWAY_GROUP, "BackendTLSPolicy", "built-in", attachment="Direct",
                                 strategy="None", status_ancestor="Gateway",
                                 target_kinds=((CORE_GROUP, "Service"),))
    for key, crd in index.crds.items():
        value = crd.labels.get(POLICY_LABEL)
        if key in kinds:  # a descriptor or a built-in kind: the CRD gives only its schema
            kinds[key].schema = _crd_schema(crd)
            continue
        if isinstance(value, str) and value.lower() in ("inherited", "direct", "true"):
            attachment = {"inherited": "Inherited", "direct": "Direct"}.get(value.lower())
            kinds[key] = PolicyKind(key[0], key[1], "crd-label", attachment=attachment, schema=_crd_schema(crd))
    for (group, kind), objs in index.by_kind.items():
        if (group, kind) in kinds or not kind.endswith("Policy"):
            continue
        if any(isinstance(o.spec, dict) and any(f in o.spec for f in TARGET_FIELDS) for o in objs):
            kind_crd = index.crds.get((group, kind))
            kinds[(group, kind)] = PolicyKind(group, kind, "name-heuristic", schema=_crd_schema(kind_crd) if kind_crd else None)
    return kinds


def _apply_descriptor(pk: PolicyKind, spec: dict[str, Any], obj: Obj) -> None:
    where = f"PolicyKind {obj.name}"
    attachment = spec.get("attachment")
    if attachment in ("Inherited", "Direct"):
        pk.attachment = attachment
    elif attachment is not None:
        pk.warnings.append(f"{where}: spec.attachment {attachment!r} is not Inherited or Direct; ignored")
    strategy = spec.get("mergeStrategy", "FieldMerge")
    if strategy in STRATEGIES:
        pk.strategy = strategy
    else:
        pk.warnings.append(f"{where}: spec.mergeStrategy {strategy!r} is not one of {', '.join(STRATEGIES)}; using FieldMerge")
    anc = spec.get("statusAncestor", "Target")
    if anc in ("Target", "Gateway"):
        pk.status_ancestor = anc
    else:
        pk.warnings.append(f"{where}: spec.statusAncestor {anc!r} is not Target or Gateway; using Target")
    tk = spec.get("targetKinds")
    if isinstance(tk, list):
        pk.target_kinds = tuple((t.get("group") or "", t["kind"]) for t in tk if isinstance(t, dict) and isinstance(t.get("kind"), str))
    mappings = []
    for m in spec.get("fieldMappings") or []:
        if not isinstance(m, dict) or not isinstance(m.get("setting"), str) or not isinstance(m.get("field"), str):
            pk.warnings.append(f"{where}: spec.fieldMappings entries need setting and field; one ignored")
            continue
        # a dict: mypy does not narrow a `.get()` by the isinstance of a second one
        tkind: dict[str, Any] = m.get("targetKind") if isinstance(m.get("targetKind"), dict) else {}  # type: ignore[assignment]
        mappings.append(FieldMapping(tuple(m["setting"].split(".")), tkind.get("group") or "",
                                     str(tkind.get("kind", "")), tuple(m["field"].split("."))))
    pk.field_mappings = tuple(mappings)


@dataclass(slots=True)
class Policy:
    """One policy object as the engine sees it: class, stanzas with their settings, targets."""

    obj: Obj
    kind: PolicyKind
    cls: str  # inherited | direct
    stanzas: dict[str, dict[str, Any]]  # overrides / defaults / direct -> settings
    target_refs: list[dict[str, Any]]
    target_field: str  # spec.targetRef or spec.targetRefs
    invalid: str | None = None  # a reason that makes the whole policy Invalid

    @property
    def ref(self) -> Ref:
        return self.obj.ref


def parse_policy(obj: Obj, kind: PolicyKind) -> Policy:
    """Read class, stanzas and targets; whatever is malformed makes the policy Invalid with a reason."""
    spec = obj.spec
    if not isinstance(spec, dict):
        return Policy(obj, kind, "direct", {}, [], "spec", invalid="spec: must be an object")
    invalid = None
    # targets (S2.2)
    has_one, has_many = "targetRef" in spec, "targetRefs" in spec
    targets: list[dict[str, Any]] = []
    target_field = "spec.targetRefs" if has_many else "spec.targetRef"
    if has_one and has_many:
        invalid = "spec.targetRef and spec.targetRefs are both set; use one of them"
    elif has_one:
        if isinstance(spec["targetRef"], dict):
            targets = [spec["targetRef"]]
        else:
            invalid = "spec.targetRef: must be an object with group, kind and name"
    elif has_many:
        refs = spec["targetRefs"]
        if not isinstance(refs, list) or not refs:
            invalid = "spec.targetRefs: must list 1 to 16 targets; it is empty"
        elif len(refs) > 16:
            invalid = f"spec.targetRefs: lists {len(refs)} targets; at most 16 are allowed"
        elif not all(isinstance(r, dict) for r in refs):
            invalid = "spec.targetRefs: every entry must be an object with group, kind and name"
        else:
            targets = list(refs)
    else:
        invalid = "spec: has neither targetRef nor targetRefs, so the policy targets nothing"
    # stanzas (S2.3)
    found: dict[str, dict[str, Any]] = {}
    for canonical, other in STANZAS:
        if canonical in spec and other in spec:
            invalid = invalid or f"spec.{other} and spec.{canonical} are both set; spell the stanza one way"
        key = canonical if canonical in spec else other if other in spec else None
        if key is None:
            continue
        value = spec[key]
        if value is None:
            value = {}
        if not isinstance(value, dict):
            invalid = invalid or f"spec.{key}: must be an object of settings"
            value = {}
        found[canonical] = value
    direct_only = kind.attachment == "Direct" or kind.strategy == "None"
    if found:
        cls = "inherited"
        if direct_only:
            why = "its kind is Direct" if kind.attachment == "Direct" else "its kind uses mergeStrategy None"
            invalid = invalid or f"spec.{next(iter(found))}: a stanza is not allowed because {why}"
        elif kind.strategy in ("Atomic", "Patch") and len(found) > 1:
            invalid = invalid or f"spec: holds both overrides and defaults, but mergeStrategy {kind.strategy} allows one stanza"
        stanzas = found
    elif kind.attachment == "Inherited" and not direct_only:
        cls = "inherited"
        stanzas = {"defaults": {k: v for k, v in spec.items() if k not in TARGET_FIELDS}}
    else:
        cls = "direct"
        stanzas = {"direct": {k: v for k, v in spec.items() if k not in TARGET_FIELDS}}
    if invalid is None and kind.check is not None:
        invalid = kind.check(spec)
    return Policy(obj, kind, cls, stanzas, targets, target_field, invalid)


def policy_objects(index: ObjectIndex, kinds: dict[tuple[str, str], PolicyKind]) -> list[Policy]:
    """Every object of a recognised policy kind, oldest first (S5.4 order)."""
    out = []
    for key, pk in kinds.items():
        for obj in index.of_kind(*key):
            if pk.recognized_by == "name-heuristic" and not (isinstance(obj.spec, dict) and any(f in obj.spec for f in TARGET_FIELDS)):
                continue
            out.append(parse_policy(obj, pk))
    out.sort(key=lambda p: (p.obj.age_key, p.ref.kind, p.ref.group))
    return out
