"""Validating admission webhooks, called as kube-apiserver calls them.

For a write, every webhook of every stored ValidatingWebhookConfiguration whose rules match
(operation, group, version, resource or `resource/subresource`, scope), whose namespaceSelector matches
the labels of the object's namespace (a Namespace's own labels, for a Namespace) and whose
objectSelector matches the new or the old object is sent an AdmissionReview (admission.k8s.io/v1) over
HTTPS, verified against its `caBundle`, within `timeoutSeconds` (default 10). A denial answers the
client as kube-apiserver does (`admission webhook "NAME" denied the request: ...`, the webhook's code,
at least 400); a webhook that cannot be called fails the write under `failurePolicy: Fail` (the
default) and is passed over under `Ignore`. Warnings are returned to the client as `Warning` headers.
A dry run is sent as `dryRun: true`; a webhook whose `sideEffects` is not None/NoneOnDryRun makes a dry
run fail, as there.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gwpolicy.engine.topology import selector_matches
from gwpolicy.sandbox.objects import ApiFailure
from gwpolicy.sandbox.resources import Resource
from gwpolicy.sandbox.store import Store

log = logging.getLogger("gwpolicy.sandbox.admission")

VWC_GROUP, VWC_PLURAL = "admissionregistration.k8s.io", "validatingwebhookconfigurations"


@dataclass
class Call:
    """What one write asks the webhooks to validate."""

    resource: Resource
    version: str
    subresource: str | None
    operation: str  # CREATE | UPDATE | DELETE
    namespace: str  # "" for cluster-scoped
    name: str
    obj: dict[str, Any] | None
    old: dict[str, Any] | None
    dry_run: bool
    user: str = "sandbox-user"
    warnings: list[str] = field(default_factory=list)


def _listed(values: Any, value: str) -> bool:
    return isinstance(values, list) and ("*" in values or value in values)


def _resource_matches(patterns: Any, plural: str, sub: str | None) -> bool:
    if not isinstance(patterns, list):
        return False
    want = f"{plural}/{sub}" if sub else plural
    for p in patterns:
        if p == want or p == "*/*":
            return True
        if p == "*" and not sub:
            return True
        if sub and p == f"*/{sub}" or sub and p == f"{plural}/*":
            return True
    return False


def rule_matches(rule: dict[str, Any], call: Call) -> bool:
    r = call.resource
    if not (_listed(rule.get("operations"), call.operation) and _listed(rule.get("apiGroups"), r.group)
            and _listed(rule.get("apiVersions"), call.version)
            and _resource_matches(rule.get("resources"), r.plural, call.subresource)):
        return False
    scope = rule.get("scope") or "*"
    return scope == "*" or (scope == "Namespaced") == r.namespaced


def _labels(obj: dict[str, Any] | None) -> dict[str, str]:
    labels = ((obj or {}).get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _selects(selector: Any, labels: dict[str, str]) -> bool:
    return not selector or selector_matches(selector, labels)


def webhook_matches(hook: dict[str, Any], call: Call, store: Store) -> bool:
    if not any(rule_matches(rule, call) for rule in hook.get("rules") or [] if isinstance(rule, dict)):
        return False
    ns_sel = hook.get("namespaceSelector")
    if ns_sel:
        r = call.resource
        if r.group == "" and r.plural == "namespaces":
            if not (_selects(ns_sel, _labels(call.obj)) or _selects(ns_sel, _labels(call.old))):
                return False
        elif r.namespaced:
            ns_obj = store.objects.get(("", "namespaces", "", call.namespace))
            if not _selects(ns_sel, _labels(ns_obj)):
                return False
    obj_sel = hook.get("objectSelector")
    if obj_sel and not (_selects(obj_sel, _labels(call.obj)) or _selects(obj_sel, _labels(call.old))):
        return False
    return True


def review_body(call: Call, uid: str) -> dict[str, Any]:
    r = call.resource
    gvk = {"group": r.group, "version": call.version, "kind": r.kind}
    gvr = {"group": r.group, "version": call.version, "resource": r.plural}
    req: dict[str, Any] = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                           "name": call.name, "operation": call.operation,
                           "userInfo": {"username": call.user, "groups": ["system:masters", "system:authenticated"]},
                           "object": call.obj, "oldObject": call.old, "dryRun": call.dry_run,
                           "options": {"apiVersion": "meta.k8s.io/v1",
                                       "kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions",
                                                "DELETE": "DeleteOptions"}[call.operation]}}
    if call.subresource:
        req["subResource"] = call.subresource
        req["requestSubResource"] = call.subresource
    if call.namespace:
        req["namespace"] = call.namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def _ssl(ca_bundle: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if ca_bundle:
        ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
    return ctx


def _url(client: dict[str, Any]) -> str:
    if client.get("url"):
        return str(client["url"])
    svc = client.get("service") or {}
    # the sandbox has no cluster DNS: a Service reference is called at its DNS name, which fails
    # unless the name resolves here (failurePolicy then decides, as for an unreachable webhook)
    return f"https://{svc.get('name')}.{svc.get('namespace')}.svc:{svc.get('port', 443)}{svc.get('path') or ''}"


class Admission:
    """The webhooks of a Store, called for each write."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def hooks(self, call: Call) -> list[dict[str, Any]]:
        out = []
        for key in sorted(self.store.objects.keys_of(VWC_GROUP, VWC_PLURAL)):
            cfg = self.store.objects[key]
            for hook in cfg.get("webhooks") or []:
                if isinstance(hook, dict) and webhook_matches(hook, call, self.store):
                    out.append(hook)
        return out

    def active(self) -> bool:
        return self.store.objects.has(VWC_GROUP, VWC_PLURAL)

    async def validate(self, call: Call) -> None:
        """Call every matching webhook; raise ApiFailure on a denial or a failure that must fail the
        write; gather warnings into call.warnings."""
        hooks = self.hooks(call)
        if not hooks:
            return
        results = await asyncio.gather(*(self._one(h, call) for h in hooks))
        for warnings, failure in results:
            call.warnings.extend(warnings)
        for _, failure in results:
            if failure is not None:
                raise failure

    async def _one(self, hook: dict[str, Any], call: Call) -> tuple[list[str], ApiFailure | None]:
        name = str(hook.get("name", ""))
        fail_open = hook.get("failurePolicy", "Fail") == "Ignore"
        if call.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            return [], ApiFailure(400, "BadRequest", f"admission webhook {name!r} does not support dry run")
        timeout = min(max(int(hook.get("timeoutSeconds") or 10), 1), 30)
        uid = str(uuid.uuid4())
        client = hook.get("clientConfig") or {}
        self.calls += 1
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
                async with http.post(_url(client), data=orjson.dumps(review_body(call, uid)),
                                        headers={"Content-Type": "application/json"},
                                        ssl=_ssl(client.get("caBundle"))) as resp:
                    if resp.status != 200:
                        raise ValueError(f"the server responded with status {resp.status}")
                    answer = orjson.loads(await resp.read())
            response = answer.get("response") if isinstance(answer, dict) else None
            if not isinstance(response, dict) or response.get("uid") != uid:
                raise ValueError("the response is not an AdmissionReview for this request")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, ssl.SSLError) as exc:
            why = "context deadline exceeded" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
            if fail_open:
                log.warning("failed calling webhook %s (ignored): %s", name, why)
                return [], None
            return [], ApiFailure(500, "InternalError",
                                  f'Internal error occurred: failed calling webhook "{name}": failed to call webhook: '
                                  f'Post "{_url(client)}": {why}')
        warnings = [str(w) for w in response.get("warnings") or []]
        if response.get("allowed"):
            return warnings, None
        st: Any = response.get("status") if isinstance(response.get("status"), dict) else {}
        code = int(st.get("code") or 0)
        code = code if code >= 400 else 400
        denied = f'admission webhook "{name}" denied the request'
        msg = st.get("message") or st.get("reason")
        message = f"{denied}: {msg}" if msg else f"{denied} without explanation"
        return warnings, ApiFailure(code, st.get("reason") or "BadRequest", message)


def warning_header(text: str) -> str:
    """RFC 7234 warning value as kube-apiserver sends it: `299 - "text"`, quotes and backslashes escaped."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return '299 - "' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"'
