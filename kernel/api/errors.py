"""The one error table: code → HTTP status, and the `{code, message, details}` envelope."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from kernel.api.render import JSONResponse
from kernel.errors import RegentError

log = logging.getLogger("kernel.api")

CODE_TO_STATUS: dict[str, int] = {
    "validation_error": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "execution_terminal": 409,
    "lease_superseded": 409,
    "payload_too_large": 413,
    "internal_error": 500,
    "unavailable": 503,
}


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return body


def error_response(code: str, message: str, details: dict[str, Any] | None = None) -> Response:
    return JSONResponse(envelope(code, message, details), status_code=CODE_TO_STATUS.get(code, 500))


def install(app: FastAPI) -> None:
    metrics = app.state.metrics

    @app.exception_handler(RegentError)
    async def _regent(_: Request, exc: RegentError) -> Response:
        metrics.error(exc.code)
        response = error_response(exc.code, exc.message, exc.details)
        if exc.code == "unavailable":
            response.headers["Retry-After"] = "1"  # the store is down or full: worth retrying soon
        return response

    @app.exception_handler(StarletteHTTPException)
    async def _router(request: Request, exc: StarletteHTTPException) -> Response:
        # The router's own 404 (no route matches, e.g. an id holding an encoded "/") answers in the
        # envelope like every other error; other router answers keep Starlette's handling.
        if exc.status_code == 404:
            metrics.error("not_found")
            return error_response("not_found", f"not found: no route {request.method} {request.url.path[:200]}")
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body"))
        msg = f"validation error: {where}: {first.get('msg', 'invalid request')}" if where else "validation error"
        metrics.error("validation_error")
        return error_response("validation_error", msg)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        metrics.error("internal_error")
        return error_response("internal_error", "internal error")
