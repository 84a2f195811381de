"""Built-in objects decoded as kube-apiserver decodes them into its Go types: the declared type of
every field (one table of structs below), a wrong JSON type refused with encoding/json's own words
(`json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32`),
`[]byte` fields read as base64 (`illegal base64 data at input byte 4`), unknown fields collected with
their paths (`spec.ports[0].foo`, for `fieldValidation`) and dropped, nulls dropped.

A type is written as Go writes it: `string`, `int32`, `int64`, `bool`, `float64`, `[]byte`, `[]T`,
`map[string]T`, a struct name of STRUCTS, or one of the special types: `Time` (a string on the wire),
`IntOrString`, `JSON` and `Object` (anything; an object).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gwpolicy.sandbox.schema import json_type_name

# ---------- the types of the built-in kinds (kubernetes api/openapi-spec, v1.32) ----------

_META = {
    "ObjectMeta": {"name": "string", "generateName": "string", "namespace": "string", "selfLink": "string",
                   "uid": "string", "resourceVersion": "string", "generation": "int64", "creationTimestamp": "Time",
                   "deletionTimestamp": "Time", "deletionGracePeriodSeconds": "int64",
                   "labels": "map[string]string", "annotations": "map[string]string",
                   "ownerReferences": "[]OwnerReference", "finalizers": "[]string",
                   "managedFields": "[]ManagedFieldsEntry"},
    "OwnerReference": {"apiVersion": "string", "kind": "string", "name": "string", "uid": "string",
                       "controller": "bool", "blockOwnerDeletion": "bool"},
    "ManagedFieldsEntry": {"manager": "string", "operation": "string", "apiVersion": "string", "time": "Time",
                           "fieldsType": "string", "fieldsV1": "Object", "subresource": "string"},
    "LabelSelector": {"matchLabels": "map[string]string", "matchExpressions": "[]LabelSelectorRequirement"},
    "LabelSelectorRequirement": {"key": "string", "operator": "string", "values": "[]string"},
    "Condition": {"type": "string", "status": "string", "observedGeneration": "int64",
                  "lastTransitionTime": "Time", "reason": "string", "message": "string"},
    "ObjectReference": {"kind": "string", "namespace": "string", "name": "string", "uid": "string",
                        "apiVersion": "string", "resourceVersion": "string", "fieldPath": "string"},
    "LocalObjectReference": {"name": "string"},
}

_CORE = {
    "Namespace": {"metadata": "ObjectMeta", "spec": "NamespaceSpec", "status": "NamespaceStatus"},
    "NamespaceSpec": {"finalizers": "[]string"},
    "NamespaceStatus": {"phase": "string", "conditions": "[]NamespaceCondition"},
    "NamespaceCondition": {"type": "string", "status": "string", "lastTransitionTime": "Time", "reason": "string",
                           "message": "string"},
    "Service": {"metadata": "ObjectMeta", "spec": "ServiceSpec", "status": "ServiceStatus"},
    "ServiceSpec": {"ports": "[]ServicePort", "selector": "map[string]string", "clusterIP": "string",
                    "clusterIPs": "[]string", "type": "string", "externalIPs": "[]string",
                    "sessionAffinity": "string", "loadBalancerIP": "string", "loadBalancerSourceRanges": "[]string",
                    "externalName": "string", "externalTrafficPolicy": "string", "healthCheckNodePort": "int32",
                    "publishNotReadyAddresses": "bool", "sessionAffinityConfig": "SessionAffinityConfig",
                    "ipFamilies": "[]string", "ipFamilyPolicy": "string", "allocateLoadBalancerNodePorts": "bool",
                    "loadBalancerClass": "string", "internalTrafficPolicy": "string", "trafficDistribution": "string"},
    "ServicePort": {"name": "string", "protocol": "string", "appProtocol": "string", "port": "int32",
                    "targetPort": "IntOrString", "nodePort": "int32"},
    "SessionAffinityConfig": {"clientIP": "ClientIPConfig"},
    "ClientIPConfig": {"timeoutSeconds": "int32"},
    "ServiceStatus": {"loadBalancer": "LoadBalancerStatus", "conditions": "[]Condition"},
    "LoadBalancerStatus": {"ingress": "[]LoadBalancerIngress"},
    "LoadBalancerIngress": {"ip": "string", "hostname": "string", "ipMode": "string", "ports": "[]PortStatus"},
    "PortStatus": {"port": "int32", "protocol": "string", "error": "string"},
    "Secret": {"metadata": "ObjectMeta", "data": "map[string][]byte", "stringData": "map[string]string",
               "type": "string", "immutable": "bool"},
    "ConfigMap": {"metadata": "ObjectMeta", "data": "map[string]string", "binaryData": "map[string][]byte",
                  "immutable": "bool"},
    "ServiceAccount": {"metadata": "ObjectMeta", "secrets": "[]ObjectReference",
                       "imagePullSecrets": "[]LocalObjectReference", "automountServiceAccountToken": "bool"},
    "Event": {"metadata": "ObjectMeta", "involvedObject": "ObjectReference", "reason": "string", "message": "string",
              "source": "EventSource", "firstTimestamp": "Time", "lastTimestamp": "Time", "count": "int32",
              "type": "string", "eventTime": "Time", "series": "EventSeries", "action": "string",
              "related": "ObjectReference", "reportingComponent": "string", "reportingInstance": "string"},
    "EventSource": {"component": "string", "host": "string"},
    "EventSeries": {"count": "int32", "lastObservedTime": "Time"},
}

_APPS = {  # a Deployment's pod template is not modelled (taken as it comes): docs/sandbox.md
    "Deployment": {"metadata": "ObjectMeta", "spec": "DeploymentSpec", "status": "DeploymentStatus"},
    "DeploymentSpec": {"replicas": "int32", "selector": "LabelSelector", "template": "PodTemplateSpec",
                       "strategy": "DeploymentStrategy", "minReadySeconds": "int32", "revisionHistoryLimit": "int32",
                       "paused": "bool", "progressDeadlineSeconds": "int32"},
    "PodTemplateSpec": {"metadata": "ObjectMeta", "spec": "Object"},
    "DeploymentStrategy": {"type": "string", "rollingUpdate": "RollingUpdateDeployment"},
    "RollingUpdateDeployment": {"maxUnavailable": "IntOrString", "maxSurge": "IntOrString"},
    "DeploymentStatus": {"observedGeneration": "int64", "replicas": "int32", "updatedReplicas": "int32",
                         "readyReplicas": "int32", "availableReplicas": "int32", "unavailableReplicas": "int32",
                         "terminatingReplicas": "int32", "conditions": "[]DeploymentCondition", "collisionCount": "int32"},
    "DeploymentCondition": {"type": "string", "status": "string", "lastUpdateTime": "Time",
                            "lastTransitionTime": "Time", "reason": "string", "message": "string"},
}

_COORDINATION = {
    "Lease": {"metadata": "ObjectMeta", "spec": "LeaseSpec"},
    "LeaseSpec": {"holderIdentity": "string", "leaseDurationSeconds": "int32", "acquireTime": "Time",
                  "renewTime": "Time", "leaseTransitions": "int32", "strategy": "string", "preferredHolder": "string"},
}

_RBAC = {
    "ClusterRole": {"metadata": "ObjectMeta", "rules": "[]PolicyRule", "aggregationRule": "AggregationRule"},
    "Role": {"metadata": "ObjectMeta", "rules": "[]PolicyRule"},
    "PolicyRule": {"verbs": "[]string", "apiGroups": "[]string", "resources": "[]string",
                   "resourceNames": "[]string", "nonResourceURLs": "[]string"},
    "AggregationRule": {"clusterRoleSelectors": "[]LabelSelector"},
    "ClusterRoleBinding": {"metadata": "ObjectMeta", "subjects": "[]Subject", "roleRef": "RoleRef"},
    "RoleBinding": {"metadata": "ObjectMeta", "subjects": "[]Subject", "roleRef": "RoleRef"},
    "Subject": {"kind": "string", "apiGroup": "string", "name": "string", "namespace": "string"},
    "RoleRef": {"apiGroup": "string", "kind": "string", "name": "string"},
}

_DISCOVERY = {
    "EndpointSlice": {"metadata": "ObjectMeta", "addressType": "string", "endpoints": "[]Endpoint",
                      "ports": "[]EndpointPort"},
    "Endpoint": {"addresses": "[]string", "conditions": "EndpointConditions", "hostname": "string",
                 "targetRef": "ObjectReference", "deprecatedTopology": "map[string]string", "nodeName": "string",
                 "zone": "string", "hints": "EndpointHints"},
    "EndpointConditions": {"ready": "bool", "serving": "bool", "terminating": "bool"},
    "EndpointHints": {"forZones": "[]ForZone", "forNodes": "[]ForNode"},
    "ForZone": {"name": "string"},
    "ForNode": {"name": "string"},
    "EndpointPort": {"name": "string", "protocol": "string", "port": "int32", "appProtocol": "string"},
}

_ADMISSION = {
    "ValidatingWebhookConfiguration": {"metadata": "ObjectMeta", "webhooks": "[]ValidatingWebhook"},
    "MutatingWebhookConfiguration": {"metadata": "ObjectMeta", "webhooks": "[]MutatingWebhook"},
    "ValidatingWebhook": {"name": "string", "clientConfig": "WebhookClientConfig", "rules": "[]RuleWithOperations",
                          "failurePolicy": "string", "matchPolicy": "string", "namespaceSelector": "LabelSelector",
                          "objectSelector": "LabelSelector", "sideEffects": "string", "timeoutSeconds": "int32",
                          "admissionReviewVersions": "[]string", "matchConditions": "[]MatchCondition"},
    "WebhookClientConfig": {"url": "string", "service": "ServiceReference", "caBundle": "[]byte"},
    "ServiceReference": {"namespace": "string", "name": "string", "path": "string", "port": "int32"},
    "RuleWithOperations": {"operations": "[]string", "apiGroups": "[]string", "apiVersions": "[]string",
                           "resources": "[]string", "scope": "string"},
    "MatchCondition": {"name": "string", "expression": "string"},
    "ValidatingAdmissionPolicy": {"metadata": "ObjectMeta", "spec": "ValidatingAdmissionPolicySpec",
                                  "status": "ValidatingAdmissionPolicyStatus"},
    "ValidatingAdmissionPolicySpec": {"paramKind": "ParamKind", "matchConstraints": "MatchResources",
                                      "validations": "[]Validation", "failurePolicy": "string",
                                      "auditAnnotations": "[]AuditAnnotation", "matchConditions": "[]MatchCondition",
                                      "variables": "[]Variable"},
    "ParamKind": {"apiVersion": "string", "kind": "string"},
    "MatchResources": {"namespaceSelector": "LabelSelector", "objectSelector": "LabelSelector",
                       "resourceRules": "[]NamedRuleWithOperations", "excludeResourceRules": "[]NamedRuleWithOperations",
                       "matchPolicy": "string"},
    "NamedRuleWithOperations": {"resourceNames": "[]string", "operations": "[]string", "apiGroups": "[]string",
                                "apiVersions": "[]string", "resources": "[]string", "scope": "string"},
    "Validation": {"expression": "string", "message": "string", "reason": "string", "messageExpression": "string"},
    "AuditAnnotation": {"key": "string", "valueExpression": "string"},
    "Variable": {"name": "string", "expression": "string"},
    "ValidatingAdmissionPolicyStatus": {"observedGeneration": "int64", "typeChecking": "TypeChecking",
                                        "conditions": "[]Condition"},
    "TypeChecking": {"expressionWarnings": "[]ExpressionWarning"},
    "ExpressionWarning": {"fieldRef": "string", "warning": "string"},
    "ValidatingAdmissionPolicyBinding": {"metadata": "ObjectMeta", "spec": "ValidatingAdmissionPolicyBindingSpec"},
    "ValidatingAdmissionPolicyBindingSpec": {"policyName": "string", "paramRef": "ParamRef",
                                             "matchResources": "MatchResources", "validationActions": "[]string"},
    "ParamRef": {"name": "string", "namespace": "string", "selector": "LabelSelector",
                 "parameterNotFoundAction": "string"},
}
_ADMISSION["MutatingWebhook"] = dict(_ADMISSION["ValidatingWebhook"], reinvocationPolicy="string")

_APIEXTENSIONS = {
    "CustomResourceDefinition": {"metadata": "ObjectMeta", "spec": "CustomResourceDefinitionSpec",
                                 "status": "CustomResourceDefinitionStatus"},
    "CustomResourceDefinitionSpec": {"group": "string", "names": "CustomResourceDefinitionNames", "scope": "string",
                                     "versions": "[]CustomResourceDefinitionVersion",
                                     "conversion": "CustomResourceConversion", "preserveUnknownFields": "bool"},
    "CustomResourceDefinitionNames": {"plural": "string", "singular": "string", "shortNames": "[]string",
                                      "kind": "string", "listKind": "string", "categories": "[]string"},
    "CustomResourceDefinitionVersion": {"name": "string", "served": "bool", "storage": "bool", "deprecated": "bool",
                                        "deprecationWarning": "string", "schema": "CustomResourceValidation",
                                        "subresources": "CustomResourceSubresources",
                                        "additionalPrinterColumns": "[]CustomResourceColumnDefinition",
                                        "selectableFields": "[]SelectableField"},
    "CustomResourceValidation": {"openAPIV3Schema": "JSONSchemaProps"},
    "CustomResourceSubresources": {"status": "CustomResourceSubresourceStatus", "scale": "CustomResourceSubresourceScale"},
    "CustomResourceSubresourceStatus": {},
    "CustomResourceSubresourceScale": {"specReplicasPath": "string", "statusReplicasPath": "string",
                                       "labelSelectorPath": "string"},
    "CustomResourceColumnDefinition": {"name": "string", "type": "string", "format": "string",
                                       "description": "string", "priority": "int32", "jsonPath": "string"},
    "SelectableField": {"jsonPath": "string"},
    "CustomResourceConversion": {"strategy": "string", "webhook": "WebhookConversion"},
    # (its WebhookClientConfig and ServiceReference have the fields of admissionregistration's, above)
    "WebhookConversion": {"clientConfig": "WebhookClientConfig", "conversionReviewVersions": "[]string"},
    "CustomResourceDefinitionStatus": {"conditions": "[]CustomResourceDefinitionCondition",
                                       "acceptedNames": "CustomResourceDefinitionNames", "storedVersions": "[]string"},
    "CustomResourceDefinitionCondition": {"type": "string", "status": "string", "lastTransitionTime": "Time",
                                          "reason": "string", "message": "string"},
    "JSONSchemaProps": {
        "id": "string", "$schema": "string", "$ref": "string", "description": "string", "type": "string",
        "format": "string", "title": "string", "default": "JSON", "maximum": "float64", "exclusiveMaximum": "bool",
        "minimum": "float64", "exclusiveMinimum": "bool", "maxLength": "int64", "minLength": "int64",
        "pattern": "string", "maxItems": "int64", "minItems": "int64", "uniqueItems": "bool", "multipleOf": "float64",
        "enum": "[]JSON", "maxProperties": "int64", "minProperties": "int64", "required": "[]string",
        "items": "JSONSchemaPropsOrArray", "allOf": "[]JSONSchemaProps", "oneOf": "[]JSONSchemaProps",
        "anyOf": "[]JSONSchemaProps", "not": "JSONSchemaProps", "properties": "map[string]JSONSchemaProps",
        "additionalProperties": "JSONSchemaPropsOrBool", "patternProperties": "map[string]JSONSchemaProps",
        "dependencies": "map[string]JSON", "additionalItems": "JSONSchemaPropsOrBool",
        "definitions": "map[string]JSONSchemaProps", "externalDocs": "ExternalDocumentation", "example": "JSON",
        "nullable": "bool", "x-kubernetes-preserve-unknown-fields": "bool", "x-kubernetes-embedded-resource": "bool",
        "x-kubernetes-int-or-string": "bool", "x-kubernetes-list-map-keys": "[]string",
        "x-kubernetes-list-type": "string", "x-kubernetes-map-type": "string",
        "x-kubernetes-validations": "[]ValidationRule"},
    "ExternalDocumentation": {"description": "string", "url": "string"},
    "ValidationRule": {"rule": "string", "message": "string", "messageExpression": "string", "reason": "string",
                       "fieldPath": "string", "optionalOldSelf": "bool"},
}

STRUCTS: dict[str, dict[str, str]] = {**_META, **_CORE, **_APPS, **_COORDINATION, **_RBAC, **_DISCOVERY,
                                      **_ADMISSION, **_APIEXTENSIONS}

# types that read either of two shapes (a custom UnmarshalJSON in Go)
_EITHER = {"JSONSchemaPropsOrArray": ("JSONSchemaProps", "[]JSONSchemaProps"),
           "JSONSchemaPropsOrBool": ("JSONSchemaProps", "bool")}

_INT_RANGE = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def go_name(t: str) -> str:
    """The type as reflect prints it in encoding/json's errors: `[]v1.ServicePort`, `map[string]string`."""
    if t == "[]byte":
        return "[]uint8"
    if t.startswith("[]"):
        return "[]" + go_name(t[2:])
    if t.startswith("map[string]"):
        return "map[string]" + go_name(t[len("map[string]"):])
    if t in ("string", "int32", "int64", "bool", "float64"):
        return t
    if t == "Time":
        return "string"
    if t == "IntOrString":
        return "int32"
    return "v1." + t


#: encoding/json's words for a JSON type where they are not OpenAPI's (`schema._type_name`)
_GO_KIND = {"boolean": "bool", "integer": "number", "null": "object"}


def _json_kind(value: Any) -> str:
    """The JSON type of a value as encoding/json names it in an UnmarshalTypeError."""
    name = json_type_name(value)
    return _GO_KIND.get(name, name)


def base64_error(text: str) -> str | None:
    """Go's base64.StdEncoding on `text`: None when it decodes, else its CorruptInputError text."""
    alphabet = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    src = text.encode()
    si, n = 0, len(src)
    while True:
        j = 0
        while j < 4:
            if si == n:
                if j == 0:
                    return None
                return f"illegal base64 data at input byte {si - j}"
            c = src[si]
            si += 1
            if c in alphabet:
                j += 1
                continue
            if c in (0x0A, 0x0D):
                continue
            if c != ord("="):
                return f"illegal base64 data at input byte {si - 1}"
            if j in (0, 1):
                return f"illegal base64 data at input byte {si - 1}"
            if j == 2:
                while si < n and src[si] in (0x0A, 0x0D):
                    si += 1
                if si == n:
                    return f"illegal base64 data at input byte {n}"
                if src[si] != ord("="):
                    return f"illegal base64 data at input byte {si - 1}"
                si += 1
            while si < n and src[si] in (0x0A, 0x0D):
                si += 1
            if si < n:
                return f"illegal base64 data at input byte {si}"
            return None


@dataclass
class Decoded:
    """The object as the Go types keep it (unknown fields and nulls dropped), the first type error
    (Go's decoder reports the first), and the unknown fields in the order met."""

    obj: Any
    error: str | None = None
    unknown: list[str] = field(default_factory=list)


class _Decoder:
    def __init__(self) -> None:
        self.error: str | None = None
        self.unknown: list[str] = []

    def fail(self, value: Any, struct: str, names: list[str], t: str, number: str = "") -> None:
        if self.error is None:
            what = _json_kind(value) + (f" {number}" if number else "")
            self.error = (f"json: cannot unmarshal {what} into Go struct field {struct}.{'.'.join(names)} "
                          f"of type {go_name(t)}")

    def value(self, t: str, v: Any, struct: str, names: list[str], path: str) -> Any:
        """`v` read as type `t`; `struct`, `names`: encoding/json's error context (the innermost
        struct and the JSON names from the root), `path`: the strict decoder's path, with indices."""
        if v is None:
            return None
        if t in _EITHER:
            one, other = _EITHER[t]
            return self.value(one if isinstance(v, dict) or other == "bool" and not isinstance(v, bool) else other,
                              v, struct, names, path)
        if t in ("JSON",):
            return v
        if t == "Object":
            if not isinstance(v, dict):
                self.fail(v, struct, names, "map[string]interface {}")
            return v
        if t == "string" or t == "Time":
            if not isinstance(v, str):
                self.fail(v, struct, names, "string")
            return v
        if t == "bool":
            if not isinstance(v, bool):
                self.fail(v, struct, names, t)
            return v
        if t in _INT_RANGE:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(v, struct, names, t)
            elif isinstance(v, float) and not v.is_integer() or not (_INT_RANGE[t][0] <= v <= _INT_RANGE[t][1]):
                self.fail(v, struct, names, t, number=_number_text(v))
            elif isinstance(v, float):
                return int(v)
            return v
        if t == "float64":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(v, struct, names, t)
            return v
        if t == "IntOrString":
            if isinstance(v, str):
                return v
            return self.value("int32", v, struct, names, path)
        if t == "[]byte":
            if not isinstance(v, str):
                self.fail(v, struct, names, t)
                return v
            why = base64_error(v)
            if why is not None and self.error is None:
                self.error = why
            return v
        if t.startswith("[]"):
            if not isinstance(v, list):
                self.fail(v, struct, names, t)
                return v
            return [x for x in (self.value(t[2:], item, struct, names, f"{path}[{i}]") for i, item in enumerate(v))
                    if x is not None]
        if t.startswith("map[string]"):
            if not isinstance(v, dict):
                self.fail(v, struct, names, t)
                return v
            elem = t[len("map[string]"):]
            return {k: self.value(elem, x, struct, names, f"{path}[{k}]") for k, x in v.items() if x is not None}
        if t in STRUCTS:
            if not isinstance(v, dict):
                self.fail(v, struct, names, t)
                return v
            fields = STRUCTS.get(t, {})
            out = {}
            for k, x in v.items():
                sub = fields.get(k)
                child = f"{path}.{k}" if path else k
                if sub is None:
                    if not (t in _TOP and k in ("apiVersion", "kind")):
                        self.unknown.append(child)
                        continue
                    out[k] = x
                    continue
                if x is None:
                    continue
                out[k] = self.value(sub, x, t, names + [k], child)
            return out
        raise KeyError(f"no Go type {t!r} declared")


def _number_text(v: float | int) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v)) if abs(v) < 1e21 else repr(v)
    return repr(v) if isinstance(v, float) else str(v)


_TOP = {kind for kind, fields in STRUCTS.items() if "metadata" in fields and fields["metadata"] == "ObjectMeta"}


def decode(kind: str, obj: dict[str, Any]) -> Decoded:
    """`obj` read into the Go type of `kind` (a top-level kind of STRUCTS)."""
    d = _Decoder()
    out = d.value(kind, obj, kind, [], "")
    return Decoded(out, d.error, d.unknown)


def has_type(kind: str) -> bool:
    return kind in _TOP

