"""ObservabilityPolicy tracing as NGINX 1.22 configuration (it has no OpenTelemetry module).

NGINX makes the ids and decides sampling; the gateway process turns what NGINX logs into spans
(gateway/spanrelay.py) and exports them over OTLP. Per request of a traced route:

- the trace id is the incoming `traceparent`'s when the policy extracts it (`extract`,
  `propagate`) and it is a valid W3C one, else `$request_id` (32 random hex digits); the span id is
  16 other hex digits of `$request_id`;
- sampling: `ratio` is a `split_clients` over the trace id (every gateway on one trace decides
  alike), `parent` follows the incoming sampled flag, ratio 100 is always, ratio 0 programs nothing;
- `inject` and `propagate` send the backend `traceparent: 00-<trace>-<gateway's span>-<flags>`
  (`inject` drops the caller's `tracestate`: the trace is a new one);
- a sampled request is logged, as one JSON line (`escape=json`), by syslog over UDP on loopback to
  the gateway process: route key, ids, method, status, timings (`$msec`, `$request_time`, the
  upstream's connect, header and response times). The send never blocks a request.

No tenant string reaches nginx.conf: a location names its route by a key, 16 hex digits of a
digest; the span name, the attributes and the route's name stay with the gateway process
(`table`). What NGINX is given is hex, digits and the variables below.

Pure: the data plane in, text and the relay's table out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import nginxproxy

GROUP = "gateway.nginx.org"
KIND = "ObservabilityPolicy"
TARGET_KINDS = ("HTTPRoute", "GRPCRoute")
STRATEGIES = ("ratio", "parent")
CONTEXTS = ("extract", "inject", "propagate", "ignore")
TAG = "gwtrace"  # the syslog tag of the lines NGINX sends the relay

#: the line NGINX logs for a sampled request (escape=json: every value is a JSON string)
LOG_FORMAT = ("log_format gwtrace escape=json '{"
              '"r":"$gw_tr_route","t":"$gw_tr_trace","s":"$gw_span_id","p":"$gw_tr_parent",'
              '"st":"$status","m":"$request_method","end":"$msec","rt":"$request_time",'
              '"uc":"$upstream_connect_time","uh":"$upstream_header_time","ur":"$upstream_response_time",'
              '"h":"$host","sp":"$server_port","pr":"$server_protocol","c":"$remote_addr",'
              '"gs":"$upstream_http_grpc_status$upstream_trailer_grpc_status","u":"$request_uri"'
              "}';")

_VALID = "00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-[0-9a-f]{2}"

#: the http-context lines every traced location relies on
HTTP_LINES = (
    "# W3C traceparent of the request: version 00, non-zero lower-case ids",
    f'map $http_traceparent $gw_in_trace {{ "~^{_VALID}$" $1; default ""; }}',
    f'map $http_traceparent $gw_in_span {{ "~^{_VALID}$" $2; default ""; }}',
    'map $http_traceparent $gw_in_sampled { "~^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f][13579bdf]$" 1; '
    'default 0; }',
    "# the trace a route that extracts continues: the incoming one, else a new one",
    'map $gw_in_trace $gw_ext_trace { "" $request_id; default $gw_in_trace; }',
    "# the gateway's span id: 16 of $request_id's 32 random hex digits",
    'map $request_id $gw_span_id { "~([0-9a-f]{16})$" $1; }',
    "# what a traced location sets (declared here for the log format)",
    'map "" $gw_tr_route { default ""; }',
    'map "" $gw_tr_trace { default ""; }',
    'map "" $gw_tr_parent { default ""; }',
    'map "" $gw_tr_sampled { default 0; }',
    LOG_FORMAT,
)


@dataclass(frozen=True)
class Tracing:
    """An ObservabilityPolicy's tracing, with NGF's defaults filled in."""

    strategy: str = "ratio"
    ratio: int = 100
    context: str = "ignore"
    span_name: str = ""
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RouteTrace:
    """What the relay knows of one traced rule (its key in the log line)."""

    route: str  # "HTTPRoute/ns/name" or "GRPCRoute/ns/name"
    http_route: str  # the rule's match, e.g. "/coffee" or "/pkg.Service/Method"
    span_name: str = ""  # the policy's spanName; else "<METHOD> <http_route>"
    attributes: tuple[tuple[str, str], ...] = ()  # the policy's spanAttributes, then the NginxProxy's
    exporter: nginxproxy.Exporter | None = None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def spec_problems(spec: Any) -> list[str]:
    """Why an ObservabilityPolicy's spec cannot be honoured (each names the field); the CRD
    refuses these too, but `gwpolicy render -f` and an API server without the CRD's validation do not."""
    spec = _dict(spec)
    out: list[str] = []
    refs = spec.get("targetRefs")
    if isinstance(refs, list):
        if len(refs) > 16:
            out.append(f"spec.targetRefs: {len(refs)} entries, at most 16")
        for i, r in enumerate(refs):
            if _dict(r).get("kind") not in TARGET_KINDS:
                out.append(f"spec.targetRefs[{i}].kind: {_dict(r).get('kind')!r} is not HTTPRoute or GRPCRoute")
    tr = spec.get("tracing")
    if tr is None:
        return out
    if not isinstance(tr, dict):
        return out + ["spec.tracing: not an object"]
    for k in sorted(set(tr) - {"strategy", "ratio", "context", "spanName", "spanAttributes"}):
        out.append(f"spec.tracing.{k}: ObservabilityPolicy has no such field")
    if tr.get("strategy") not in STRATEGIES:
        out.append(f"spec.tracing.strategy: {tr.get('strategy')!r} is not ratio or parent")
    ratio = tr.get("ratio")
    if ratio is not None:
        if not isinstance(ratio, int) or isinstance(ratio, bool) or not 0 <= ratio <= 100:
            out.append(f"spec.tracing.ratio: {ratio!r} is not an integer in 0..100")
        elif tr.get("strategy") == "parent":
            out.append("spec.tracing.ratio: only with strategy ratio")
    ctx = tr.get("context")
    if ctx is not None and ctx not in CONTEXTS:
        out.append(f"spec.tracing.context: {ctx!r} is not one of {', '.join(CONTEXTS)}")
    name = tr.get("spanName")
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= 255 or '"' in name or "$" in name):
        out.append(f"spec.tracing.spanName: {name!r} is not 1-255 characters without '\"' or '$'")
    if tr.get("spanAttributes") is not None:
        out += nginxproxy.attribute_problems(tr["spanAttributes"], "spec.tracing.spanAttributes")
    return out


def tracing_of(spec: Any) -> Tracing | None:
    """The tracing an ObservabilityPolicy's (effective) spec asks for, None without one or when it is invalid."""
    tr = _dict(spec).get("tracing")
    if not isinstance(tr, dict) or spec_problems({"tracing": tr}):
        return None
    strategy = str(tr.get("strategy"))
    return Tracing(strategy=strategy, ratio=int(tr.get("ratio", 100)) if strategy == "ratio" else 100,
                   context=str(tr.get("context") or "ignore"), span_name=str(tr.get("spanName") or ""),
                   attributes=nginxproxy.attributes(tr.get("spanAttributes")))


def effective_spec(eff: Mapping[Any, Any] | None) -> Any:
    """The ObservabilityPolicy's effective spec on a path (the engine's Result or a dict), or None."""
    for key, value in (eff or {}).items():
        if key in ((GROUP, KIND), KIND, f"{GROUP}/{KIND}"):
            return getattr(value, "spec", value)
    return None


def _gateway(listener: Ref) -> Ref:
    return Ref(listener.group, "Gateway", listener.namespace, listener.name)


def action_trace(action: Any, effective: Mapping[Any, Any] | None,
                 exporters: Mapping[Ref, nginxproxy.Exporter]) -> tuple[str, Tracing, RouteTrace] | None:
    """(key, tracing, what the relay needs) for one rule's match on one path, None when it is not
    traced: no ObservabilityPolicy with tracing on its path, no exporter for its Gateway, or ratio 0."""
    exporter = exporters.get(_gateway(action.listener))
    if exporter is None:
        return None
    tr = tracing_of(effective_spec(effective))
    if tr is None or (tr.strategy == "ratio" and tr.ratio == 0):
        return None
    route: Ref = action.route
    rt = RouteTrace(route=f"{route.kind}/{route.namespace}/{route.name}", http_route=str(action.path_value or "/"),
                    span_name=tr.span_name, attributes=tr.attributes + exporter.attributes, exporter=exporter)
    key = hashlib.sha256(repr((rt, action.id, tr)).encode()).hexdigest()[:16]
    return key, tr, rt


def table(dp: Any) -> dict[str, RouteTrace]:
    """Every traced rule's key -> what the relay needs, over the whole data plane (render writes the
    same keys: `action_trace` over the same actions and effective policies)."""
    exporters = getattr(dp, "exporters", None) or {}
    out: dict[str, RouteTrace] = {}
    if not exporters:
        return out
    for a in dp.actions.values():
        got = action_trace(a, a.effective, exporters)  # the rule's path: where ObservabilityPolicy (Direct on routes) is
        if got is not None:
            out[got[0]] = got[2]
    return out


def ratio_split(percent: int) -> tuple[str, str]:
    """(variable, split_clients block) of a ratio: over the trace id, so that every gateway on a
    trace decides alike for a continued trace."""
    var = f"$gw_ratio_{percent}"
    return var, f'split_clients "$gw_tr_trace" {var} {{\n    {percent}% 1;\n    * 0;\n}}\n'


def syslog_target(address: str) -> str:
    """The access_log destination of the relay at `address` (host:port on loopback)."""
    return f"syslog:server={address},nohostname,tag={TAG}"


def location_lines(key: str, tr: Tracing, relay: str, splits: dict[str, str] | None = None,
                   header_directive: str = "proxy_set_header") -> tuple[list[str], list[str]]:
    """(lines before the proxying, request header lines) of one traced location; `splits` gets the
    ratio's split_clients. A location's own proxy_set_header replaces every one it would inherit,
    so the caller adds its base headers with the header lines."""
    from gwpolicy.gateway.conftext import put

    extract = tr.context in ("extract", "propagate")
    if tr.strategy == "parent":
        sampled = "$gw_in_sampled"
    elif tr.ratio >= 100:
        sampled = "1"
    else:
        sampled, block = ratio_split(tr.ratio)
        if splits is not None:
            put(splits, sampled, block)
    lines = [f"set $gw_tr_route {key};", f"set $gw_tr_trace {'$gw_ext_trace' if extract else '$request_id'};",
             f"set $gw_tr_parent {'$gw_in_span' if extract else chr(34) * 2};", f"set $gw_tr_sampled {sampled};",
             f"access_log {syslog_target(relay)} gwtrace if=$gw_tr_sampled;"]
    headers: list[str] = []
    if tr.context in ("inject", "propagate"):
        headers.append(f"{header_directive} traceparent 00-$gw_tr_trace-$gw_span_id-0$gw_tr_sampled;")
        if tr.context == "inject":
            headers.append(f'{header_directive} tracestate "";')
    return lines, headers
