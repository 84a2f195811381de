"""The controller's and the gateway's merge patches (kube.merge_patch) make the request lightkube's
client.patch makes, authenticated as it authenticates, and fail as it fails."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import yaml
from aiohttp import web
from lightkube import ApiError

from gwpolicy.controller import kube

SERVICES = kube.Kind("", "v1", "Service", "services", True)
ROUTES = kube.Kind("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes", True)


def _kubeconfig(path: Path, port: int, **user: Any) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "t", "user": user}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t", "namespace": "default"}}]}))
    return str(path)


async def _server(handler) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # noqa: SLF001


def test_the_request_is_lightkubes_merge_patch_with_its_token(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.path, "query": dict(request.query),
                     "type": request.headers.get("Content-Type"), "auth": request.headers.get("Authorization"),
                     "body": orjson.loads(await request.read())})
        return web.json_response({"kind": "HTTPRoute", "metadata": {"name": "r", "resourceVersion": "8"}})

    async def go() -> tuple[Any, Any]:
        runner, port = await _server(handler)
        client = kube.make_client(_kubeconfig(tmp_path / "kc", port, token="abc"), field_manager="gwpolicy")
        try:
            out = await kube.merge_patch(client, ROUTES, "r", "shop", {"status": {"x": 1}}, "gwpolicy", "status")
            assert kube._sender(client) is not None, "the write went through httpx, not the writes' own sender"  # noqa: SLF001
            res = kube.resource_class(ROUTES).Status  # what lightkube itself sends, for comparison
            theirs = kube.to_dict(await client.patch(res, "r", {"status": {"x": 1}}, namespace="shop",
                                                     patch_type=kube.PatchType.MERGE, field_manager="gwpolicy"))
            return out, theirs
        finally:
            await kube.close_client(client)
            await runner.cleanup()

    out, theirs = asyncio.run(go())
    assert out == {"kind": "HTTPRoute", "metadata": {"name": "r", "resourceVersion": "8"}} == theirs
    ours, lightkube = seen
    assert ours == lightkube
    assert ours == {"method": "PATCH", "path": "/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes/r/status",
                    "query": {"fieldManager": "gwpolicy"}, "type": "application/merge-patch+json",
                    "auth": "Bearer abc", "body": {"status": {"x": 1}}}


def test_a_rotated_token_file_is_read_again_on_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if seen[-1] != "Bearer new":
            token.write_text("new\n")  # the kubelet rotated it
            return web.json_response({"kind": "Status", "code": 401, "message": "Unauthorized"}, status=401)
        return web.json_response({"metadata": {"name": "cake"}})

    async def go() -> Any:
        runner, port = await _server(handler)
        client = kube.make_client(_kubeconfig(tmp_path / "kc", port, tokenFile=str(token)))
        try:
            return await kube.merge_patch(client, SERVICES, "cake", "baker", {"metadata": {}}, "gwpolicy")
        finally:
            await kube.close_client(client)
            await runner.cleanup()

    assert asyncio.run(go()) == {"metadata": {"name": "cake"}}
    assert seen == ["Bearer old", "Bearer new"]


def test_errors_are_lightkubes_and_httpxs(tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.match_info["tail"].endswith("/conflict"):
            # as kube-apiserver sends it: `application/json` exactly (lightkube's ApiError needs that)
            return web.Response(body=orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
                                                   "reason": "Conflict", "message": "the object has been modified"}),
                                status=409, headers={"Content-Type": "application/json"})
        return web.Response(text="upstream broke", status=502)

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]

    async def go() -> None:
        runner, port = await _server(handler)
        client = kube.make_client(_kubeconfig(tmp_path / "kc", port, token="t"))
        gone = kube.make_client(_kubeconfig(tmp_path / "kc2", closed, token="t"))
        try:
            with pytest.raises(ApiError) as conflict:
                await kube.merge_patch(client, SERVICES, "conflict", "baker", {}, "gwpolicy")
            assert conflict.value.status.code == 409
            with pytest.raises(httpx.HTTPStatusError) as broke:
                await kube.merge_patch(client, SERVICES, "other", "baker", {}, "gwpolicy")
            assert broke.value.response.status_code == 502 and not isinstance(broke.value, ApiError)
            with pytest.raises(httpx.TransportError):
                await kube.merge_patch(gone, SERVICES, "cake", "baker", {}, "gwpolicy")
        finally:
            await kube.close_client(client)
            await kube.close_client(gone)
            await runner.cleanup()

    asyncio.run(go())
