"""Kubernetes object names, as kube-apiserver checks them (k8s.io/apimachinery/pkg/util/validation).

gwpolicy checks every name it reads from a reference itself, not only the API server: `render -f`
reads files nobody validated, a cluster may run CRDs without CEL or without a validating webhook,
and a Gateway API `ObjectName` (backendRefs, caCertificateRefs, certificateRefs) has no pattern in
the CRDs at all. A name that breaks the rule of its kind cannot name an object of that kind, so a
reference that holds one is answered as one to an object that does not exist, with the name
`repr()`-ed (a line break or a quote in it stays visible and inert in a message).
"""

from __future__ import annotations

import re

#: a DNS-1123 label (IsDNS1123Label): Namespaces and Services (and, relaxed, Services everywhere)
LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
#: a DNS-1123 subdomain (IsDNS1123Subdomain): the name of most kinds (ConfigMap, Secret, routes)
SUBDOMAIN = LABEL + r"(\." + LABEL + ")*"
LABEL_MAX, SUBDOMAIN_MAX = 63, 253

_LABEL = re.compile(LABEL)
_SUBDOMAIN = re.compile(SUBDOMAIN)

#: kinds whose names are labels; every other kind's are subdomains. kube-apiserver holds Service
#: names to DNS-1035 labels (a letter first) or, with RelaxedServiceNameValidation, DNS-1123 labels;
#: the second is the wider rule and still has only [a-z0-9-], which is what matters here
LABEL_KINDS = frozenset({"Namespace", "Service"})


def is_label(name: object) -> bool:
    return isinstance(name, str) and len(name) <= LABEL_MAX and _LABEL.fullmatch(name) is not None


def is_subdomain(name: object) -> bool:
    return isinstance(name, str) and len(name) <= SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(name) is not None


def name_problem(kind: str, name: object) -> str | None:
    """Why `name` cannot be the name of an object of `kind` (None: it can)."""
    if kind in LABEL_KINDS:
        if is_label(name):
            return None
        return (f"{name!r} is not a valid {kind} name (a lowercase RFC 1123 label of at most {LABEL_MAX} characters: "
                "a-z, 0-9 and '-', starting and ending with a letter or digit), so no such object exists")
    if is_subdomain(name):
        return None
    return (f"{name!r} is not a valid {kind} name (a lowercase RFC 1123 subdomain of at most {SUBDOMAIN_MAX} "
            "characters: a-z, 0-9, '-' and '.', each part starting and ending with a letter or digit), so no such "
            "object exists")


def reference_problem(kind: str, namespace: object, name: object) -> str | None:
    """Why a reference to `kind` `namespace`/`name` cannot name an object (None: it can). A None
    namespace is a cluster-scoped kind's."""
    if namespace is not None:
        why = name_problem("Namespace", namespace)
        if why is not None:
            return f"namespace {why}"
    return name_problem(kind, name)
