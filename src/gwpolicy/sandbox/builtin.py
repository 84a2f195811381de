"""The built-in kinds as kube-apiserver takes them: decoded into their Go types (gotypes.py: a wrong
type is 400 BadRequest, unknown fields per `fieldValidation`), defaulted, then validated as
pkg/apis/*/validation does (422 Invalid, one `details.causes` entry per field, in its words).

Each kind is one table (KINDS): its name rule, what is required, the checks per field path, the
fields immutable after creation, the defaults, and the few rules that span fields. A path pattern
reads `spec.ports[*].port` (every item of a list) or `data{}` (every key of a map).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import orjson

from gwpolicy.engine import names
from gwpolicy.sandbox.schema import FieldError, required

Check = Callable[[str, Any], list[FieldError]]  # (path, value) -> errors
Rule = Callable[[dict[str, Any], "dict[str, Any] | None"], list[FieldError]]  # (object, old) -> errors


# ---------- the error kinds of k8s.io/apimachinery/pkg/util/validation/field ----------

def go_value(v: Any) -> str:
    """A value as field.Error prints it (%q for strings, %v for numbers, Go syntax for lists)."""
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "[]string{" + ", ".join(orjson.dumps(x).decode() for x in v) + "}" if v else "[]string(nil)"
    if isinstance(v, bool):
        return "true" if v else "false"
    return orjson.dumps(v).decode() if isinstance(v, str) else str(v)


def bad(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {detail}")


def not_supported(path: str, value: Any, allowed: tuple[str, ...]) -> FieldError:
    return FieldError(path, "FieldValueNotSupported", f"Unsupported value: {go_value(value)}: supported values: "
                      + ", ".join(f'"{a}"' for a in allowed))


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, "FieldValueForbidden", f"Forbidden: {detail}")


def duplicate(path: str, shown: str) -> FieldError:
    return FieldError(path, "FieldValueDuplicate", f"Duplicate value: {shown}")


def too_long(path: str, most: int, unit: str = "bytes") -> FieldError:
    return FieldError(path, "FieldValueTooLong", f"Too long: may not be more than {most} {unit}")


# ---------- the formats of k8s.io/apimachinery/pkg/util/validation ----------

_LABEL = names.LABEL
_SUBDOMAIN = names.SUBDOMAIN
_DNS1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_CONFIG_KEY = "[-._a-zA-Z0-9]+"
_QUALIFIED = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"


def _regex_msg(what: str, examples: tuple[str, ...], regex: str) -> str:
    shown = ",  or ".join(f"'{e}'" for e in examples)
    return f"{what} (e.g. {shown}, regex used for validation is '{regex}')"


DNS1123_LABEL_MSG = _regex_msg("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                               "and must start and end with an alphanumeric character", ("my-name", "123-abc"), _LABEL)
DNS1123_SUBDOMAIN_MSG = _regex_msg("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                                   "'-' or '.', and must start and end with an alphanumeric character",
                                   ("example.com",), _SUBDOMAIN)
DNS1035_MSG = _regex_msg("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                         "alphabetic character, and end with an alphanumeric character", ("my-name", "abc-123"), _DNS1035)
CONFIG_KEY_MSG = _regex_msg("a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                            ("key.name", "KEY_NAME", "key-name"), _CONFIG_KEY)
QUALIFIED_MSG = _regex_msg("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                           "end with an alphanumeric character", ("MyName", "my.name", "123-abc"), _QUALIFIED)
LABEL_VALUE_MSG = _regex_msg("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
                             "or '.', and must start and end with an alphanumeric character",
                             ("MyValue", "my_value", "12345"), _LABEL_VALUE)


def _why(v: str, regex: str, most: int, message: str) -> list[str]:
    """What IsDNS1123Label and its kin say of `v` (nothing when it is valid)."""
    out = [f"must be no more than {most} characters"] if len(v) > most else []
    return out + ([] if re.fullmatch(regex, v) else [message])


def why_label(v: str) -> list[str]:
    return _why(v, _LABEL, 63, DNS1123_LABEL_MSG)


def why_subdomain(v: str) -> list[str]:
    return _why(v, _SUBDOMAIN, 253, DNS1123_SUBDOMAIN_MSG)


def why_dns1035(v: str) -> list[str]:
    return _why(v, _DNS1035, 63, DNS1035_MSG)


def dns1123_label(path: str, v: Any) -> list[FieldError]:
    return [bad(path, v, w) for w in why_label(v)]


def dns1123_subdomain(path: str, v: Any) -> list[FieldError]:
    return [bad(path, v, w) for w in why_subdomain(v)]


def dns1035_label(path: str, v: Any) -> list[FieldError]:
    return [bad(path, v, w) for w in why_dns1035(v)]


def path_segment(path: str, v: Any) -> list[FieldError]:
    """RBAC names: anything a URL path segment can hold (`system:controller:x` is a valid name)."""
    if v in (".", ".."):
        return [bad(path, v, f"may not be '{v}'")]
    return [bad(path, v, f"may not contain '{c}'") for c in "/%" if c in v]


def config_key(path: str, v: Any) -> list[FieldError]:
    out = []
    if len(v) > 253:
        out.append(bad(path, v, "must be no more than 253 characters"))
    if not re.fullmatch(_CONFIG_KEY, v):
        out.append(bad(path, v, CONFIG_KEY_MSG))
    if v == ".":
        out.append(bad(path, v, "must not be '.'"))
    elif v == "..":
        out.append(bad(path, v, "must not be '..'"))
    elif v.startswith(".."):
        out.append(bad(path, v, "must not start with '..'"))
    return out


def port_number(path: str, v: Any) -> list[FieldError]:
    return [] if 1 <= v <= 65535 else [bad(path, v, "must be between 1 and 65535, inclusive")]


def port_name(path: str, v: Any) -> list[FieldError]:
    """IsValidPortName: an IANA service name."""
    why = []
    if len(v) > 15:
        why.append("must be no more than 15 characters")
    if not re.fullmatch("[-a-z0-9]+", v):
        why.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", v):
        why.append("must contain at least one letter (a-z)")
    if "--" in v:
        why.append("must not contain consecutive hyphens")
    if v.startswith("-") or v.endswith("-"):
        why.append("must not begin or end with a hyphen")
    return [bad(path, v, w) for w in why]


def port_number_or_name(path: str, v: Any) -> list[FieldError]:
    return port_name(path, v) if isinstance(v, str) else port_number(path, v)


def ip_address(family: int | None = None) -> Check:
    def check(path: str, v: Any) -> list[FieldError]:
        try:
            ip = ipaddress.ip_address(v)
        except ValueError:
            ip = None
        if family is None:
            return [] if ip is not None else [bad(path, v, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)")]
        if ip is None or ip.version != family:
            return [bad(path, v, f"must be a valid IPv{family} address")]
        return []
    return check


def one_of(*allowed: str) -> Check:
    def check(path: str, v: Any) -> list[FieldError]:
        return [] if v in allowed else [not_supported(path, v, allowed)]
    return check


def at_least(low: int, detail: str) -> Check:
    def check(path: str, v: Any) -> list[FieldError]:
        return [] if v >= low else [bad(path, v, detail)]
    return check


def between(low: int, high: int, detail: str) -> Check:
    def check(path: str, v: Any) -> list[FieldError]:
        return [] if low <= v <= high else [bad(path, v, detail)]
    return check


def service_path(path: str, v: Any) -> list[FieldError]:
    """ValidateWebhookService's path: from `/`, each segment a DNS-1123 subdomain."""
    if v in ("", "/"):
        return []
    if v == "//":
        return [bad(path, v, "segment[0] may not be empty")]
    out = [] if v.startswith("/") else [bad(path, v, "must start with a '/'")]
    rest = v[1:]
    if rest.endswith("/"):
        rest = rest[:-1]
    for i, step in enumerate(rest.split("/")):
        if not step:
            out.append(bad(path, v, f"segment[{i}] may not be empty"))
            continue
        out += [bad(path, v, f"segment[{i}]: {w}") for w in why_subdomain(step)]
    return out


_URL_FORM = "; desired format: https://host[/path]"


def https_url(path: str, v: Any) -> list[FieldError]:
    """ValidateWebhookURL: an absolute https URL without user, fragment or query (each named)."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(v)
    except ValueError as exc:
        return [required(path, f"url must be a valid URL: {exc}{_URL_FORM}")]
    out = []
    if u.scheme != "https":
        out.append(bad(path, u.scheme, "'https' is the only allowed URL scheme" + _URL_FORM))
    if not u.netloc:
        out.append(bad(path, u.netloc, "host must be specified" + _URL_FORM))
    if "@" in u.netloc:
        out.append(bad(path, u.netloc.rpartition("@")[0], "user information is not permitted in the URL"))
    if u.fragment:
        out.append(bad(path, u.fragment, "fragments are not permitted in the URL"))
    if u.query:
        out.append(bad(path, u.query, "query parameters are not permitted in the URL"))
    return out


def labels_map(path: str, v: Any) -> list[FieldError]:
    """ValidateLabels: qualified names as keys, label values as values."""
    out = []
    for k, x in v.items():
        out += qualified_name(path, k)
        if len(x) > 63:
            out.append(bad(path, x, "must be no more than 63 characters"))
        if not re.fullmatch(_LABEL_VALUE, x):
            out.append(bad(path, x, LABEL_VALUE_MSG))
    return out


def qualified_name(path: str, k: str) -> list[FieldError]:
    prefix, _, name = k.rpartition("/")
    out = []
    if prefix and (len(prefix) > 253 or not re.fullmatch(_SUBDOMAIN, prefix)):
        out.append(bad(path, k, "prefix part " + DNS1123_SUBDOMAIN_MSG))
    if not name:
        out.append(bad(path, k, "name part must be non-empty"))
    else:
        if len(name) > 63:
            out.append(bad(path, k, "name part must be no more than 63 characters"))
        if not re.fullmatch(_QUALIFIED, name):
            out.append(bad(path, k, QUALIFIED_MSG))
    return out


# ---------- paths ----------

_SEG = re.compile(r"([^.\[{]+)|\[\*\]|\{\}")


@functools.lru_cache(maxsize=None)
def _segments(pattern: str) -> tuple[str, ...]:
    return tuple(m.group(0) for m in _SEG.finditer(pattern))


def matches(obj: Any, pattern: str) -> list[tuple[str, Any]]:
    """(path, value) for every place `pattern` names in `obj` that holds a value; `{}` yields the keys."""
    level: list[tuple[str, Any]] = [("", obj)]
    for s in _segments(pattern):
        nxt: list[tuple[str, Any]] = []
        for path, v in level:
            if s == "[*]":
                if isinstance(v, list):
                    nxt.extend((f"{path}[{i}]", item) for i, item in enumerate(v))
            elif s == "{}":
                if isinstance(v, dict):
                    nxt.extend((f"{path}[{k}]", k) for k in v)
            elif isinstance(v, dict) and s in v:
                nxt.append((f"{path}.{s}" if path else s, v[s]))
        if not nxt:
            return nxt
        level = nxt
    return level


def parents(obj: Any, pattern: str) -> Iterator[tuple[str, Any, str]]:
    """For `a[*].b`: (path of each `a[i]`, its value, "b")."""
    head, _, leaf = pattern.rpartition(".")
    if not head:
        yield "", obj, leaf
        return
    for path, v in matches(obj, head):
        if isinstance(v, dict):
            yield path, v, leaf


def get(obj: Any, path: str, default: Any = None) -> Any:
    for _, v in matches(obj, path):
        return v
    return default


def _empty(v: Any) -> bool:
    return v is None or v == "" or v == [] or v == {}


# ---------- the table of a kind ----------

@dataclass(frozen=True)
class Kind:
    """How kube-apiserver validates one built-in kind."""

    name: Check = dns1123_subdomain
    required: tuple[tuple[str, str], ...] = ()  # (path pattern, detail): present and not empty
    fields: tuple[tuple[str, Check], ...] = ()  # (path pattern, check) on every value present
    immutable: tuple[str, ...] = ()  # paths that may not change once set (`field is immutable`)
    defaults: tuple[tuple[str, Any], ...] = ()  # (path pattern, value or function of the parent)
    rules: tuple[Rule, ...] = ()  # what spans fields
    update_rules: tuple[Rule, ...] = ()  # (new, old): only on updates

    def default(self, obj: dict[str, Any]) -> None:
        for pattern, value in self.defaults:
            for _, parent, leaf in list(parents(obj, pattern)):
                if _empty(parent.get(leaf)):
                    got = value(parent) if callable(value) else orjson.loads(orjson.dumps(value))
                    if got is not None:
                        parent[leaf] = got

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
        errors: list[FieldError] = []
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            errors += self.name("metadata.name", name)
        for pattern, detail in self.required:
            for path, parent, leaf in parents(obj, pattern):
                if _empty(parent.get(leaf)):
                    errors.append(required(f"{path}.{leaf}" if path else leaf, detail))
        for pattern, check in self.fields:
            for path, value in matches(obj, pattern):
                if not _empty(value) or isinstance(value, (int, float)):
                    errors += check(path, value)
        for rule in self.rules:
            errors += rule(obj, old)
        if old is not None:
            for path in self.immutable:
                before, after = get(old, path), get(obj, path)
                if before is not None and before != after:
                    errors.append(bad(path, after, "field is immutable"))
            for rule in self.update_rules:
                errors += rule(obj, old)
        return errors


# ---------- rules that span fields ----------

def _go_port(p: dict[str, Any]) -> str:
    """core.ServicePort{...} as %#v prints the (protocol, port) key of a duplicate."""
    return (f'core.ServicePort{{Name:"", Protocol:"{p.get("protocol", "")}", AppProtocol:(*string)(nil), '
            f'Port:{p.get("port", 0)}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:""}}, NodePort:0}}')


def service_rules(svc: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = svc.get("spec") or {}
    ports = spec.get("ports") or []
    kind = spec.get("type", "ClusterIP")
    headless = spec.get("clusterIP") == "None"
    out: list[FieldError] = []
    if not ports and not headless and kind != "ExternalName":
        out.append(required("spec.ports"))
    names: set[str] = set()
    keys: set[tuple[Any, Any]] = set()
    for i, p in enumerate(ports):
        name = p.get("name") or ""
        if len(ports) > 1 and not name:
            out.append(required(f"spec.ports[{i}].name"))
        elif name:
            if name in names:
                out.append(duplicate(f"spec.ports[{i}].name", go_value(name)))
            names.add(name)
        key = (p.get("protocol"), p.get("port"))
        if key in keys:
            out.append(duplicate(f"spec.ports[{i}]", _go_port(p)))
        keys.add(key)
        if kind == "ClusterIP" and p.get("nodePort"):
            out.append(forbidden(f"spec.ports[{i}].nodePort", "may not be used when `type` is 'ClusterIP'"))
    if kind == "ExternalName":
        if spec.get("clusterIP"):
            out.append(forbidden("spec.clusterIP", "must be empty for ExternalName services"))
        if not spec.get("externalName"):
            out.append(required("spec.externalName"))
        else:
            out += dns1123_subdomain("spec.externalName", spec["externalName"].rstrip("."))
    elif kind in ("NodePort", "LoadBalancer") and headless:
        out.append(bad("spec.clusterIP", "None", f"may not be set to 'None' for {kind} services"))
    for i, ip in enumerate(spec.get("clusterIPs") or []):
        if ip != "None":
            out += ip_address()(f"spec.clusterIPs[{i}]", ip)
    return out


def service_update(svc: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """A Service's cluster IP may not change once set (but to or from ExternalName)."""
    new_spec, old_spec = svc.get("spec") or {}, (old or {}).get("spec") or {}
    if "ExternalName" in (new_spec.get("type", "ClusterIP"), old_spec.get("type", "ClusterIP")):
        return []
    before, after = old_spec.get("clusterIPs") or [], new_spec.get("clusterIPs") or []
    if before and after and before[0] != after[0]:
        return [bad("spec.clusterIPs[0]", after, "may not change once set")]
    return []


def keep_cluster_ip(svc: dict[str, Any], old: dict[str, Any]) -> None:
    """An update that leaves the cluster IP out keeps the one the Service has (as the registry does)."""
    spec, before = svc.get("spec"), (old.get("spec") or {})
    if isinstance(spec, dict) and not spec.get("clusterIP") and before.get("clusterIP") \
            and spec.get("type", "ClusterIP") != "ExternalName":
        spec["clusterIP"] = before["clusterIP"]
        spec.setdefault("clusterIPs", list(before.get("clusterIPs") or [before["clusterIP"]]))


MAX_DATA_BYTES = 1024 * 1024  # a Secret's or ConfigMap's data (core.MaxSecretSize)

_SECRET_KEYS = {"kubernetes.io/tls": ("tls.crt", "tls.key"), "kubernetes.io/ssh-auth": ("ssh-privatekey",),
                "kubernetes.io/dockerconfigjson": (".dockerconfigjson",), "kubernetes.io/dockercfg": (".dockercfg",)}


def secret_rules(secret: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    data = secret.get("data") or {}
    kind = secret.get("type", "Opaque")
    out: list[FieldError] = []
    size = sum(len(k) + len(v) * 3 // 4 for k, v in data.items())
    if size > MAX_DATA_BYTES:
        out.append(too_long("data", MAX_DATA_BYTES))
    for key in _SECRET_KEYS.get(kind, ()):
        if key not in data:
            out.append(required(f"data[{key}]"))
    if kind == "kubernetes.io/service-account-token" and \
            not ((secret.get("metadata") or {}).get("annotations") or {}).get("kubernetes.io/service-account.name"):
        out.append(required("metadata.annotations[kubernetes.io/service-account.name]"))
    if kind == "kubernetes.io/basic-auth" and "username" not in data and "password" not in data:
        out += [required("data[username]"), required("data[password]")]
    return out


def immutable_data(data_fields: tuple[str, ...]) -> Rule:
    """`immutable: true`: the data may not change, and immutable may not be unset."""
    def rule(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
        if not old or not old.get("immutable"):
            return []
        out = []
        if not obj.get("immutable"):
            out.append(forbidden("immutable", "field is immutable when `immutable` is set"))
        for f in data_fields:
            if (obj.get(f) or {}) != (old.get(f) or {}):
                out.append(forbidden(f, "field is immutable when `immutable` is set"))
        return out
    return rule


def secret_type_immutable(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    before, after = (old or {}).get("type", "Opaque"), obj.get("type", "Opaque")
    return [bad("type", after, "field is immutable")] if before != after else []


def configmap_rules(cm: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    data, binary = cm.get("data") or {}, cm.get("binaryData") or {}
    out = [bad(f"data[{k}]", k, "duplicate of key present in binaryData") for k in data if k in binary]
    size = sum(len(k) + len(v.encode()) for k, v in data.items()) + sum(len(k) + len(v) * 3 // 4 for k, v in binary.items())
    if size > MAX_DATA_BYTES:
        out.append(too_long("[]", MAX_DATA_BYTES))  # (the root path, as kube-apiserver prints it)
    return out


#: kube-apiserver's ValidateEndpointIP: an endpoint is a pod's (or a node's) address, never one of these
LOOPBACK_ENDPOINT = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
_LINK_LOCAL_MULTICAST = (ipaddress.ip_network("224.0.0.0/24"), ipaddress.ip_network("ff02::/16"))


def endpoint_ip(path: str, v: str) -> list[FieldError]:
    """What kube-apiserver refuses in an EndpointSlice's addresses, in its words, in its order."""
    ip = ipaddress.ip_address(v)
    out = []
    if ip.is_unspecified:
        out.append(bad(path, v, f"may not be unspecified ({v})"))
    if ip.is_loopback:
        out.append(bad(path, v, LOOPBACK_ENDPOINT))
    if ip.is_link_local and not ip.is_multicast:
        out.append(bad(path, v, "may not be in the link-local range (169.254.0.0/16, fe80::/10)"))
    if any(ip in net for net in _LINK_LOCAL_MULTICAST if net.version == ip.version):
        out.append(bad(path, v, "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"))
    return out


def endpoint_addresses(eps: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """The endpoints' addresses and counts (left out on an update that keeps the endpoints as they
    were, as kube-apiserver leaves them: an older server took them), and the ports' names."""
    family = {"IPv4": 4, "IPv6": 6}.get(eps.get("addressType", ""))
    out: list[FieldError] = []
    endpoints = eps.get("endpoints") or []
    if len(endpoints) > 1000:
        out.append(FieldError("endpoints", "FieldValueTooMany", f"Too many: {len(endpoints)}: must have at most 1000 items"))
    for i, ep in enumerate(endpoints):
        addrs = ep.get("addresses") or []
        if not addrs:
            out.append(required(f"endpoints[{i}].addresses", "must contain at least 1 address"))
        elif len(addrs) > 100:
            out.append(FieldError(f"endpoints[{i}].addresses", "FieldValueTooMany",
                                  f"Too many: {len(addrs)}: must have at most 100 items"))
        for j, a in enumerate(addrs):
            where = f"endpoints[{i}].addresses[{j}]"
            if family is not None:
                wrong = ip_address(family)(where, a)
                out += wrong or endpoint_ip(where, a)
            elif eps.get("addressType") == "FQDN":
                out += dns1123_subdomain(where, a)
        if ep.get("hostname"):
            out += dns1123_label(f"endpoints[{i}].hostname", ep["hostname"])
    if out and old is not None and old.get("endpoints") == eps.get("endpoints"):
        out = []
    names: set[str] = set()
    ports = eps.get("ports") or []
    if len(ports) > 20000:
        out.append(FieldError("ports", "FieldValueTooMany", f"Too many: {len(ports)}: must have at most 20000 items"))
    for i, p in enumerate(ports):
        name = p.get("name") or ""
        if name in names:
            out.append(duplicate(f"ports[{i}].name", go_value(name)))
        names.add(name)
    return out


def deployment_rules(dep: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = dep.get("spec") or {}
    selector = spec.get("selector")
    out: list[FieldError] = []
    if not isinstance(selector, dict) or not selector:
        out.append(required("spec.selector"))
        return out
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    from gwpolicy.engine.topology import selector_matches

    if not labels or not selector_matches(selector, labels):
        shown = "map[string]string{" + ", ".join(f'"{k}":"{v}"' for k, v in sorted(labels.items())) + "}" \
            if labels else "map[string]string(nil)"
        out.append(FieldError("spec.template.metadata.labels", "FieldValueInvalid",
                              f"Invalid value: {shown}: `selector` does not match template `labels`"))
    return out


def selector_immutable(dep: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    before, after = ((old or {}).get("spec") or {}).get("selector"), (dep.get("spec") or {}).get("selector")
    if before != after:
        return [FieldError("spec.selector", "FieldValueInvalid",
                           "Invalid value: v1.LabelSelector{...}: field is immutable")]
    return []


_RBAC = "rbac.authorization.k8s.io"


def policy_rules(namespaced: bool) -> Rule:
    def rule(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
        out: list[FieldError] = []
        for i, r in enumerate(obj.get("rules") or []):
            where = f"rules[{i}]"
            if not r.get("verbs"):
                out.append(required(f"{where}.verbs", "verbs must contain at least one value"))
            urls = r.get("nonResourceURLs") or []
            if urls:
                if namespaced:
                    out.append(bad(f"{where}.nonResourceURLs", urls, "namespaced rules cannot apply to non-resource URLs"))
                if r.get("apiGroups") or r.get("resources") or r.get("resourceNames"):
                    out.append(bad(f"{where}.nonResourceURLs", urls,
                                   "rules cannot apply to both regular resources and non-resource URLs"))
                continue
            if not r.get("apiGroups"):
                out.append(required(f"{where}.apiGroups", "resource rules must supply at least one api group"))
            if not r.get("resources"):
                out.append(required(f"{where}.resources", "resource rules must supply at least one resource"))
        return out
    return rule


def binding_rules(cluster: bool) -> Rule:
    kinds = ("ClusterRole",) if cluster else ("Role", "ClusterRole")

    def rule(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
        out: list[FieldError] = []
        ref = obj.get("roleRef") or {}
        if ref.get("apiGroup") != _RBAC:
            out.append(not_supported("roleRef.apiGroup", ref.get("apiGroup", ""), (_RBAC,)))
        if ref.get("kind") not in kinds:
            out.append(not_supported("roleRef.kind", ref.get("kind", ""), kinds))
        if not ref.get("name"):
            out.append(required("roleRef.name"))
        else:
            out += path_segment("roleRef.name", ref["name"])
        for i, s in enumerate(obj.get("subjects") or []):
            where = f"subjects[{i}]"
            if not s.get("name"):
                out.append(required(f"{where}.name"))
            kind = s.get("kind")
            if kind == "ServiceAccount":
                if s.get("apiGroup"):
                    out.append(not_supported(f"{where}.apiGroup", s["apiGroup"], ("",)))
                if s.get("name"):
                    out += dns1123_subdomain(f"{where}.name", s["name"])
                if cluster and not s.get("namespace"):
                    out.append(required(f"{where}.namespace"))
            elif kind in ("User", "Group"):
                if s.get("apiGroup") != _RBAC:
                    out.append(not_supported(f"{where}.apiGroup", s.get("apiGroup", ""), (_RBAC,)))
            else:
                out.append(not_supported(f"{where}.kind", kind or "", ("ServiceAccount", "User", "Group")))
        return out
    return rule


def role_ref_immutable(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    before, after = (old or {}).get("roleRef"), obj.get("roleRef")
    if before != after:
        a = after or {}
        shown = f'rbac.RoleRef{{APIGroup:"{a.get("apiGroup", "")}", Kind:"{a.get("kind", "")}", Name:"{a.get("name", "")}"}}'
        return [FieldError("roleRef", "FieldValueInvalid", f"Invalid value: {shown}: cannot change roleRef")]
    return []


def webhook_rules(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    out: list[FieldError] = []
    seen: set[str] = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        where = f"webhooks[{i}]"
        name = hook.get("name") or ""
        if not name:
            out.append(required(f"{where}.name"))
        else:
            why = why_subdomain(name.lower())  # IsFullyQualifiedName: any case
            if why:
                out.append(bad(f"{where}.name", name, ",".join(why)))
            if len(name.split(".")) < 3:
                out.append(bad(f"{where}.name", name, "should be a domain with at least three segments separated by dots"))
            if name in seen:
                out.append(duplicate(f"{where}.name", go_value(name)))
            seen.add(name)
        cc = hook.get("clientConfig") or {}
        if ("url" in cc) == ("service" in cc):
            out.append(required(f"{where}.clientConfig", "exactly one of url or service is required"))
        if "sideEffects" not in hook:
            out.append(required(f"{where}.sideEffects", "must specify one of None, NoneOnDryRun"))
        versions = hook.get("admissionReviewVersions")
        if not versions:
            out.append(required(f"{where}.admissionReviewVersions", "must specify one of v1, v1beta1"))
        elif not any(v in ("v1", "v1beta1") for v in versions):
            out.append(bad(f"{where}.admissionReviewVersions", versions, "must include at least one of v1, v1beta1"))
    return out


_OPS = ("*", "CONNECT", "CREATE", "DELETE", "UPDATE")


def _schema_types(schema: Any, path: str, root: bool = False) -> list[FieldError]:
    """Structural schemas (apiextensions validation): every schema that is a property, items or
    additionalProperties of another specifies its type, unless it may hold anything."""
    out: list[FieldError] = []
    if not isinstance(schema, dict):
        return out
    free = schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
    if not schema.get("type") and not free:
        out.append(required(f"{path}.type", "must not be empty at the root" if root else "must not be empty for specified object fields"))
    elif root and schema.get("type") not in (None, "object"):
        out.append(bad(f"{path}.type", schema["type"], "must be object at the root"))
    if schema.get("type") == "array" and not isinstance(schema.get("items"), dict):
        out.append(required(f"{path}.items", "must be specified"))
    for k, sub in (schema.get("properties") or {}).items():
        out += _schema_types(sub, f"{path}.properties[{k}]")
    items = schema.get("items")
    if isinstance(items, dict):
        out += _schema_types(items, f"{path}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _schema_types(schema["additionalProperties"], f"{path}.additionalProperties")
    out += _value_validations(schema, path)
    return out


#: what a value validation (a schema under anyOf, allOf, oneOf or not) may not set in a structural
#: schema: the structure is declared once, outside them
_NOT_IN_VALUE_VALIDATIONS = ("type", "description", "title", "default", "nullable", "x-kubernetes-int-or-string",
                             "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
                             "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
                             "x-kubernetes-validations")
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _value_validations(schema: dict[str, Any], path: str) -> list[FieldError]:
    """The value validations under `schema` set nothing of the structure; an int-or-string field's
    `anyOf: [{type: integer}, {type: string}]`, exactly that, is the one exception."""
    out: list[FieldError] = []
    branches: list[tuple[str, Any]] = [(f"{path}.{k}[{i}]", b) for k in ("anyOf", "allOf", "oneOf")
                                       for i, b in enumerate(schema.get(k) or [])]
    if isinstance(schema.get("not"), dict):
        branches.append((f"{path}.not", schema["not"]))
    if schema.get("x-kubernetes-int-or-string") and schema.get("anyOf") == _INT_OR_STRING:
        branches = [(w, b) for w, b in branches if ".anyOf[" not in w[len(path):]]
    for where, branch in branches:
        out += _in_value_validation(branch, where)
    return out


def _in_value_validation(schema: Any, path: str) -> list[FieldError]:
    out: list[FieldError] = []
    if not isinstance(schema, dict):
        return out
    for k in _NOT_IN_VALUE_VALIDATIONS:
        if schema.get(k) not in (None, False, "", [], {}):
            out.append(FieldError(f"{path}.{k}", "FieldValueForbidden", "Forbidden: must be "
                                  + ("false" if isinstance(schema[k], bool) else "empty") + " to be structural"))
    for k, sub in (schema.get("properties") or {}).items():
        out += _in_value_validation(sub, f"{path}.properties[{k}]")
    if isinstance(schema.get("items"), dict):
        out += _in_value_validation(schema["items"], f"{path}.items")
    for k in ("anyOf", "allOf", "oneOf"):
        for i, b in enumerate(schema.get(k) or []):
            out += _in_value_validation(b, f"{path}.{k}[{i}]")
    if isinstance(schema.get("not"), dict):
        out += _in_value_validation(schema["not"], f"{path}.not")
    return out


def _versions_invalid(detail: str) -> FieldError:
    """kube-apiserver prints the whole Go slice of versions here; this sandbox abbreviates it."""
    return FieldError("spec.versions", "FieldValueInvalid",
                      f"Invalid value: []apiextensions.CustomResourceDefinitionVersion{{...}}: {detail}")


def crd_rules(crd: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural = spec.get("group") or "", names.get("plural") or ""
    out: list[FieldError] = []
    name = (crd.get("metadata") or {}).get("name")
    if name != f"{plural}.{group}":
        out.append(bad("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if group and "." not in group:
        out.append(bad("spec.group", group, "should be a domain with at least one dot"))
    elif group:
        out += dns1123_subdomain("spec.group", group)
    for f in ("plural", "singular"):
        if names.get(f):
            why = why_dns1035(names[f])
            if why:
                out.append(bad(f"spec.names.{f}", names[f], ",".join(why)))
    for f in ("kind", "listKind"):
        if names.get(f) and why_dns1035(names[f].lower()):
            out.append(bad(f"spec.names.{f}", names[f], "may have mixed case, but should otherwise match: " + DNS1035_MSG))
    for i, short in enumerate(names.get("shortNames") or []):
        why = why_label(short)
        if why:
            out.append(bad(f"spec.names.shortNames[{i}]", short, ",".join(why)))
    versions = spec.get("versions") or []
    if not versions:
        out.append(required("spec.versions", "must have exactly one version marked as storage version"))
    else:
        if sum(1 for v in versions if v.get("storage")) != 1:
            out.append(_versions_invalid("must have exactly one version marked as storage version"))
        seen: set[str] = set()
        for i, v in enumerate(versions):
            vname = v.get("name") or ""
            where = f"spec.versions[{i}]"
            if not vname:
                out.append(required(f"{where}.name"))
            else:
                out += dns1035_label(f"{where}.name", vname)
                if vname in seen:
                    out.append(duplicate(f"{where}.name", go_value(vname)))
                seen.add(vname)
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if schema is None:
                out.append(required(f"{where}.schema.openAPIV3Schema", "schemas are required"))
            else:
                out += _schema_types(schema, f"{where}.schema.openAPIV3Schema", root=True)
            for j, col in enumerate(v.get("additionalPrinterColumns") or []):
                for f in ("name", "type", "jsonPath"):
                    if not col.get(f):
                        out.append(required(f"{where}.additionalPrinterColumns[{j}].{f}"))
        if not any(v.get("served") for v in versions):
            out.append(_versions_invalid("must have at least one served version"))
    return out


def crd_update(crd: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Stored versions may not be dropped from spec.versions (apiextensions' update validation)."""
    stored = ((old or {}).get("status") or {}).get("storedVersions") or []
    have = {v.get("name") for v in (crd.get("spec") or {}).get("versions") or []}
    return [bad("status.storedVersions[%d]" % i, v, "must appear in spec.versions") for i, v in enumerate(stored)
            if v not in have]


def _target_port(port: dict[str, Any]) -> Any:
    return port.get("port")


_PROTOCOLS = ("SCTP", "TCP", "UDP")

KINDS: dict[tuple[str, str], Kind] = {
    ("", "Namespace"): Kind(
        name=dns1123_label,
        defaults=(("spec.finalizers", ["kubernetes"]),),
        fields=(("spec.finalizers[*]", qualified_name),)),
    ("", "Service"): Kind(
        name=dns1035_label,
        defaults=(("spec.type", "ClusterIP"), ("spec.sessionAffinity", "None"),
                  ("spec.ports[*].protocol", "TCP"), ("spec.ports[*].targetPort", _target_port),
                  ("spec.clusterIPs", lambda spec: [spec["clusterIP"]] if spec.get("clusterIP") else None),
                  ("spec.internalTrafficPolicy", lambda spec: None if spec.get("type") == "ExternalName" else "Cluster"),
                  ("spec.externalTrafficPolicy",
                   lambda spec: "Cluster" if spec.get("type") in ("NodePort", "LoadBalancer") else None)),
        fields=(("spec.type", one_of("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")),
                ("spec.sessionAffinity", one_of("ClientIP", "None")),
                ("spec.ports[*].name", dns1123_label),
                ("spec.ports[*].port", port_number),
                ("spec.ports[*].protocol", one_of(*_PROTOCOLS)),
                ("spec.ports[*].targetPort", port_number_or_name),
                ("spec.ports[*].nodePort", port_number),
                ("spec.selector", labels_map),
                ("spec.externalIPs[*]", ip_address()),
                ("spec.internalTrafficPolicy", one_of("Cluster", "Local")),
                ("spec.externalTrafficPolicy", one_of("Cluster", "Local")),
                ("spec.ipFamilies[*]", one_of("IPv4", "IPv6")),
                ("spec.ipFamilyPolicy", one_of("SingleStack", "PreferDualStack", "RequireDualStack")),
                ("spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                 between(1, 86400, "must be greater than 0 and less than 86400"))),
        rules=(service_rules,), update_rules=(service_update,)),
    ("", "Secret"): Kind(
        defaults=(("type", "Opaque"),),
        fields=(("data{}", config_key),),
        rules=(secret_rules,), update_rules=(secret_type_immutable, immutable_data(("data",)))),
    ("", "ConfigMap"): Kind(
        fields=(("data{}", config_key), ("binaryData{}", config_key)),
        rules=(configmap_rules,), update_rules=(immutable_data(("data", "binaryData")),)),
    ("", "ServiceAccount"): Kind(),
    ("", "Event"): Kind(name=lambda p, v: []),  # legacy Events' names are free-form (`<object>.<hex>`)
    ("apps", "Deployment"): Kind(
        defaults=(("spec.replicas", 1), ("spec.revisionHistoryLimit", 10), ("spec.progressDeadlineSeconds", 600),
                  ("spec.strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})),
        fields=(("spec.replicas", at_least(0, "must be greater than or equal to 0")),
                ("spec.strategy.type", one_of("Recreate", "RollingUpdate")),
                ("spec.minReadySeconds", at_least(0, "must be greater than or equal to 0")),
                ("spec.revisionHistoryLimit", at_least(0, "must be greater than or equal to 0"))),
        rules=(deployment_rules,), update_rules=(selector_immutable,)),
    ("coordination.k8s.io", "Lease"): Kind(
        fields=(("spec.leaseDurationSeconds", at_least(1, "must be greater than 0")),
                ("spec.leaseTransitions", at_least(0, "must be greater than or equal to 0")))),
    (_RBAC, "ClusterRole"): Kind(name=path_segment, rules=(policy_rules(False),)),
    (_RBAC, "Role"): Kind(name=path_segment, rules=(policy_rules(True),)),
    (_RBAC, "ClusterRoleBinding"): Kind(
        name=path_segment,
        defaults=(("subjects[*].apiGroup", lambda s: _RBAC if s.get("kind") in ("User", "Group") else None),),
        rules=(binding_rules(True),), update_rules=(role_ref_immutable,)),
    (_RBAC, "RoleBinding"): Kind(
        name=path_segment,
        defaults=(("subjects[*].apiGroup", lambda s: _RBAC if s.get("kind") in ("User", "Group") else None),),
        rules=(binding_rules(False),), update_rules=(role_ref_immutable,)),
    ("discovery.k8s.io", "EndpointSlice"): Kind(
        required=(("addressType", ""),),
        defaults=(("ports[*].protocol", "TCP"), ("ports[*].name", "")),
        fields=(("addressType", one_of("FQDN", "IPv4", "IPv6")),
                ("ports[*].name", dns1123_label),
                ("ports[*].protocol", one_of(*_PROTOCOLS)),
                ("ports[*].port", port_number)),
        immutable=("addressType",),
        rules=(endpoint_addresses,)),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): Kind(
        required=(("spec.group", ""), ("spec.names.plural", ""), ("spec.names.kind", ""), ("spec.scope", "")),
        defaults=(("spec.names.singular", lambda names: (names.get("kind") or "").lower() or None),
                  ("spec.names.listKind", lambda names: names["kind"] + "List" if names.get("kind") else None),
                  ("spec.conversion", {"strategy": "None"})),
        fields=(("spec.scope", one_of("Cluster", "Namespaced")),
                ("spec.conversion.strategy", one_of("None", "Webhook"))),
        rules=(crd_rules,), update_rules=(crd_update,)),
}

def policy_checks(vap: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = vap.get("spec") or {}
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        return [required("spec.validations", "validations or auditAnnotations must contain at least one item")]
    return []


_WEBHOOK_DEFAULTS: tuple[tuple[str, Any], ...] = (("webhooks[*].failurePolicy", "Fail"), ("webhooks[*].matchPolicy", "Equivalent"),
                     ("webhooks[*].namespaceSelector", {}), ("webhooks[*].objectSelector", {}),
                     ("webhooks[*].timeoutSeconds", 10), ("webhooks[*].rules[*].scope", "*"),
                     ("webhooks[*].clientConfig.service.port", 443))
_WEBHOOK_FIELDS = (("webhooks[*].failurePolicy", one_of("Fail", "Ignore")),
                   ("webhooks[*].matchPolicy", one_of("Equivalent", "Exact")),
                   ("webhooks[*].sideEffects", one_of("None", "NoneOnDryRun")),
                   ("webhooks[*].timeoutSeconds", between(1, 30, "the timeout value must be between 1 and 30 seconds")),
                   ("webhooks[*].clientConfig.url", https_url),
                   ("webhooks[*].clientConfig.service.port",
                    between(1, 65535, "port is not valid: must be between 1 and 65535, inclusive")),
                   ("webhooks[*].clientConfig.service.path", service_path),
                   ("webhooks[*].rules[*].operations[*]", one_of(*_OPS)),
                   ("webhooks[*].rules[*].scope", one_of("*", "Cluster", "Namespaced")))
_WEBHOOK_REQUIRED = (("webhooks[*].clientConfig.service.name", ""), ("webhooks[*].clientConfig.service.namespace", ""),
                     ("webhooks[*].rules[*].operations", ""), ("webhooks[*].rules[*].apiGroups", ""),
                     ("webhooks[*].rules[*].apiVersions", ""), ("webhooks[*].rules[*].resources", ""))
KINDS[("admissionregistration.k8s.io", "ValidatingWebhookConfiguration")] = Kind(
    defaults=_WEBHOOK_DEFAULTS, fields=_WEBHOOK_FIELDS, required=_WEBHOOK_REQUIRED, rules=(webhook_rules,))
KINDS[("admissionregistration.k8s.io", "MutatingWebhookConfiguration")] = Kind(
    defaults=_WEBHOOK_DEFAULTS + (("webhooks[*].reinvocationPolicy", "Never"),),
    fields=_WEBHOOK_FIELDS + (("webhooks[*].reinvocationPolicy", one_of("IfNeeded", "Never")),),
    required=_WEBHOOK_REQUIRED, rules=(webhook_rules,))
KINDS[("admissionregistration.k8s.io", "ValidatingAdmissionPolicy")] = Kind(
    defaults=(("spec.failurePolicy", "Fail"),),
    fields=(("spec.failurePolicy", one_of("Fail", "Ignore")),),
    required=(("spec.matchConstraints", ""), ("spec.matchConstraints.resourceRules", ""),
              ("spec.validations[*].expression", "expression is not specified"), ("spec.variables[*].name", ""),
              ("spec.matchConditions[*].name", ""), ("spec.matchConditions[*].expression", "")),
    rules=(policy_checks,))
KINDS[("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding")] = Kind(
    required=(("spec.policyName", ""),),
    fields=(("spec.validationActions[*]", one_of("Audit", "Deny", "Warn")),))


def convert(group: str, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """What the registry does to a write before validation: a Secret's stringData folded into data
    (base64), a Service update keeping its cluster IP, the kind's defaults."""
    if (group, kind) == ("", "Secret") and isinstance(obj.get("stringData"), dict):
        import base64

        data = obj.setdefault("data", {}) if isinstance(obj.get("data"), dict) or "data" not in obj else {}
        for k, v in obj.pop("stringData").items():
            data[k] = base64.b64encode(str(v).encode()).decode()
    if (group, kind) == ("", "Service") and old is not None:
        keep_cluster_ip(obj, old)
    rules = KINDS.get((group, kind))
    if rules is not None:
        rules.default(obj)
