"""The Kubernetes API through lightkube (async): clients from kubeconfig or in-cluster config,
resource classes for any group/kind found at run time, and a watch that asks for bookmarks.

lightkube's own `watch` has no switch for `allowWatchBookmarks`, and on 410 Gone it silently
restarts from "now", which loses deletions; so the informer drives the watch itself and builds
the request through lightkube's generic client, adding the parameter.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any, AsyncGenerator
from urllib.parse import quote

import httpx2 as httpx  # the HTTP client lightkube is built on
import orjson
from lightkube import ApiError, AsyncClient
from lightkube.core.generic_client import transform_exception
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import OnErrorAction, OnErrorResult, PatchType

from gwpolicy.engine.kinds import ROUTE_KINDS


@dataclass(frozen=True)
class Kind:
    """A resource type as the controller watches it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    status_subresource: bool = True
    status_schema: bool = True  # the CRD's schema keeps `status` (else the API server prunes what we write)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


_CLASSES: dict[Kind, Any] = {}


def resource_class(k: Kind) -> Any:
    key = Kind(k.group, k.version, k.kind, k.plural, k.namespaced)
    cls = _CLASSES.get(key)
    if cls is None:
        make = create_namespaced_resource if k.namespaced else create_global_resource
        cls = _CLASSES[key] = make(k.group, k.version, k.kind, k.plural)
    return cls


def make_client(kubeconfig: str | None = None, context: str | None = None, field_manager: str = "gwpolicy") -> AsyncClient:
    """A client of the cluster `defaults.kube_config` finds (the long-running commands' one rule)."""
    from gwpolicy.kube.defaults import kube_config

    return AsyncClient(config=kube_config(kubeconfig, context), field_manager=field_manager,
                       timeout=httpx.Timeout(30.0))


def _raise(e: Exception, count: int) -> OnErrorResult:
    return OnErrorResult(OnErrorAction.RAISE)


def watch(client: AsyncClient, k: Kind, resource_version: str, namespace: str | None = None,
          timeout_seconds: int = 300) -> AsyncGenerator[tuple[str, Any], None]:
    """Events from `resource_version` on, BOOKMARKs included; every error is raised to the caller."""
    br = client._client.prepare_request(  # noqa: SLF001 - see the module docstring
        "list", res=resource_class(k), namespace=namespace, watch=True,
        params={"resourceVersion": resource_version, "allowWatchBookmarks": "true", "timeoutSeconds": timeout_seconds})
    return client._client.watch(br, on_error=_raise)  # noqa: SLF001


#: objects per list request, as client-go's reflector asks for them: a list of 50k routes is then
#: never held whole (its JSON and its decoded objects at once) next to what the model already keeps
LIST_CHUNK = 500


def list_chunked(client: AsyncClient, k: Kind, namespace: str | None = None) -> Any:
    """The objects of a list, fetched LIST_CHUNK at a time as they are iterated (`async for`); the
    iterable's `resourceVersion` is the list's once the first chunk has come."""
    return client.list(resource_class(k), namespace=namespace if k.namespaced else None, chunk_size=LIST_CHUNK)


def to_dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


async def get_object(client: AsyncClient, k: Kind, name: str, namespace: str | None) -> dict[str, Any]:
    return to_dict(await client.get(resource_class(k), name, namespace=namespace if k.namespaced else None))


async def apply_status(client: AsyncClient, k: Kind, obj: dict[str, Any], manager: str) -> dict[str, Any]:
    """Server-side apply to the status subresource; the body carries resourceVersion, so a stale read is a 409."""
    res = resource_class(k).Status
    meta = obj["metadata"]
    return to_dict(await client.patch(res, meta["name"], obj, namespace=meta.get("namespace") if k.namespaced else None,
                                      patch_type=PatchType.APPLY, field_manager=manager, force=True))


def merge_patch_of(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys, null for removed ones."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch_of(old[k], v) if isinstance(v, dict) and isinstance(old[k], dict) else v
    return patch


def object_path(k: Kind, name: str, namespace: str | None, subresource: str | None = None) -> str:
    """The URL path of one object (or of its subresource), as lightkube's `prepare_request` builds it."""
    parts = ["api", k.version] if not k.group else ["apis", k.group, k.version]
    if k.namespaced:
        parts += ["namespaces", namespace or "default"]
    parts += [k.plural, name]
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


_REQUEST_PARTS: "weakref.WeakKeyDictionary[httpx.AsyncClient, tuple[str, list[tuple[str, str]], dict[str, Any]]]" = \
    weakref.WeakKeyDictionary()


def _request_parts(http: httpx.AsyncClient) -> tuple[str, list[tuple[str, str]], dict[str, Any]]:
    """What `http.build_request` merges into every request of this client, merged once: its base URL,
    its default headers with a merge patch's content type, and its timeout."""
    parts = _REQUEST_PARTS.get(http)
    if parts is None:
        headers = [(k, v) for k, v in http.headers.multi_items() if k.lower() != "content-type"]
        headers.append(("Content-Type", PatchType.MERGE.value))
        parts = _REQUEST_PARTS[http] = (str(http.base_url).rstrip("/") + "/", headers,
                                            {"timeout": http.timeout.as_dict()})
    return parts


_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class _Sender:
    """The writes' HTTP connection: aiohttp's client (a quarter of httpx's CPU per request here: it
    parses HTTP in C) set up as lightkube's httpx client is: its base URL, default headers, timeout,
    TLS context (CA, client certificate) from the same kubeconfig, no redirects followed, and its
    authentication (`httpx.Auth`: a token, a token file re-read on 401, an exec plugin) driven as
    httpx drives it. Errors come out as httpx's (an error status as httpx.HTTPStatusError, a broken
    connection as httpx.TransportError), so callers handle them as before."""

    def __init__(self, http: httpx.AsyncClient, config: Any) -> None:
        import ssl

        import aiohttp
        from lightkube.config.client_adapter import verify_cluster

        self.http = http
        tls: ssl.SSLContext | bool = False
        if str(http.base_url).startswith("https"):
            tls = verify_cluster(config.cluster, config.user, config.abs_file, trust_env=True)
        t = http.timeout
        self.pool = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls), auto_decompress=True,
            timeout=aiohttp.ClientTimeout(sock_connect=t.connect, sock_read=t.read))

    async def send(self, request: httpx.Request) -> httpx.Response:
        import aiohttp

        auth = self.http.auth
        flow = auth.async_auth_flow(request) if auth is not None else None
        if flow is not None:
            request = await flow.__anext__()
        while True:
            try:
                async with self.pool.request(request.method, str(request.url), data=request.content,
                                                headers=request.headers.multi_items(), allow_redirects=False) as r:
                    response = httpx.Response(r.status, headers=list(r.raw_headers), content=await r.read(),
                                              request=request)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise httpx.TransportError(f"{request.method} {request.url}: {exc!r}", request=request) from exc
            if flow is None:
                return response
            try:
                request = await flow.asend(response)
            except StopAsyncIteration:
                return response

    async def close(self) -> None:
        await self.pool.close()


_SENDERS: "weakref.WeakKeyDictionary[AsyncClient, _Sender | None]" = weakref.WeakKeyDictionary()


def _sender(client: AsyncClient) -> _Sender | None:
    """The aiohttp sender of this client, made on first use; None where it could not connect as
    httpx does (a proxy from the environment, or a kubeconfig lightkube reads in a way not kept here):
    then writes go through httpx."""
    if client in _SENDERS:
        return _SENDERS[client]
    sender = None
    if not any(os.environ.get(v) for v in _PROXY_VARIABLES):
        try:
            sender = _Sender(client._client._client, client._client.config)  # noqa: SLF001
        except Exception:  # noqa: BLE001 - httpx, which lightkube set up, still works
            sender = None
    _SENDERS[client] = sender
    return sender


async def close_client(client: AsyncClient) -> None:
    """Close the client and the writes' connection made for it."""
    sender = _SENDERS.pop(client, None)
    if sender is not None:
        await sender.close()
    await client.close()


async def merge_patch(client: AsyncClient, k: Kind, name: str, namespace: str | None, body: dict[str, Any],
                      manager: str, subresource: str | None = None) -> dict[str, Any]:
    """A JSON merge patch of one object (or its `status` subresource), the object it returns as a dict.

    The same request as `client.patch(..., patch_type=PatchType.MERGE, field_manager=manager)`
    (path, `fieldManager`, content type, headers, and lightkube's ApiError for an error status), with
    the body encoded once by orjson and the answer decoded by orjson, sent by `_Sender` (or, where it
    cannot be, by the client's own httpx client). It skips lightkube's request building and resource
    model, and most of httpx's CPU: 60-70% of the controller's CPU per write was in that stack."""
    http = client._client._client  # noqa: SLF001 - lightkube's configured httpx.AsyncClient
    base, headers, extensions = _request_parts(http)
    url = f"{base}{object_path(k, name, namespace, subresource)}?fieldManager={quote(manager, safe='')}"
    req = httpx.Request("PATCH", url, headers=headers, content=orjson.dumps(body), extensions=extensions)
    sender = _sender(client)
    # the client's authentication and redirects, as client.patch has them
    resp = await (sender.send(req) if sender is not None else http.send(req))
    if resp.status_code >= 400:
        try:
            resp.raise_for_status()
        except httpx.HTTPStatusError as exc:
            err = transform_exception(exc)  # ApiError when the answer is a Status, as lightkube raises it
            if err is exc:
                raise
            raise err from exc
    return orjson.loads(resp.content)


async def patch_status(client: AsyncClient, k: Kind, name: str, namespace: str | None, resource_version: str,
                       old: dict[str, Any], new: dict[str, Any], manager: str) -> dict[str, Any]:
    """A JSON merge patch of the status subresource from `old` to `new`, with `resourceVersion` as a
    precondition (a stale read is a 409). Unlike a forced server-side apply, it does not take the
    ownership of fields it does not change, and never fails on another manager's apply ownership."""
    body = {"metadata": {"resourceVersion": resource_version}, "status": merge_patch_of(old, new)}
    return await merge_patch(client, k, name, namespace, body, manager, "status")


def too_large_resource_version(exc: ApiError) -> bool:
    """kube-apiserver's answer to a list or watch from a resourceVersion it has not reached (504 with
    the cause ResourceVersionTooLarge; older servers only say it in the message), as client-go tests it."""
    status = exc.status
    causes = (getattr(status, "details", None) and getattr(status.details, "causes", None)) or []
    if any(getattr(c, "reason", None) == "ResourceVersionTooLarge" for c in causes):
        return True
    return "too large resource version" in (status.message or "").lower()


GATEWAY_KINDS = {"GatewayClass", "Gateway", "ReferenceGrant", "BackendTLSPolicy", *ROUTE_KINDS}
CRD = Kind("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False)
BUILTIN = [Kind("", "v1", "Namespace", "namespaces", False), Kind("", "v1", "Service", "services", True)]


def kind_of_crd(crd: dict[str, Any], policykinds: set[tuple[str, str]]) -> Kind | None:
    """The kind a CRD serves, when gwpolicy must read it: Gateway API kinds, policy kinds (by label,
    by a PolicyKind naming it, or by a name ending in Policy), and PolicyKind itself."""
    from gwpolicy.engine.policies import POLICY_LABEL

    served = served_kind(crd)
    if served is None:
        return None
    group, kind = served.group, served.kind
    if (group, kind) == ("gwpolicy.io", "EffectivePolicy"):
        return None  # our output (controller/effectivepolicies.py watches it), never the analysis' input
    labels = (crd.get("metadata") or {}).get("labels") or {}
    wanted = ((group == "gateway.networking.k8s.io" and kind in GATEWAY_KINDS) or kind.endswith("Policy")
              or POLICY_LABEL in labels or (group, kind) == ("gwpolicy.io", "PolicyKind") or (group, kind) in policykinds)
    return served if wanted else None


def mesh_kind_of_crd(crd: dict[str, Any]) -> Kind | None:
    """The kind a CRD serves when it is the kind that turns the mesh on (the XMesh, engine/mesh.py's
    `MESH_KINDS`; docs/mesh.md), else None. The one test of it for every process that reads the mesh
    (the controller, the webhook, the mesh proxies: kube/process.py `reads_mesh`) and for the CLI."""
    from gwpolicy.engine.mesh import MESH_KINDS

    served = served_kind(crd)
    return served if served is not None and (served.group, served.kind) in MESH_KINDS else None


def served_kind(crd: dict[str, Any]) -> Kind | None:
    """The kind a CRD serves (its storage version, else its first served one); None when it serves none."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    if not versions or not names.get("kind") or not names.get("plural"):
        return None
    storage = next((v for v in versions if v.get("storage")), versions[0])
    return Kind(spec.get("group", ""), storage["name"], names["kind"], names["plural"],
                spec.get("scope", "Namespaced") == "Namespaced",
                (storage.get("subresources") or {}).get("status") is not None, keeps_status(storage))


def keeps_status(version: dict[str, Any]) -> bool:
    """Whether objects of this CRD version can hold a `status`: an API server prunes every field its
    structural schema does not declare, unless the schema preserves unknown fields."""
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return True
    props = schema.get("properties")
    return not isinstance(props, dict) or "status" in props
