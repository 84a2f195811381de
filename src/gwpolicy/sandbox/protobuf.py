"""Kubernetes protobuf request bodies, decoded to JSON objects, for the few built-in kinds kubectl's
generators send that way (`kubectl create namespace|configmap|secret|serviceaccount|service`).

client-go sends typed objects as `application/vnd.kubernetes.protobuf` and does not fall back to
JSON, so without this those commands fail against the sandbox. The envelope is the magic `k8s\\0`
and a runtime.Unknown {typeMeta{apiVersion, kind}, raw}; `raw` is the typed message. The schemas
below hold field numbers from k8s.io/api and k8s.io/apimachinery `generated.proto`; a field they do
not know is an error naming it, never silently dropped. Responses stay JSON (clients accept it).
"""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from typing import Any

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


# message -> field number -> (JSON name, type); a type is a scalar name, "map:<value type>",
# "list:<type>" or another message's name.
SCHEMAS: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta"), 2: ("raw", "raw"), 3: ("contentEncoding", "string"),
                4: ("contentType", "string")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "ObjectMeta": {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
                   4: ("selfLink", "string"), 5: ("uid", "string"), 6: ("resourceVersion", "string"),
                   7: ("generation", "int"), 8: ("creationTimestamp", "time"), 9: ("deletionTimestamp", "time"),
                   10: ("deletionGracePeriodSeconds", "int"), 11: ("labels", "map:string"),
                   12: ("annotations", "map:string"), 14: ("finalizers", "list:string")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec"), 3: ("status", "NamespaceStatus")},
    "NamespaceStatus": {1: ("phase", "string")},
    "NamespaceSpec": {1: ("finalizers", "list:string")},
    "ConfigMap": {1: ("metadata", "ObjectMeta"), 2: ("data", "map:string"), 3: ("binaryData", "map:bytes"),
                  4: ("immutable", "bool")},
    "Secret": {1: ("metadata", "ObjectMeta"), 2: ("data", "map:bytes"), 3: ("type", "string"),
               4: ("stringData", "map:string"), 5: ("immutable", "bool")},
    "ServiceAccount": {1: ("metadata", "ObjectMeta"), 4: ("automountServiceAccountToken", "bool")},
    "Service": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ServiceSpec"), 3: ("status", "ServiceStatus")},
    "ServiceStatus": {},
    "ServiceSpec": {1: ("ports", "list:ServicePort"), 2: ("selector", "map:string"), 3: ("clusterIP", "string"),
                    4: ("type", "string"), 5: ("externalIPs", "list:string"), 7: ("sessionAffinity", "string"),
                    10: ("externalName", "string"), 11: ("externalTrafficPolicy", "string"),
                    18: ("clusterIPs", "list:string"), 19: ("ipFamilies", "list:string"),
                    17: ("ipFamilyPolicy", "string"), 22: ("internalTrafficPolicy", "string")},
    "ServicePort": {1: ("name", "string"), 2: ("protocol", "string"), 3: ("port", "int"),
                    4: ("targetPort", "intstr"), 5: ("nodePort", "int"), 6: ("appProtocol", "string")},
    "IntOrString": {1: ("type", "int"), 2: ("intVal", "int"), 3: ("strVal", "string")},
    "Time": {1: ("seconds", "int"), 2: ("nanos", "int")},
    "MapEntry": {1: ("key", "raw"), 2: ("value", "raw")},
}

_ZERO_TIME = -62135596800  # 0001-01-01T00:00:00Z, time.Time{}.Unix()

KINDS = {"Namespace", "ConfigMap", "Secret", "ServiceAccount", "Service"}


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """The wire format: (field number, varint value or length-delimited bytes), in order."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((num, value))
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ProtobufError("truncated field")
            out.append((num, buf[i:i + n]))
            i += n
        elif wire in (1, 5):  # fixed 64/32 bits: no field of the kinds above uses them
            size = 8 if wire == 1 else 4
            out.append((num, int.from_bytes(buf[i:i + size], "little")))
            i += size
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _message(name: str, buf: bytes) -> dict[str, Any]:
    schema = SCHEMAS[name]
    out: dict[str, Any] = {}
    for num, value in _fields(buf):
        if value in (b"", 0) and not (num in schema and schema[num][1] == "bool"):
            continue  # Go writes zero values; JSON (omitempty) leaves them out
        if num not in schema:
            raise ProtobufError(f"field {num} of {name} is not known to the sandbox's protobuf decoder")
        key, typ = schema[num]
        if typ.startswith("list:"):
            out.setdefault(key, []).append(_value(typ[5:], value, f"{name}.{key}"))
        elif typ.startswith("map:"):
            entry = _message("MapEntry", _bytes(value, f"{name}.{key}"))
            k = entry.get("key", b"").decode()
            out.setdefault(key, {})[k] = _value(typ[4:], entry.get("value", b""), f"{name}.{key}")
        else:
            out[key] = _value(typ, value, f"{name}.{key}")
    return out


def _bytes(value: int | bytes, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError(f"{where}: expected a length-delimited field")
    return value


def _value(typ: str, value: int | bytes, where: str) -> Any:
    if typ == "int":
        if not isinstance(value, int):
            raise ProtobufError(f"{where}: expected a number")
        return _signed(value)
    if typ == "bool":
        return bool(value)
    raw = _bytes(value, where)
    if typ == "raw":
        return raw
    if typ == "string":
        return raw.decode()
    if typ == "bytes":
        return base64.b64encode(raw).decode()
    if typ == "time":
        seconds = _message("Time", raw).get("seconds", 0)
        if seconds <= _ZERO_TIME:
            return None  # Go's zero time: JSON says null
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if typ == "intstr":
        v = _message("IntOrString", raw)
        return v.get("strVal", "") if v.get("type") == 1 else v.get("intVal", 0)
    return _message(typ, raw)


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded built-in object as the JSON object a client would have sent."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    unknown = _message("Unknown", body[len(MAGIC):])
    tm = unknown.get("typeMeta") or {}
    kind, api_version = tm.get("kind", ""), tm.get("apiVersion", "")
    if unknown.get("contentEncoding"):
        raise ProtobufError(f"content encoding {unknown['contentEncoding']!r} is not supported")
    if kind not in KINDS or api_version != "v1":
        raise ProtobufError(f"{api_version}/{kind} in protobuf is not supported by the sandbox "
                            f"(it decodes {', '.join(sorted(KINDS))}); send it as JSON or YAML, e.g. kubectl apply -f")
    obj = {"apiVersion": api_version, "kind": kind}
    obj.update(_message(kind, unknown.get("raw", b"")))
    return obj


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (lengths here stay far below the 2^28 a 4-byte varint holds)."""
    n, size = len(payload), b""
    while True:
        byte = n & 0x7F
        n >>= 7
        size += bytes([byte | (0x80 if n else 0)])
        if not n:
            break
    return bytes([(number << 3) | 2]) + size + payload


def openapi_v2_document(title: str, version: str) -> bytes:
    """An OpenAPI v2 document (gnostic's openapi_v2.Document) with no definitions: what kubectl's
    client-side validation fetches when a group is not in /openapi/v3 (as for kinds whose CRDs the
    same `kubectl apply` creates). No definition: kubectl validates nothing client-side and leaves it
    to the server, which validates everything."""
    info = _field(1, title.encode()) + _field(2, version.encode())
    return _field(1, b"2.0") + _field(2, info) + _field(8, b"")
