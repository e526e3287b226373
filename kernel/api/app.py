"""The FastAPI app factory: the one place that wires concrete parts together for HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.middleware.gzip import GZipMiddleware

from kernel.api import errors, schema
from kernel.api.auth import Authenticator
from kernel.api.hot import KernelApp
from kernel.api.metrics import ApiMetrics, ReplayCollector
from kernel.api.routes import admin, agent, audit, client, mcp, ops, policies, shadow, stream
from kernel.core.kernel import Kernel

# Below about a TCP segment compression saves no packet and costs a compressor per answer.
GZIP_MIN_BYTES = 1024
# zlib's default level: on an inbox-like page of 283 KB of HTML (250 approvals) level 6 took 2.5 ms
# and level 9 (Starlette's default) 3.6 ms, both to 37 KB; level 1 took 1.1 ms to 41 KB.
GZIP_LEVEL = 6


def create_app(
    kernel: Kernel,
    *,
    bearer_token: str | None = None,
    dev: bool = False,
    max_body_bytes: int = 10 * 1024 * 1024,
    signature_window_seconds: int = 300,
    require_request_nonce: bool = False,
    replay_cache_size: int = 200_000,
    replay_shared: bool = True,
    lifespan_hooks: list[Callable[[FastAPI], Any]] | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    hooks = lifespan_hooks or []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stops = []
        for hook in hooks:
            stop = await hook(app)
            if stop is not None:
                stops.append(stop)
        try:
            yield
        finally:
            for stop in reversed(stops):
                await stop()

    app = KernelApp(title="Regent", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.kernel = kernel
    app.state.auth = Authenticator(
        kernel, bearer_token=bearer_token, dev=dev, max_body_bytes=max_body_bytes,
        signature_window_seconds=signature_window_seconds, require_nonce=require_request_nonce,
        replay_cache_size=replay_cache_size, replay_shared=replay_shared,
    )
    app.state.metrics_registry = registry or CollectorRegistry()
    app.state.metrics = ApiMetrics(app.state.metrics_registry, kernel)
    app.state.metrics_registry.register(ReplayCollector(app.state.auth))
    errors.install(app)
    # Answers are gzip-compressed when the client asks (`Accept-Encoding: gzip`) and the body is at
    # least GZIP_MIN_BYTES: the console's pages and the API's lists, not a step's answer (the hot
    # routes are served ahead of the middleware stack, kernel/api/hot.py, and never reach this).
    # Event streams (text/event-stream) are never compressed or buffered: Starlette excludes them.
    # The layer costs about 6 us of CPU on an answer below the minimum and about 40 us to compress
    # 13 KB of JSON (a bare ASGI app, with and without it, side by side), against 1.7-2.1 ms for a
    # step round trip, whose routes skip it anyway.
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL)
    # The routes go straight onto the app's router, the agent's hot routes first: `include_router`
    # keeps each router nested and matches every request against it twice (measured: a third of
    # the framework's per-request cost on a step round trip). No two routes overlap, so the order
    # decides nothing but speed.
    for r in (agent.router, stream.router, client.router, admin.router, policies.router, audit.router,
              shadow.router, mcp.router, ops.router):
        app.router.routes.extend(r.routes)
    schema.install(app)
    return app
