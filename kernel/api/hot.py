"""The agent's hot routes served ahead of the middleware stack: same endpoints, same handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette._exception_handler import _lookup_exception_handler
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from kernel.api.deps import LeanRoute

Endpoint = Callable[..., Awaitable[Response]]


class _Path:
    """A route path as segments: a literal must be equal, a `{name}` takes one non-empty segment
    (Starlette's default `str` convertor, `[^/]+`)."""

    __slots__ = ("endpoint", "literals", "names")

    def __init__(self, path: str, endpoint: Endpoint):
        parts = path.split("/")
        self.endpoint = endpoint
        self.literals = [(i, p) for i, p in enumerate(parts) if not p.startswith("{")]
        self.names = [(i, p[1:-1]) for i, p in enumerate(parts) if p.startswith("{")]
        if any(":" in name for _, name in self.names):
            raise ValueError(f"a hot route's parameters take no convertor: {path}")

    def match(self, parts: list[str]) -> dict[str, str] | None:
        for i, literal in self.literals:
            if parts[i] != literal:
                return None
        params = {}
        for i, name in self.names:
            if not parts[i]:
                return None
            params[name] = parts[i]
        return params


class HotRoutes:
    """The app's outermost ASGI layer: a POST to one of the lean routes (kernel/api/deps.py
    `LeanRoute`: submit, complete, fail, heartbeat) goes straight to its endpoint; every other
    request goes to the middleware stack as before.

    On a step round trip, Starlette's and FastAPI's layers (six middlewares, each wrapping `send`;
    the router's match against the routes; a second exception wrapper per route) were about a
    third of the event loop's instructions, doing nothing for these routes. What they do that
    matters is done here the same way:

    - an exception from the endpoint is answered by the app's handler for its class (looked up
      by MRO, as Starlette's ExceptionMiddleware does), anything else by the catch-all
      (kernel/api/errors.py `CatchAll`): the same envelope, metrics and logging, the connection
      kept;
    - an exception once the response has started propagates to the server, as through
      ServerErrorMiddleware;
    - FastAPI's telemetry, body-limit and exit-stack layers have nothing to do here: the
      catch-all answers every exception before telemetry would see it, the app sets no
      `max_body_size`, and these routes take no files.

    Apps mounted ahead (`KernelApp.mount_ahead`: the MCP gateway in the kernel's process) get
    their requests here too, past the middleware stack, as a separate process of theirs would.

    A path with a root path (a server run under a prefix) goes the long way round.
    """

    def __init__(self, app: ASGIApp, fastapi: FastAPI):
        self.app = app
        self._ahead: list[Mount] = getattr(fastapi, "ahead", [])
        self._routes: dict[int, list[_Path]] = {}  # by the number of segments
        for route in fastapi.router.routes:
            if isinstance(route, LeanRoute) and route.methods == {"POST"}:
                p = _Path(route.path, route.endpoint)
                self._routes.setdefault(len(route.path.split("/")), []).append(p)
        handlers = fastapi.exception_handlers
        # Every handler the app registers is a coroutine function (kernel/api/errors.py, FastAPI's own).
        self._handlers: dict[Any, Any] = {k: v for k, v in handlers.items() if k not in (500, Exception)}
        self._catch_all: Any = handlers[Exception]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            if scope["method"] == "POST":
                parts = scope["path"].split("/")
                for route in self._routes.get(len(parts), ()):
                    params = route.match(parts)
                    if params is not None:
                        await self._serve(route.endpoint, params, scope, receive, send)
                        return
            for mount in self._ahead:
                if scope["path"].startswith(mount.path + "/"):
                    match, child = mount.matches(scope)
                    if match is Match.FULL:
                        scope.update(child)
                        await mount.handle(scope, receive, send)
                        return
        await self.app(scope, receive, send)

    async def _serve(self, endpoint: Endpoint, params: dict[str, str], scope: Scope, receive: Receive,
                     send: Send) -> None:
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request=request, **params)
        except Exception as exc:
            handler: Any = _lookup_exception_handler(self._handlers, exc)
            if handler is None:
                response = await self._catch_all(request, exc)
            else:
                response = await handler(request, exc)
                exc.__traceback__ = None  # as Starlette: a reused exception would pile up tracebacks
        await response(scope, receive, send)


class KernelApp(FastAPI):
    """FastAPI with the hot routes ahead of its middleware stack (`HotRoutes`)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.ahead: list[Mount] = []

    def mount_ahead(self, path: str, app: ASGIApp) -> None:
        """Serve `app` under `path` ahead of the middleware stack: an app that answers its own
        errors (the MCP gateway in the kernel's process, kernel/mcp/inkernel.py). Through the
        stack, its requests paid for the kernel's six middlewares and a match against every route
        before the mount: 0.65 of the kernel's 14.7 s of CPU under yappi for 1,010 tools/calls and
        plain round trips (bench/journal/2026-12-05-mcp-gateway.md)."""
        self.ahead.append(Mount(path, app=app))

    def build_middleware_stack(self) -> ASGIApp:
        return HotRoutes(super().build_middleware_stack(), self)
