"""The Table columns kube-apiserver prints for the built-in kinds the sandbox serves (its table
printers, pkg/printers/internalversion, v1.32): `kubectl get configmaps` shows NAME, DATA, AGE from
a real server, not NAME, AGE. A server prints every column (kubectl hides those of priority 1 unless
`-o wide`). Kinds without a printer there (a CRD) get the default table: NAME, CREATED AT.

Each printer is a list of columns and a function from an object (as stored: JSON, defaults applied)
to the cells after NAME (an Event's table has no NAME first: `NAMELESS`). Descriptions are this
project's own short words (kubectl does not show them).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

Cells = Callable[[dict[str, Any]], list[Any]]


def age(obj: dict[str, Any]) -> str:
    """translateTimestampSince: the object's age as kubectl prints it (`<unknown>` without one)."""
    return since(obj.get("metadata", {}).get("creationTimestamp"))


def since(ts: Any) -> str:
    from gwpolicy.files.printers import age as human_age

    if not isinstance(ts, str) or not ts:
        return "<unknown>"
    return human_age(ts, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def _col(name: str, description: str, priority: int = 0, ctype: str = "string") -> dict[str, Any]:
    return {"name": name, "type": ctype, "format": "", "description": description, "priority": priority}


AGE = _col("Age", "time since the object was created")


def _more(shown: list[str], count: int, most: int = 3) -> str:
    """listWithMoreString: the first three, `+ N more...` past them, `<unset>` for none."""
    text = ",".join(shown)
    if count > most:
        return f"{text} + {count - most} more..."
    return text or "<unset>"


def _slice_ports(obj: dict[str, Any]) -> str:
    ports = obj.get("ports") or []
    shown = [str(p["port"]) if p.get("port") is not None else (p.get("name") if p.get("name") is not None else "*")
             for p in ports[:3]]
    return _more(shown, len(ports))


def _slice_endpoints(obj: dict[str, Any]) -> str:
    addresses = [a for ep in obj.get("endpoints") or [] for a in ep.get("addresses") or []]
    return _more(addresses[:3], len(addresses))


def _service_external_ip(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """getServiceExternalIP (wide, as a server prints it)."""
    kind, external = spec.get("type") or "ClusterIP", spec.get("externalIPs") or []
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) or "<none>"
    if kind == "LoadBalancer":
        ingress = (status.get("loadBalancer") or {}).get("ingress") or []
        lb = sorted({i.get("ip") or i.get("hostname") for i in ingress if i.get("ip") or i.get("hostname")})
        if external:
            return ",".join(lb + external)
        return ",".join(lb) or "<pending>"
    if kind == "ExternalName":
        return spec.get("externalName") or ""
    return "<unknown>"


def _service_ports(spec: dict[str, Any]) -> str:
    pieces = []
    for p in spec.get("ports") or []:
        node = f":{p['nodePort']}" if p.get("nodePort") else ""
        pieces.append(f"{p.get('port')}{node}/{p.get('protocol') or 'TCP'}")
    return ",".join(pieces) or "<none>"


def _labels(labels: dict[str, str] | None) -> str:
    """labels.FormatLabels: `k=v,...` sorted by key, `<none>` when empty."""
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "<none>"


def _selector(selector: dict[str, Any] | None) -> str:
    """A LabelSelector as its labels.Selector's String(): requirements sorted by key ("" for none)."""
    if not isinstance(selector, dict):
        return ""
    reqs: list[tuple[str, str]] = [(k, f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key", ""), e.get("operator"), ",".join(sorted(e.get("values") or []))
        shown = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                 "DoesNotExist": f"!{key}"}.get(op, key)
        reqs.append((key, shown))
    return ",".join(text for _, text in sorted(reqs))


def _subjects(obj: dict[str, Any]) -> list[str]:
    """SubjectsStrings: the users, groups and service accounts (`namespace/name`) of a binding."""
    users, groups, sas = [], [], []
    for s in obj.get("subjects") or []:
        if s.get("kind") == "ServiceAccount":
            sas.append(f"{s.get('namespace', '')}/{s.get('name', '')}")
        elif s.get("kind") == "User":
            users.append(s.get("name", ""))
        elif s.get("kind") == "Group":
            groups.append(s.get("name", ""))
    return [", ".join(users), ", ".join(groups), ", ".join(sas)]


def _binding(obj: dict[str, Any]) -> list[Any]:
    ref = obj.get("roleRef") or {}
    return [f"{ref.get('kind', '')}/{ref.get('name', '')}", age(obj), *_subjects(obj)]


def _created_at(obj: dict[str, Any]) -> list[Any]:
    """The default table's CREATED AT: the timestamp itself (RFC 3339, UTC)."""
    return [obj.get("metadata", {}).get("creationTimestamp")]


def _deployment(obj: dict[str, Any]) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    return [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}", status.get("updatedReplicas", 0),
            status.get("availableReplicas", 0), age(obj), ",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers), _selector(spec.get("selector"))]


def _event(obj: dict[str, Any]) -> list[Any]:
    first = since(obj.get("firstTimestamp")) if obj.get("firstTimestamp") else since(obj.get("eventTime"))
    last = since(obj.get("lastTimestamp")) if obj.get("lastTimestamp") else first
    count = obj.get("count") or 1
    if obj.get("series"):
        last, count = since(obj["series"].get("lastObservedTime")), obj["series"].get("count", count)
    involved = obj.get("involvedObject") or {}
    kind = (involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    host = source.get("host") or obj.get("reportingInstance") or ""
    shown_source = component + (f", {host}" if host and component else "")
    return [last, obj.get("type", ""), obj.get("reason", ""), target, involved.get("fieldPath", ""), shown_source,
            (obj.get("message") or "").strip(), first, count, obj["metadata"]["name"]]


def _vap_binding(obj: dict[str, Any]) -> list[Any]:
    spec = obj.get("spec") or {}
    ref, param = spec.get("paramRef"), "<unset>"
    if isinstance(ref, dict):
        if ref.get("name"):
            param = f"{ref.get('namespace') or '*'}/{ref['name']}"
        elif ref.get("selector") is not None:
            param = _selector(ref["selector"])
    return [spec.get("policyName", ""), param, age(obj)]


def _vap(obj: dict[str, Any]) -> list[Any]:
    spec = obj.get("spec") or {}
    kind = spec.get("paramKind")
    shown = f"{kind.get('apiVersion', '')}/{kind.get('kind', '')}" if isinstance(kind, dict) else "<unset>"
    return [len(spec.get("validations") or []), shown, age(obj)]


BINDING_COLUMNS = [_col("Role", "the role bound"), AGE, _col("Users", "users bound", 1),
                   _col("Groups", "groups bound", 1), _col("ServiceAccounts", "service accounts bound", 1)]
WEBHOOK_COLUMNS = [_col("Webhooks", "how many webhooks it configures", ctype="integer"), AGE]
CREATED_AT = [_col("Created At", "when the object was created", ctype="date")]

#: kinds whose table does not begin with NAME (an Event's name is its last, wide column)
NAMELESS = {("", "Event")}

#: (group, kind) -> the columns after NAME, and their cells
PRINTERS: dict[tuple[str, str], tuple[list[dict[str, Any]], Cells]] = {
    ("", "ConfigMap"): ([_col("Data", "how many keys it holds"), AGE],
                       lambda o: [len(o.get("data") or {}) + len(o.get("binaryData") or {}), age(o)]),
    ("", "Secret"): ([_col("Type", "the secret's type"), _col("Data", "how many keys it holds"), AGE],
                    lambda o: [o.get("type", ""), len(o.get("data") or {}), age(o)]),
    ("", "Namespace"): ([_col("Status", "the namespace's phase"), AGE],
                       lambda o: [(o.get("status") or {}).get("phase", ""), age(o)]),
    ("", "ServiceAccount"): ([_col("Secrets", "how many secrets it lists"), AGE],
                            lambda o: [len(o.get("secrets") or []), age(o)]),
    ("", "Service"): ([_col("Type", "the service's type"), _col("Cluster-IP", "its first cluster IP"),
                       _col("External-IP", "where it is reached from outside"), _col("Port(s)", "its ports"), AGE,
                       _col("Selector", "the pods it selects", 1)],
                      lambda o: [(o.get("spec") or {}).get("type", ""),
                                 ((o.get("spec") or {}).get("clusterIPs") or ["<none>"])[0],
                                 _service_external_ip(o.get("spec") or {}, o.get("status") or {}),
                                 _service_ports(o.get("spec") or {}), age(o),
                                 _labels((o.get("spec") or {}).get("selector"))]),
    ("", "Event"): ([_col("Last Seen", "when it was last seen"), _col("Type", "Normal or Warning"),
                     _col("Reason", "why"), _col("Object", "the object it is about"),
                     _col("Subobject", "the part of the object", 1), _col("Source", "who reported it", 1),
                     _col("Message", "what happened"), _col("First Seen", "when it was first seen", 1),
                     _col("Count", "how many times", 1),
                     {**_col("Name", "its name", 1), "format": "name"}], _event),
    ("discovery.k8s.io", "EndpointSlice"): ([_col("AddressType", "the addresses' type"),
                                             _col("Ports", "its ports"), _col("Endpoints", "its addresses"), AGE],
                                            lambda o: [o.get("addressType", ""), _slice_ports(o),
                                                       _slice_endpoints(o), age(o)]),
    ("apps", "Deployment"): ([_col("Ready", "ready replicas of those wanted"),
                              _col("Up-to-date", "replicas of the latest template"),
                              _col("Available", "replicas available"), AGE,
                              _col("Containers", "the template's containers", 1),
                              _col("Images", "the template's images", 1), _col("Selector", "the pods it selects", 1)],
                             _deployment),
    ("coordination.k8s.io", "Lease"): ([_col("Holder", "who holds it"), AGE],
                                       lambda o: [(o.get("spec") or {}).get("holderIdentity") or "", age(o)]),
    ("rbac.authorization.k8s.io", "Role"): (CREATED_AT, _created_at),
    ("rbac.authorization.k8s.io", "ClusterRole"): (CREATED_AT, _created_at),
    ("rbac.authorization.k8s.io", "RoleBinding"): (BINDING_COLUMNS, _binding),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): (BINDING_COLUMNS, _binding),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"):
        (WEBHOOK_COLUMNS, lambda o: [len(o.get("webhooks") or []), age(o)]),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"):
        (WEBHOOK_COLUMNS, lambda o: [len(o.get("webhooks") or []), age(o)]),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"):
        ([_col("Validations", "how many validations", ctype="integer"), _col("ParamKind", "its parameters' kind"), AGE],
         _vap),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"):
        ([_col("PolicyName", "the policy bound"), _col("ParamRef", "its parameters"), AGE], _vap_binding),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): (CREATED_AT, _created_at),
}
