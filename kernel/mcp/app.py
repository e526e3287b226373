"""The gateway's HTTP face: MCP over streamable HTTP at /mcp/{agent}, the kernel's webhook at
/webhooks/{agent}, /metrics and /health; and the stdio runner for clients that launch
`regent mcp --stdio` themselves. Tool pins are the kernel's (/v0/mcp/{agent}/tools)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from kernel.ids import whole_number
from kernel.manifest import Manifest
from kernel.mcp.answers import JsonUnlessProgress, serving, wants_stream
from kernel.mcp.catalog import Metrics
from kernel.mcp.gateway import AgentGateway
from kernel.mcp.kernel_http import KernelHttp
from kernel.mcp.leases import AgentLink, LeaseBook
from kernel.mcp.pins import KernelPins
from kernel.signing import verify_webhook_signature

log = logging.getLogger("regent.mcp")

_WEBHOOK_MAX_BYTES = 64 * 1024
_MAX_MCP_BODY = 4 * 1024 * 1024  # one MCP request; arguments are bounded again per agent (max_args_bytes)


def _jsonrpc_error(status: int, code: int, message: str) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}},
                        status_code=status)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


class Gateways:
    """Every agent of the manifest that has an `mcp:` section, sharing one kernel client, one
    lease book, one view of the kernel's tool pins and one metrics registry."""

    def __init__(self, manifest: Manifest, kernel_url: str, *, kernel_token: str | None,
                 pins_path: Path | None, only: str | None = None, link: type[AgentLink] = AgentLink,
                 link_args: tuple[Any, ...] = ()):
        self.kernel_url, self.kernel_token = kernel_url, kernel_token
        agents = [a for a in manifest.agents if a.mcp is not None and (only is None or a.id == only)]
        self.pins = KernelPins(pins_path, {a.id: a.mcp.pins for a in agents if a.mcp is not None})
        self.metrics = Metrics()
        self.book = LeaseBook()
        self.http = httpx.AsyncClient(base_url=kernel_url, timeout=30.0,
                                      limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))
        self.lean = KernelHttp.of(kernel_url)
        self.agents: dict[str, AgentGateway] = {}
        self.links: dict[str, AgentLink] = {}
        for a in agents:
            assert a.mcp is not None
            link_ = link(self.http, a.id, a.secret, kernel_token, *link_args)
            link_.lean = self.lean
            self.links[a.id] = link_
            self.agents[a.id] = AgentGateway(a.id, a.mcp, link_, self.book, self.pins, self.metrics)
        self.managers: dict[str, StreamableHTTPSessionManager] = {}

    async def start(self) -> None:
        """Start the upstreams in the background: the webhook must answer the kernel's deliveries
        at once (a restarted gateway that is slow to listen costs delivery attempts)."""
        self._starting = [asyncio.create_task(g.refresh()) for g in self.agents.values()]
        self._pin_readers = [asyncio.create_task(g.keep_pins()) for g in self.agents.values()]

    async def close(self) -> None:
        for task in getattr(self, "_pin_readers", []):
            task.cancel()
        await self.book.close()
        for g in self.agents.values():
            await g.close()
        await self.http.aclose()
        if self.lean is not None:
            await self.lean.aclose()

    # -- routes -----------------------------------------------------------------------------------

    async def webhook(self, request: Request) -> Response:
        """The kernel's delivery (rebuno-v0 §6.3): note the lease, answer 200 at once."""
        agent_id = request.path_params["agent_id"]
        link = self.links.get(agent_id)
        if link is None:
            return _error(404, "not_found", "no such agent on this gateway")
        body = await _read_bounded(request, _WEBHOOK_MAX_BYTES)
        if body is None or not verify_webhook_signature(link.secret, request.headers.get("rebuno-signature", ""), body):
            return _error(401, "unauthorized", "bad webhook signature")
        try:
            d = json.loads(body)
            execution_id, dispatch_id = str(d["execution_id"]), str(d["dispatch_id"])
            attempt = int(d["dispatch_attempt"])
            lease_seconds = float(d.get("lease_timeout_seconds") or 120)
        except (ValueError, KeyError, TypeError):
            return _error(400, "validation_error", "not a dispatch")
        self.book.deliver(link, execution_id, dispatch_id, attempt, lease_seconds)
        return Response(status_code=200)

    async def metrics_route(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "agents": sorted(self.agents)})

    async def mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        agent_id = scope.get("path_params", {}).get("agent_id", "")
        gw = self.agents.get(agent_id)
        if gw is None:
            await _error(404, "not_found", "no such agent on this gateway")(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self._client_ok(gw, headers.get("authorization", "")):
            await _error(401, "unauthorized", "missing or invalid bearer token")(scope, receive, send)
            return
        if scope.get("method") == "POST":
            vetted = await self._vetted(scope, receive, send)
            if vetted is None:
                return
            receive, message = vetted
            serving(wants_stream(message, headers.get("accept", "")))
        await self.managers[agent_id].handle_request(scope, receive, send)

    async def _vetted(self, scope: Scope, receive: Receive, send: Send) -> tuple[Receive, Any] | None:
        """Read the body whole (bounded) and refuse JSON nested past the parser's recursion limit
        with a JSON-RPC parse error (the SDK answers it with a 500); the SDK then reads the same
        bytes. Returns that receive and the parsed message (None when it is not JSON)."""
        body = bytearray()
        more = True
        while more:
            chunk = await receive()
            if chunk["type"] != "http.request":
                return None
            body += chunk.get("body", b"")
            more = chunk.get("more_body", False)
            if len(body) > _MAX_MCP_BODY:
                await _jsonrpc_error(413, -32600, f"request body over {_MAX_MCP_BODY} bytes")(scope, receive, send)
                return None
        parsed: Any = None
        try:
            parsed = json.loads(body)
        except RecursionError:
            await _jsonrpc_error(400, -32700, "JSON nested too deeply")(scope, receive, send)
            return None
        except ValueError:
            pass  # the SDK answers its own parse error
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return replay, parsed

    def _client_ok(self, gw: AgentGateway, auth: str) -> bool:
        """A client presents the agent's `client_token`, or a kernel API key (checked by the kernel
        when it creates the session's execution: it needs `executions:write`). An agent with
        neither configured accepts any local client (`regent dev` style)."""
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if gw.cfg.client_token is not None and hmac.compare_digest(bearer.encode(), gw.cfg.client_token.encode()):
            return True
        if bearer.startswith("rbk_"):
            return True
        return gw.cfg.client_token is None and not bearer

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session managers and the upstreams, for as long as the app serves."""
        async with contextlib.AsyncExitStack() as stack:
            for m in self.managers.values():
                await stack.enter_async_context(m.run())
            await self.start()
            try:
                yield
            finally:
                await self.close()

    def app(self, *, lifespan: bool = True) -> Starlette:
        """The gateway's routes; with `lifespan=False` the caller runs `running()` itself (a
        mounted app's lifespan is not run: the kernel's own lifespan runs it, kernel/mcp/inkernel.py)."""
        for agent_id, gw in self.agents.items():
            self.managers[agent_id] = StreamableHTTPSessionManager(
                gw.server, json_response=cast(bool, JsonUnlessProgress()), max_request_body_size=_MAX_MCP_BODY)

        @contextlib.asynccontextmanager
        async def own_lifespan(app: Starlette) -> AsyncIterator[None]:
            async with self.running():
                yield

        return Starlette(lifespan=own_lifespan if lifespan else None, routes=[
            Route("/mcp/{agent_id}", endpoint=_Asgi(self.mcp), methods=["GET", "POST", "DELETE"]),
            Route("/webhooks/{agent_id}", self.webhook, methods=["POST"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ])


class _Asgi:
    """Starlette treats a class instance as a raw ASGI endpoint (a function it would wrap)."""

    def __init__(self, fn: Any):
        self.fn = fn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.fn(scope, receive, send)


async def _read_bounded(request: Request, limit: int) -> bytes | None:
    declared = whole_number(request.headers.get("content-length"))
    if declared is not None and declared > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)
