"""NginxProxy (gateway.nginx.org): the data plane settings a GatewayClass's `spec.parametersRef` and
a Gateway's `spec.infrastructure.parametersRef` name, resolved, merged and checked.

The Gateway's NginxProxy overrides the class's field by field (objects merge key by key, a list or
a scalar replaces the class's), as NGINX Gateway Fabric does. A reference that does not resolve
(wrong group or kind, no such object) or an NginxProxy whose
fields this gateway cannot read makes the referring object not accepted, reason
InvalidParameters, with a message naming the reference and the field (GEP-1364 and the
parametersRef fields' documentation). `server_lines` gives the Gateway's servers the error log level
and real_ip (rewriteClientIP); `exporter` the tracing exporter (gateway/tracing.py, spanrelay.py).
Fields NGINX 1.22 or this gateway does not honour are named
in the accepted condition's message (`unhonoured`), never silently dropped.

Pure: objects in, values and messages out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import Ref

GROUP = "gateway.nginx.org"
KIND = "NginxProxy"

#: where a GatewayClass's parametersRef without a namespace looks (NGF's documented examples leave it
#: out, and `kubectl apply` without -n puts their NginxProxy there)
CLASS_DEFAULT_NAMESPACE = "default"

#: NGF's defaults for the exporter (its API's documentation)
DEFAULT_INTERVAL_S = 5.0
DEFAULT_BATCH_SIZE = 512
DEFAULT_BATCH_COUNT = 4

#: what this gateway does with each field it honours (the rest are listed by `unhonoured`)
HONOURED = ("telemetry.exporter", "telemetry.serviceName", "telemetry.spanAttributes", "telemetry.disabledFeatures",
            "logging.errorLevel", "rewriteClientIP", "disableHTTP2", "ipFamily")

_DURATION = re.compile(r"^([0-9]{1,4})(ms|s|m|h)?$")
_ENDPOINT = re.compile(r"^(?:https?://)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(?::\d{1,5})?$")
_SERVICE = re.compile(r"^[a-zA-Z0-9_-]+$")
_ATTR = re.compile(r'^([^"$\\]|\\[^$])*$')
ERROR_LEVELS = ("debug", "info", "notice", "warn", "error", "crit", "alert", "emerg")
IP_FAMILIES = ("dual", "ipv4", "ipv6")


@dataclass(frozen=True)
class Exporter:
    """The telemetry exporter an NginxProxy configures: where spans go and how they are batched."""

    endpoint: str  # host:port (OTLP/gRPC)
    interval_s: float
    batch_size: int
    batch_count: int
    service_name: str  # the resource's service.name
    attributes: tuple[tuple[str, str], ...]  # spanAttributes, in order


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def merge(base: dict[str, Any] | None, over: dict[str, Any] | None) -> dict[str, Any]:
    """`over`'s fields over `base`'s, recursively for objects; lists and scalars replace."""
    out = dict(base or {})
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def duration_s(text: str) -> float | None:
    """NGF's Duration ("5s", "500ms", "1m", "2h", a bare number of seconds) in seconds."""
    m = _DURATION.match(text)
    if not m:
        return None
    return int(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m.group(2)]


def problems(spec: Any) -> list[str]:
    """Why this gateway cannot use an NginxProxy spec: each entry names the field."""
    if not isinstance(spec, dict):
        return ["spec: not an object"]
    out: list[str] = []
    tel = spec.get("telemetry")
    if tel is not None:
        if not isinstance(tel, dict):
            return out + ["spec.telemetry: not an object"]
        exp = tel.get("exporter")
        if exp is not None:
            if not isinstance(exp, dict):
                out.append("spec.telemetry.exporter: not an object")
            else:
                ep = exp.get("endpoint")
                # no endpoint is valid: a Gateway's NginxProxy may set the rest over its class's endpoint
                if ep is not None and (not isinstance(ep, str) or not _ENDPOINT.match(ep)):
                    out.append(f"spec.telemetry.exporter.endpoint: {ep!r} is not host:port")
                iv = exp.get("interval")
                if iv is not None and (not isinstance(iv, str) or not duration_s(iv)):
                    out.append(f"spec.telemetry.exporter.interval: {iv!r} is not a positive duration such as 5s")
                for f, hi in (("batchSize", 1 << 20), ("batchCount", 1 << 10)):
                    v = exp.get(f)
                    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi):
                        out.append(f"spec.telemetry.exporter.{f}: {v!r} is not an integer in 1..{hi}")
        sn = tel.get("serviceName")
        if sn is not None and (not isinstance(sn, str) or not _SERVICE.match(sn) or len(sn) > 127):
            out.append(f"spec.telemetry.serviceName: {sn!r} is not letters, digits, '_' and '-' (at most 127)")
        attrs = tel.get("spanAttributes")
        if attrs is not None:
            out += attribute_problems(attrs, "spec.telemetry.spanAttributes")
        dis = tel.get("disabledFeatures")
        if dis is not None and (not isinstance(dis, list) or any(d != "DisableTracing" for d in dis)):
            out.append(f"spec.telemetry.disabledFeatures: {dis!r}: the only feature is DisableTracing")
    level = _dict(spec.get("logging")).get("errorLevel")
    if level is not None and level not in ERROR_LEVELS:
        out.append(f"spec.logging.errorLevel: {level!r} is not one of {', '.join(ERROR_LEVELS)}")
    fam = spec.get("ipFamily")
    if fam is not None and fam not in IP_FAMILIES:
        out.append(f"spec.ipFamily: {fam!r} is not one of {', '.join(IP_FAMILIES)}")
    rw = spec.get("rewriteClientIP")
    if rw is not None:
        out += _rewrite_problems(rw)
    h2 = spec.get("disableHTTP2")
    if h2 is not None and not isinstance(h2, bool):
        out.append(f"spec.disableHTTP2: {h2!r} is not a boolean")
    return out


def _rewrite_problems(rw: Any) -> list[str]:
    if not isinstance(rw, dict):
        return ["spec.rewriteClientIP: not an object"]
    out = []
    if rw.get("mode") not in (None, "ProxyProtocol", "XForwardedFor"):
        out.append(f"spec.rewriteClientIP.mode: {rw.get('mode')!r} is not ProxyProtocol or XForwardedFor")
    if rw.get("setIPRecursively") is not None and not isinstance(rw.get("setIPRecursively"), bool):
        out.append(f"spec.rewriteClientIP.setIPRecursively: {rw.get('setIPRecursively')!r} is not a boolean")
    addrs = rw.get("trustedAddresses")
    if addrs is not None and (not isinstance(addrs, list) or len(addrs) > 16):
        return out + ["spec.rewriteClientIP.trustedAddresses: not a list of at most 16 entries"]
    for i, a in enumerate(addrs or []):
        a = _dict(a)
        kind, value = a.get("type"), a.get("value")
        where = f"spec.rewriteClientIP.trustedAddresses[{i}]"
        if kind not in ("CIDR", "IPAddress", "Hostname"):
            out.append(f"{where}.type: {kind!r} is not CIDR, IPAddress or Hostname")
        elif kind != "Hostname" and _address(kind, value) is None:
            out.append(f"{where}.value: {value!r} is not an {'IP network' if kind == 'CIDR' else 'IP address'}")
    return out


def _address(kind: str, value: Any) -> str | None:
    """An IP address or network as NGINX's set_real_ip_from takes it (normalised), None if it is none."""
    import ipaddress

    if not isinstance(value, str):
        return None
    try:
        return str(ipaddress.ip_network(value, strict=False) if kind == "CIDR" else ipaddress.ip_address(value))
    except ValueError:
        return None


def ip_family(spec: dict[str, Any]) -> str:
    """The IP family a Gateway's listeners and upstreams use (`ipFamily`, NGF's default `dual`)."""
    fam = spec.get("ipFamily")
    return fam if fam in IP_FAMILIES else "dual"


def address_family(address: Any) -> str | None:
    """"ipv4" or "ipv6" for an IP address, None for anything else."""
    import ipaddress

    try:
        return "ipv4" if ipaddress.ip_address(str(address)).version == 4 else "ipv6"
    except ValueError:
        return None


def family_allows(family: str, address_fam: str | None) -> bool:
    """May a Gateway of `family` (ip_family) use an address or endpoint of `address_fam`?"""
    return family == "dual" or address_fam == family


def server_lines(spec: dict[str, Any]) -> tuple[str, ...]:
    """The server-block directives of a Gateway's NginxProxy: `logging.errorLevel` as the level of
    its servers' error log; `rewriteClientIP` with mode XForwardedFor as NGINX's real_ip (the client
    address taken from X-Forwarded-For when the connection comes from a trusted address; Hostname
    entries are not honoured). Every value is one of the API's words or an address `ipaddress`
    parsed and printed again: no text of the object reaches NGINX as it was written."""
    out: list[str] = []
    level = _dict(spec.get("logging")).get("errorLevel")
    if level in ERROR_LEVELS:
        out.append(f"error_log ../logs/error.log {level};")
    rw = _dict(spec.get("rewriteClientIP"))
    if rw.get("mode") == "XForwardedFor":
        trusted = [_address(str(a.get("type")), a.get("value")) for a in rw.get("trustedAddresses") or []
                   if isinstance(a, dict) and a.get("type") in ("CIDR", "IPAddress")]
        out += [f"set_real_ip_from {a};" for a in trusted if a is not None]
        out += ["real_ip_header X-Forwarded-For;", f"real_ip_recursive {'on' if rw.get('setIPRecursively') else 'off'};"]
    return tuple(out)


def attribute_problems(attrs: Any, where: str) -> list[str]:
    """spanAttributes as NGF's API has them: at most 64 {key, value}, 1-255 characters, no `"`, `$`
    and no lone `\\`."""
    if not isinstance(attrs, list) or len(attrs) > 64:
        return [f"{where}: not a list of at most 64 {{key, value}}"]
    out = []
    for i, a in enumerate(attrs):
        a = _dict(a)
        for f in ("key", "value"):
            v = a.get(f)
            if not isinstance(v, str) or not 1 <= len(v) <= 255 or not _ATTR.match(v):
                out.append(f"{where}[{i}].{f}: {v!r} is not 1-255 characters without '\"', '$' or a lone '\\'")
    return out


def attributes(attrs: Any) -> tuple[tuple[str, str], ...]:
    """spanAttributes as (key, value) pairs, in order (the first of a key wins where they are read)."""
    return tuple((str(a["key"]), str(a["value"])) for a in attrs or [] if isinstance(a, dict)
                 and isinstance(a.get("key"), str) and isinstance(a.get("value"), str))


def unhonoured(spec: dict[str, Any]) -> list[str]:
    """The fields set that this gateway does not honour (said in the accepted condition)."""
    out = []
    for k, v in sorted(spec.items()):
        if isinstance(v, dict) and k in ("telemetry", "logging"):
            out += [f"{k}.{f}" for f in sorted(v) if f"{k}.{f}" not in HONOURED]
        elif k not in HONOURED:
            out.append(k)
    rw = _dict(spec.get("rewriteClientIP"))
    if rw.get("mode") == "ProxyProtocol":
        out.append("rewriteClientIP.mode ProxyProtocol (listeners do not take the PROXY protocol)")
    if any(_dict(a).get("type") == "Hostname" for a in rw.get("trustedAddresses") or []):
        out.append("rewriteClientIP.trustedAddresses of type Hostname")
    return out


def _resolve(ref: Any, namespace: str | None, index: ObjectIndex, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the NginxProxy's spec, None) or (None, why not)."""
    if not isinstance(ref, dict):
        return None, None
    group, kind, name = ref.get("group"), ref.get("kind"), ref.get("name")
    shown = f"{where} {group}/{kind} {namespace + '/' if namespace else ''}{name}"
    if (group, kind) != (GROUP, KIND):
        return None, f"{shown}: this gateway takes parameters of kind {KIND}.{GROUP} only"
    obj = index.get(Ref(GROUP, KIND, namespace, str(name)))
    if obj is None:
        return None, f"{shown}: not found"
    bad = problems(obj.spec if obj.spec is not None else {})
    if bad:
        return None, f"{shown}: " + "; ".join(bad)
    return dict(_dict(obj.spec)), None


def class_parameters(gc: Obj, index: ObjectIndex) -> tuple[dict[str, Any] | None, str | None]:
    """A GatewayClass's NginxProxy: (spec, None), (None, None) without a parametersRef, or (None, why)."""
    ref = _dict(gc.spec).get("parametersRef")
    return _resolve(ref, str(_dict(ref).get("namespace") or CLASS_DEFAULT_NAMESPACE), index, "spec.parametersRef")


def gateway_parameters(gw: Obj, index: ObjectIndex) -> tuple[dict[str, Any] | None, str | None]:
    """A Gateway's own NginxProxy (in its namespace), as class_parameters."""
    ref = _dict(_dict(gw.spec).get("infrastructure")).get("parametersRef")
    return _resolve(ref, gw.namespace, index, "spec.infrastructure.parametersRef")


def effective(gw: Obj, index: ObjectIndex) -> dict[str, Any]:
    """The NginxProxy settings that apply to a Gateway: its class's, overridden by its own
    (a reference that does not resolve contributes nothing; status says so)."""
    from gwpolicy.engine.refs import GATEWAY_GROUP

    gc = index.get(Ref(GATEWAY_GROUP, "GatewayClass", None, str(_dict(gw.spec).get("gatewayClassName", ""))))
    base = class_parameters(gc, index)[0] if gc is not None else None
    return merge(base, gateway_parameters(gw, index)[0])


def exporter(spec: dict[str, Any], gw: Obj | None = None) -> Exporter | None:
    """The exporter an effective NginxProxy spec configures, or None (no endpoint, or tracing
    disabled). The service name defaults to NGF's form, `ngf:<namespace>:<gateway>`, prefixed
    by gwpolicy's; a serviceName set is prefixed likewise."""
    tel = _dict(spec.get("telemetry"))
    exp = _dict(tel.get("exporter"))
    if not isinstance(exp.get("endpoint"), str) or "DisableTracing" in (tel.get("disabledFeatures") or []):
        return None
    where = f"{gw.namespace}:{gw.name}" if gw is not None else "gateway"
    name = f"gwpolicy:{where}" + (f":{tel['serviceName']}" if isinstance(tel.get("serviceName"), str) else "")
    iv = duration_s(exp["interval"]) if isinstance(exp.get("interval"), str) else None
    return Exporter(endpoint=str(exp["endpoint"]).split("://", 1)[-1], interval_s=iv or DEFAULT_INTERVAL_S,
                    batch_size=int(exp.get("batchSize") or DEFAULT_BATCH_SIZE),
                    batch_count=int(exp.get("batchCount") or DEFAULT_BATCH_COUNT),
                    service_name=name, attributes=attributes(tel.get("spanAttributes")))


def accepted_note(spec: dict[str, Any] | None, where: str) -> str:
    """What the accepted condition adds about the NginxProxy in use ("" without one)."""
    if spec is None:
        return ""
    rest = unhonoured(spec)
    return f" {where}: NginxProxy in use" + (f"; not honoured by this gateway: {', '.join(rest)}." if rest else ".")
