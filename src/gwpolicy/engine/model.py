"""Input objects as records, and the indexes every later stage looks things up in (by reference)."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Iterable

from gwpolicy.engine.kinds import is_known_namespaced, split_api_version
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.shapes import list_map_problem, object_label, problems, spec_schema_of_crd
from gwpolicy.engine.timestamps import CreationTime, creation_time

#: what `Obj.created` says for an object without a readable creationTimestamp (sorts as the newest);
#: never shown to a user: messages use `Obj.created_at`
NO_TIMESTAMP = "9999-12-31T23:59:59Z"


@dataclass(slots=True, eq=False)
class Obj:
    """One Kubernetes object: identity, the fields every stage reads, and the raw dict."""

    raw: dict[str, Any]
    ref: Ref
    version: str
    origin: str
    _time: CreationTime | None = field(default=None, repr=False)

    @property
    def group(self) -> str:
        return self.ref.group

    @property
    def kind(self) -> str:
        return self.ref.kind

    @property
    def namespace(self) -> str | None:
        return self.ref.namespace

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def metadata(self) -> dict[str, Any]:
        return self.raw["metadata"]

    @property
    def spec(self) -> Any:
        return self.raw.get("spec")

    @property
    def labels(self) -> dict[str, str]:
        labels = self.metadata.get("labels")
        return labels if isinstance(labels, dict) else {}

    @property
    def time(self) -> CreationTime:
        """creationTimestamp read in any form (timestamps.py), once."""
        if self._time is None:
            self._time = creation_time(self.metadata.get("creationTimestamp"))
        return self._time

    @property
    def created_at(self) -> str | None:
        """creationTimestamp as RFC 3339 UTC text; None when it is missing or unreadable."""
        return self.time.text

    @property
    def created(self) -> str:
        """creationTimestamp as RFC 3339 UTC text; NO_TIMESTAMP when missing (for age columns)."""
        return self.time.text or NO_TIMESTAMP

    @property
    def generation(self) -> int | None:
        gen = self.metadata.get("generation")
        return gen if isinstance(gen, int) else None

    @property
    def age_key(self) -> tuple[str, str, str]:
        """S5.4 order: older first (the instant, whatever the zone it was written in; no timestamp is
        newest), then `{namespace}/{name}` alphabetically."""
        return (self.time.sort_key, self.ref.namespace or "", self.ref.name)


@dataclass
class ObjectIndex:
    """All input objects, indexed by reference and by kind; later stages never scan the whole input."""

    by_ref: dict[Ref, Obj] = field(default_factory=dict)
    by_kind: dict[tuple[str, str], list[Obj]] = field(default_factory=dict)
    kind_groups: dict[str, str] = field(default_factory=dict)
    namespaces: set[str] = field(default_factory=set)
    crds: dict[tuple[str, str], Obj] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def of_kind(self, group: str, kind: str) -> list[Obj]:
        return self.by_kind.get((group, kind), [])

    def get(self, ref: Ref) -> Obj | None:
        return self.by_ref.get(ref.object)

    def namespace_exists(self, name: str) -> bool:
        """S4.5: a Namespace object for it is in the input, or any input object lives in it."""
        return name in self.namespaces

    def namespace_labels(self, name: str) -> dict[str, str]:
        obj = self.by_ref.get(Ref("", "Namespace", None, name))
        labels = dict(obj.labels) if obj else {}
        labels.setdefault("kubernetes.io/metadata.name", name)
        return labels


def build_index(raws: Iterable[dict[str, Any]], origins: Iterable[str] | None = None,
                default_namespace: str = "default") -> ObjectIndex:
    """Index objects. Scope comes from known kinds, then CRDs in the input, then the object itself.

    An object of a kind nobody declares is namespaced when it names a namespace, else
    cluster-scoped (the only way a file can show a cluster-scoped custom policy).
    """
    index = ObjectIndex()
    raws, origin_list = well_shaped(list(raws), origins, default_namespace, index.warnings)
    crd_scope: dict[tuple[str, str], bool] = {}
    spec_schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for raw in raws:
        if raw.get("kind") == "CustomResourceDefinition":
            # dicts: mypy does not narrow a `.get()` by the isinstance of a second one
            spec: dict[str, Any] = raw.get("spec") if isinstance(raw.get("spec"), dict) else {}  # type: ignore[assignment]
            names: dict[str, Any] = spec.get("names") if isinstance(spec.get("names"), dict) else {}  # type: ignore[assignment]
            if isinstance(spec.get("group"), str) and isinstance(names.get("kind"), str):
                crd_scope[(spec["group"], names["kind"])] = spec.get("scope", "Namespaced") == "Namespaced"
                schema = spec_schema_of_crd(raw)
                if schema is not None:
                    spec_schemas[(spec["group"], names["kind"])] = schema
                else:
                    spec_schemas.pop((spec["group"], names["kind"]), None)
    # what a few distinct values decide, looked up once each: tens of thousands of objects share a
    # handful of apiVersions and kinds, and a bulk-created cluster its creation times
    versions: dict[str, tuple[str, str]] = {}
    scopes: dict[tuple[str, str], bool | None] = {}
    times: dict[str, CreationTime] = {}
    by_ref, by_kind = index.by_ref, index.by_kind
    for raw, origin in zip(raws, origin_list):
        api_version = raw["apiVersion"]
        gv = versions.get(api_version)
        if gv is None:
            gv = versions[api_version] = split_api_version(api_version)
        group, version = gv
        kind = raw["kind"]
        key = (group, kind)
        schema = spec_schemas.get(key) if spec_schemas else None
        if schema is not None:
            problem = list_map_problem(raw.get("spec"), schema, "spec")
            if problem is not None:
                index.warnings.append(f"{origin}: {object_label(raw, default_namespace)}: {problem}; skipped")
                continue
        meta = raw["metadata"]
        ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) and meta.get("namespace") else None
        if key in scopes:
            namespaced = scopes[key]
        else:
            namespaced = scopes[key] = _declared_scope(group, kind, crd_scope)
        if namespaced is None:
            namespaced = ns is not None
        if namespaced and ns is None:
            ns = default_namespace
        if not namespaced:
            ns = None
        ref = _new_ref(Ref, (group, kind, ns, meta["name"], None))  # in C, not through the Python-level __new__
        stamp = meta.get("creationTimestamp")
        if type(stamp) is str:
            time = times.get(stamp)
            if time is None:
                time = times[stamp] = creation_time(stamp)
        else:
            time = creation_time(stamp)
        if time.problem is not None:
            index.warnings.append(f"{origin}: {kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name}: "
                                  f"metadata.creationTimestamp: {time.problem}; the object counts as the newest")
        elif time.text is not None and meta.get("creationTimestamp") != time.text:
            # RFC 3339 UTC as the API server writes it, in a copy: outputs show one form, JSON can hold it
            meta = dict(meta, creationTimestamp=time.text)
            raw = dict(raw, metadata=meta)
        obj = Obj(raw, ref, version, origin, time)
        old = by_ref.get(ref)
        if old is not None:
            index.warnings.append(f"{origin}: {ref} appears again (first at {old.origin}); the later one is used")
            by_kind[key].remove(old)
        by_ref[ref] = obj
        same_kind = by_kind.get(key)
        if same_kind is None:
            by_kind[key] = [obj]
        else:
            same_kind.append(obj)
        if ns is not None:
            index.namespaces.add(ns)
        if kind == "Namespace" and group == "":
            index.namespaces.add(ref.name)
        if kind == "CustomResourceDefinition":
            spec = raw.get("spec") if isinstance(raw.get("spec"), dict) else {}  # type: ignore[assignment]  # as above
            names = spec.get("names") if isinstance(spec.get("names"), dict) else {}  # type: ignore[assignment]
            if isinstance(spec.get("group"), str) and isinstance(names.get("kind"), str):
                index.crds[(spec["group"], names["kind"])] = obj
    # deterministic per-kind order whatever the input order: by the references themselves (compared
    # in C), unless a kind mixes namespaced and cluster-scoped objects (None and text do not compare)
    for objs in index.by_kind.values():
        try:
            objs.sort(key=_REF)
        except TypeError:
            objs.sort(key=_ref_order)
    groups_of: dict[str, str] = {}
    for group, kind in sorted(index.by_kind):
        groups_of.setdefault(kind, group)
    index.kind_groups = groups_of
    return index


def _declared_scope(group: str, kind: str, crd_scope: dict[tuple[str, str], bool]) -> bool | None:
    """Whether a kind is namespaced, as known kinds or the input's CRDs say; None: the object tells."""
    known = is_known_namespaced(group, kind)
    return known if known is not None else crd_scope.get((group, kind))


_REF = attrgetter("ref")
_new_ref = tuple.__new__


def _ref_order(obj: Obj) -> tuple[str, str, str, str, str]:
    return obj.ref.sort_key()


def well_shaped(raws: list[Any], origins: Iterable[str] | None, default_namespace: str | None,
                warnings: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects whose fields have the shapes the engine reads (`gwpolicy.engine.shapes`), with their
    origins; each other one is reported as `origin: Kind ns/name: field: what is wrong` and left out."""
    origin_list = list(origins) if origins is not None else [f"object {i + 1}" for i in range(len(raws))]
    kept: list[dict[str, Any]] = []
    kept_origins: list[str] = []
    for raw, origin, problem in zip(raws, origin_list, problems(raws)):
        if problem is None:
            kept.append(raw)
            kept_origins.append(origin)
        else:
            warnings.append(f"{origin}: {object_label(raw, default_namespace)}: {problem}; skipped")
    return kept, kept_origins
