"""Objects one tenant may create that NGINX 1.22 would refuse, each of which used to make NGINX reject
the whole configuration (every tenant's): values the CRDs accept but NGINX cannot read (a 4 KiB header
value, a 20-digit duration, a zone of 1 byte or of 1g), a keep-alive cache NGINX cannot allocate, a
CA bundle that does not parse, a certificate whose key is another's. Shared by the offline test
(`render` + `nginx -t`) and the live one (sandbox, gateway process, traffic).

The setting: the platform's Gateway `infra/shared` (an HTTP listener, and an HTTPS one serving
tenant-a's certificate Secret through a ReferenceGrant), tenant-a's route `a-route` and Service
`web`, tenant-b's route `b-route` and Service `web`. `freezing_objects()` gives, per case, what
tenant-a applies and where the refusal must show.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

GW = "gateway.networking.k8s.io"
POLICY = "gwpolicy.io/v1alpha1"
LONG_DIGITS = "99999999999999999999"


def _meta(name: str, ns: str | None = None, **extra: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, **extra}
    if ns:
        m["namespace"] = ns
    return m


def route(name: str, ns: str, host: str, rule: dict[str, Any] | None = None) -> dict[str, Any]:
    rule = {"backendRefs": [{"name": "web", "port": 8080}], **(rule or {})}
    return {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": _meta(name, ns),
            "spec": {"parentRefs": [{"name": "shared", "namespace": "infra", "sectionName": "http"}],
                     "hostnames": [host], "rules": [rule]}}


def tls_secret(name: str, ns: str, cert: bytes, key: bytes) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(name, ns), "type": "kubernetes.io/tls",
            "data": {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}}


def base_objects(http_port: int, https_port: int, a_cert: tuple[bytes, bytes],
                 endpoints: dict[str, tuple[str, int]]) -> list[dict[str, Any]]:
    """The healthy cluster. `endpoints`: namespace -> (address, port) of its Service `web`."""
    out: list[dict[str, Any]] = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": _meta("gwpolicy"),
         "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)} for ns in ("infra", "tenant-a", "tenant-b")),
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": _meta("shared", "infra"),
         "spec": {"gatewayClassName": "gwpolicy", "listeners": [
             {"name": "http", "port": http_port, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}},
             {"name": "https", "port": https_port, "protocol": "HTTPS", "hostname": "a.example",
              "tls": {"certificateRefs": [{"name": "a-cert", "namespace": "tenant-a"}]},
              "allowedRoutes": {"namespaces": {"from": "All"}}}]}},
        {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": _meta("gateway-may-use-a-cert", "tenant-a"),
         "spec": {"from": [{"group": GW, "kind": "Gateway", "namespace": "infra"}],
                  "to": [{"group": "", "kind": "Secret", "name": "a-cert"}]}},
        tls_secret("a-cert", "tenant-a", *a_cert),
        route("a-route", "tenant-a", "a.example"),
        route("b-route", "tenant-b", "b.example"),
    ]
    for ns, (address, port) in endpoints.items():
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta("web", ns),
                    "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]}})
        out.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": _meta("web-1", ns, labels={"kubernetes.io/service-name": "web"}),
                    "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]})
    return out


@dataclass(frozen=True)
class Case:
    """One freezing object: what tenant-a applies, and the condition that must say why (on `kind`
    `namespace/name`: a route's parent, a policy's ancestor, or a listener `section` of a Gateway)."""

    name: str
    objects: tuple[dict[str, Any], ...]
    kind: str
    namespace: str
    object_name: str
    condition: str
    reason: str
    says: str  # a part of the message: the field
    section: str | None = None


def _policy(kind: str, name: str, settings: dict[str, Any], target: tuple[str, str, str]) -> dict[str, Any]:
    group, tkind, tname = target
    stanza = settings if kind == "UpstreamSettingsPolicy" else {"default": settings}  # a Direct kind: no stanza
    return {"apiVersion": POLICY, "kind": kind, "metadata": _meta(name, "tenant-a"),
            "spec": {"targetRefs": [{"group": group, "kind": tkind, "name": tname}], **stanza}}


def freezing_objects(other_cert: tuple[bytes, bytes], a_cert: tuple[bytes, bytes]) -> list[Case]:
    """Every case, one object each (every object passes the CRDs' validation)."""
    a_route = (GW, "HTTPRoute", "a-route")
    service = ("", "Service", "web")
    out = []

    def bad_route(name: str, rule: dict[str, Any], says: str) -> None:
        # a path of its own: a rule on `/` would lose to the older a-route's and never be rendered
        rule.setdefault("matches", [{"path": {"type": "PathPrefix", "value": f"/{name}"}}])
        out.append(Case(name, (route(f"a-{name}", "tenant-a", "a.example", rule),), "HTTPRoute", "tenant-a",
                        f"a-{name}", "Accepted", "UnsupportedValue", says))

    bad_route("set-4k", {"filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": "X-A", "value": "a" * 4096}]}}]}, "requestHeaderModifier.set[0].value")
    bad_route("resp-add-4k", {"filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
        "add": [{"name": "X-A", "value": "a" * 4096}]}}]}, "responseHeaderModifier.add[0].value")
    bad_route("dots", {"matches": [{"path": {"type": "PathPrefix", "value": "/d"},
                                    "headers": [{"name": "X-D", "value": "." * 1370}]}]}, "spec.rules[0].matches[0]")
    bad_route("headers", {"matches": [{"path": {"type": "PathPrefix", "value": "/h"},
                                       "headers": [{"name": f"X-H{i}", "value": "h" * 260} for i in range(16)]}]},
              "spec.rules[0].matches[0]")
    bad_route("query", {"matches": [{"path": {"type": "PathPrefix", "value": "/q"},
                                     "queryParams": [{"name": f"q{i}", "value": "q" * 300} for i in range(16)]}]},
              "spec.rules[0].matches[0]")

    def bad_policy(name: str, kind: str, settings: dict[str, Any], says: str, target: tuple[str, str, str] = a_route,
                   extra: tuple[dict[str, Any], ...] = ()) -> None:
        out.append(Case(name, (_policy(kind, f"a-{name}", settings, target), *extra), kind, "tenant-a", f"a-{name}",
                        "Accepted", "Invalid", says))

    bad_policy("read-timeout", "TimeoutPolicy", {"readTimeout": LONG_DIGITS}, "readTimeout")
    bad_policy("idle-timeout", "TimeoutPolicy", {"idleTimeout": LONG_DIGITS}, "idleTimeout")
    bad_policy("retry-budget", "RetryPolicy", {"attempts": 3, "retryBudget": LONG_DIGITS}, "retryBudget")
    bad_policy("body-size", "ClientSettingsPolicy", {"body": {"maxSize": LONG_DIGITS + "g"}}, "body.maxSize")
    bad_policy("zone-0", "RateLimitPolicy", {"requests": 5, "zoneSize": 0}, "zoneSize")
    bad_policy("zone-1", "RateLimitPolicy", {"requests": 5, "zoneSize": "1"}, "zoneSize")
    bad_policy("zone-1g", "RateLimitPolicy", {"requests": 5, "zoneSize": "1g"}, "zoneSize")
    bad_policy("upstream-zone-1", "UpstreamSettingsPolicy", {"zoneSize": "1"}, "zoneSize", service)
    bad_policy("upstream-zone-900g", "UpstreamSettingsPolicy", {"zoneSize": "900g"}, "zoneSize", service)
    bad_policy("keepalive", "UpstreamSettingsPolicy", {"keepAlive": {"connections": 2**63 - 1}},
               "keepAlive.connections", service)
    ca = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("bad-ca", "tenant-a"),
          "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}}
    btls = {"apiVersion": f"{GW}/v1", "kind": "BackendTLSPolicy", "metadata": _meta("a-bad-ca", "tenant-a"),
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "web"}],
                     "validation": {"hostname": "web.tenant-a", "caCertificateRefs": [
                         {"group": "", "kind": "ConfigMap", "name": "bad-ca"}]}}}
    out.append(Case("bad-ca", (ca, btls), "BackendTLSPolicy", "tenant-a", "a-bad-ca", "ResolvedRefs",
                    "InvalidCACertificateRef", "is not a valid X.509 certificate"))
    mismatched = tls_secret("a-cert", "tenant-a", a_cert[0], other_cert[1])  # the certificate of one pair, the key of another
    out.append(Case("mismatched-key", (mismatched,), "Gateway", "infra", "shared", "ResolvedRefs", "InvalidCertificateRef",
                    "tls.key is not the private key of the certificate", section="https"))
    return out
