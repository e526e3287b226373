"""Operational routes (no auth): health, readiness, Prometheus metrics."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from kernel.api import schema
from kernel.api.deps import call, kernel_of
from kernel.api.render import JSONResponse

router = APIRouter()


@router.get("/v0/health", openapi_extra=schema.operation(answer=schema.STATUS))
async def health() -> Response:
    return JSONResponse({"status": "ok"})


@router.get("/v0/ready", openapi_extra=schema.operation(answer=schema.STATUS))
async def ready(request: Request) -> Response:
    k = kernel_of(request)
    try:
        with anyio.fail_after(2):
            await call(k.store.ping)
    except Exception:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    puller = getattr(request.app.state, "bundle_puller", None)
    if puller is not None:  # bundles pulled from a bundle server (docs/policy-rollout.md)
        ok, bundles = puller.ready()
        body = {"status": "ready" if ok else "unavailable", "details": {"bundles": bundles}}
        return JSONResponse(body, status_code=200 if ok else 503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", openapi_extra=schema.operation())
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
