"""The resource types the sandbox serves: built-ins, and whatever CustomResourceDefinitions add."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gwpolicy.sandbox.schema import CompiledSchema, crd_schemas


@dataclass(frozen=True)
class Resource:
    group: str
    versions: tuple[str, ...]
    kind: str
    plural: str
    singular: str
    namespaced: bool
    status_subresource: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, Any], ...] = ()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def api_version(self, version: str | None = None) -> str:
        v = version or self.versions[0]
        return f"{self.group}/{v}" if self.group else v

    def to_api_resource(self) -> list[dict[str, Any]]:
        """APIResourceList entries: the resource and its status subresource."""
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        main: dict[str, Any] = {"name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
                                "kind": self.kind, "verbs": verbs}
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        out = [main]
        if self.status_subresource:
            out.append({"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced,
                        "kind": self.kind, "verbs": ["get", "patch", "update"]})
        return out


BUILTINS = (
    Resource("", ("v1",), "Namespace", "namespaces", "namespace", False, True, ("ns",)),
    Resource("", ("v1",), "Service", "services", "service", True, True, ("svc",), ("all",)),
    Resource("", ("v1",), "Secret", "secrets", "secret", True, False),
    Resource("", ("v1",), "ConfigMap", "configmaps", "configmap", True, False, ("cm",)),
    Resource("", ("v1",), "ServiceAccount", "serviceaccounts", "serviceaccount", True, False, ("sa",)),
    Resource("", ("v1",), "Event", "events", "event", True, False, ("ev",)),
    Resource("apiextensions.k8s.io", ("v1",), "CustomResourceDefinition", "customresourcedefinitions",
             "customresourcedefinition", False, True, ("crd", "crds")),
    Resource("coordination.k8s.io", ("v1",), "Lease", "leases", "lease", True, False),
    Resource("rbac.authorization.k8s.io", ("v1",), "ClusterRole", "clusterroles", "clusterrole", False, False),
    Resource("rbac.authorization.k8s.io", ("v1",), "ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", False, False),
    Resource("apps", ("v1",), "Deployment", "deployments", "deployment", True, True, ("deploy",), ("all",)),
    Resource("rbac.authorization.k8s.io", ("v1",), "Role", "roles", "role", True, False),
    Resource("rbac.authorization.k8s.io", ("v1",), "RoleBinding", "rolebindings", "rolebinding", True, False),
    # stored and served, not enforced (deploy/ and the Gateway API bundle apply them)
    Resource("admissionregistration.k8s.io", ("v1",), "ValidatingAdmissionPolicy", "validatingadmissionpolicies",
             "validatingadmissionpolicy", False, True, (), ("api-extensions",)),
    Resource("admissionregistration.k8s.io", ("v1",), "ValidatingAdmissionPolicyBinding",
             "validatingadmissionpolicybindings", "validatingadmissionpolicybinding", False, False, (), ("api-extensions",)),
    Resource("admissionregistration.k8s.io", ("v1",), "ValidatingWebhookConfiguration",
             "validatingwebhookconfigurations", "validatingwebhookconfiguration", False, False, (), ("api-extensions",)),
    Resource("admissionregistration.k8s.io", ("v1",), "MutatingWebhookConfiguration",
             "mutatingwebhookconfigurations", "mutatingwebhookconfiguration", False, False, (), ("api-extensions",)),
    # what a gateway reads to find a Service's endpoints (kube-apiserver serves it; no status subresource)
    Resource("discovery.k8s.io", ("v1",), "EndpointSlice", "endpointslices", "endpointslice", True, False),
)


@dataclass
class Registry:
    """Resources by (group, plural) and by (group, kind); CRDs add and remove theirs."""

    by_plural: dict[tuple[str, str], Resource] = field(default_factory=dict)
    by_kind: dict[tuple[str, str], Resource] = field(default_factory=dict)
    from_crd: dict[str, tuple[str, str]] = field(default_factory=dict)  # CRD name -> (group, plural)
    schemas: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    validators: dict[tuple[str, str], dict[str, CompiledSchema]] = field(default_factory=dict)  # per served version

    def __post_init__(self) -> None:
        for r in BUILTINS:
            self.add(r)

    def add(self, r: Resource) -> None:
        self.by_plural[(r.group, r.plural)] = r
        self.by_kind[(r.group, r.kind)] = r

    def remove(self, group: str, plural: str) -> None:
        r = self.by_plural.pop((group, plural), None)
        if r is not None:
            self.by_kind.pop((r.group, r.kind), None)

    def apply_crd(self, crd: dict[str, Any], deleted: bool = False) -> None:
        name = crd["metadata"]["name"]
        old = self.from_crd.pop(name, None)
        if old:
            self.remove(*old)
            self.schemas.pop(old, None)
            self.validators.pop(old, None)
        if deleted:
            return
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
        if not versions or not names.get("kind") or not names.get("plural"):
            return
        storage = next((v for v in versions if v.get("storage")), versions[0])
        ordered = [storage["name"]] + [v["name"] for v in versions if v["name"] != storage["name"]]
        r = Resource(spec["group"], tuple(ordered), names["kind"], names["plural"],
                     names.get("singular") or names["kind"].lower(), spec.get("scope", "Namespaced") == "Namespaced",
                     bool((storage.get("subresources") or {}).get("status") is not None),
                     tuple(names.get("shortNames") or ()), tuple(names.get("categories") or ()),
                     tuple(storage.get("additionalPrinterColumns") or ()))
        self.add(r)
        self.from_crd[name] = (r.group, r.plural)
        schema = (storage.get("schema") or {}).get("openAPIV3Schema")
        if isinstance(schema, dict):
            self.schemas[(r.group, r.plural)] = schema
        self.validators[(r.group, r.plural)] = crd_schemas(crd)  # compiled once per CRD write (and cached)

    def groups(self) -> dict[str, list[str]]:
        """Group -> served versions (preferred first), for /apis."""
        out: dict[str, list[str]] = {}
        for r in self.by_plural.values():
            if r.group:
                vs = out.setdefault(r.group, [])
                for v in r.versions:
                    if v not in vs:
                        vs.append(v)
        return out

    def in_version(self, group: str, version: str) -> list[Resource]:
        return sorted((r for r in self.by_plural.values() if r.group == group and version in r.versions),
                      key=lambda r: r.plural)
