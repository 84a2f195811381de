"""Resource types as kubectl accepts them (`httproute`, `httproutes`, `HTTPRoute`, `svc`, `kind.group`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.kinds import KNOWN_KINDS, plural_of
from gwpolicy.engine.refs import Ref


class NotFound(Exception):
    """kubectl's NotFound, printed as `Error: <plural> "<name>" not found`."""


@dataclass(frozen=True)
class ResourceType:
    group: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def qualified(self) -> str:
        """`kind.group` as `-o name` prints it (`httproute.gateway.networking.k8s.io`)."""
        return f"{self.kind.lower()}.{self.group}" if self.group else self.kind.lower()


def known_types(a: Analysis) -> dict[str, ResourceType]:
    """Every name a type may be given by -> the type (known kinds, policy kinds, CRD kinds of the input)."""
    names: dict[str, ResourceType] = {}

    def add(rt: ResourceType, *aliases: str) -> None:
        for alias in (rt.kind.lower(), rt.plural, *aliases):
            names.setdefault(alias.lower(), rt)
            names.setdefault(f"{alias.lower()}.{rt.group}", rt)

    for kind, (group, namespaced, plural, short) in KNOWN_KINDS.items():
        add(ResourceType(group, kind, plural, namespaced), *short)
    for (group, kind), crd in sorted(a.index.crds.items()):
        spec = crd.spec if isinstance(crd.spec, dict) else {}
        n: Any = spec.get("names") if isinstance(spec.get("names"), dict) else {}
        add(ResourceType(group, kind, str(n.get("plural") or plural_of(kind)), spec.get("scope", "Namespaced") == "Namespaced"),
            *(n.get("shortNames") or []), str(n.get("singular") or kind.lower()))
    for (group, kind), pk in sorted(a.kinds.items()):
        objs = a.index.of_kind(group, kind)
        namespaced = objs[0].namespace is not None if objs else True
        add(ResourceType(group, kind, plural_of(kind), namespaced))
    for (group, kind), objs in sorted(a.index.by_kind.items()):
        add(ResourceType(group, kind, plural_of(kind), objs[0].namespace is not None))
    return names


def resolve_type(text: str, a: Analysis) -> ResourceType:
    rt = known_types(a).get(text.lower())
    if rt is None:
        raise NotFound(f'the server doesn\'t have a resource type "{text}"')
    return rt


def split_ref(text: str, name: str | None = None) -> tuple[str, str]:
    """`TYPE/NAME` or `TYPE NAME` -> (type, name)."""
    if "/" in text:
        t, n = text.split("/", 1)
        if not t or not n:
            raise NotFound(f"arguments in resource/name form must have a single resource and name: {text!r}")
        return t, n
    if name is None:
        raise NotFound(f"you must specify the name of the {text}: {text}/NAME")
    return text, name


def find_object(a: Analysis, text: str, namespace: str, name: str | None = None) -> Ref:
    """The object named `TYPE/NAME` (in `namespace` when the type is namespaced)."""
    tname, oname = split_ref(text, name)
    rt = resolve_type(tname, a)
    ref = Ref(rt.group, rt.kind, namespace if rt.namespaced else None, oname)
    if ref in a.index.by_ref or (ref in a.topology.paths):
        return ref
    raise NotFound(f'{rt.plural} "{oname}" not found')
