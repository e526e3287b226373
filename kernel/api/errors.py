"""Errors as the API answers them: the `{code, message, details}` envelope, at the status
`kernel.errors.CODE_TO_STATUS` gives its code."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel.api.render import JSONResponse
from kernel.errors import CODE_TO_STATUS, RegentError

log = logging.getLogger("kernel.api")

def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return body


def error_response(code: str, message: str, details: dict[str, Any] | None = None) -> Response:
    return JSONResponse(envelope(code, message, details), status_code=CODE_TO_STATUS.get(code, 500))


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves on this path (several routes share a path, one per method)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**request.scope, "method": "\x00"})  # a method no route has
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def install(app: FastAPI) -> None:
    """One handler for every error a request can meet, each answered with the envelope and the
    connection kept (see `CatchAll` for the catch-all)."""
    metrics = app.state.metrics

    @app.exception_handler(RegentError)
    async def _regent(_: Request, exc: RegentError) -> Response:
        metrics.error(exc.code)
        response = error_response(exc.code, exc.message, exc.details)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
        elif exc.code == "unavailable":
            response.headers["Retry-After"] = "1"  # the store is down or full: worth retrying soon
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body"))
        msg = f"validation error: {where}: {first.get('msg', 'invalid request')}" if where else "validation error"
        metrics.error("validation_error")
        return error_response("validation_error", msg)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        # The router's own answers: an unknown route (404) and a method the path lacks (405).
        if exc.status_code == 405:
            allow = allowed_methods(app, request)
            metrics.error("method_not_allowed")
            resp = error_response("method_not_allowed",
                                  f"method {request.method} not allowed; allowed: {', '.join(allow)}")
            resp.headers["Allow"] = ", ".join(allow)
            return resp
        if exc.status_code == 404:
            metrics.error("not_found")
            return error_response("not_found", f"not found: no route {request.method} {request.url.path[:200]}")
        code = next((c for c, st in CODE_TO_STATUS.items() if st == exc.status_code), "internal_error")
        metrics.error(code)
        resp = JSONResponse(envelope(code, str(exc.detail)), status_code=exc.status_code)
        for k, v in (exc.headers or {}).items():
            resp.headers[k] = v
        return resp

    async def _internal(request: Request, exc: Exception) -> Response:
        if isinstance(exc, ClientDisconnect):
            # The client went away before its body arrived whole: nothing failed here, and no
            # one reads the answer. One line, no traceback (it was an ERROR with one, per hang-up).
            log.info("client disconnected during %s %s", request.method, request.url.path)
            return Response(status_code=400)
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        metrics.error("internal_error")
        return error_response("internal_error", "internal error")

    app.add_middleware(CatchAll, handler=_internal)
    # Starlette's outermost ServerErrorMiddleware keeps this for what escapes even CatchAll.
    app.add_exception_handler(Exception, _internal)


class CatchAll:
    """Answers any exception a request's handling raises with the envelope, and keeps the
    connection.

    Starlette hands a handler registered for `Exception` to its outermost ServerErrorMiddleware,
    which answers and then re-raises, so uvicorn drops the keep-alive connection after every 500
    and a pooled client's next request fails. This layer sits inside that one (a user middleware)
    and does not re-raise. An exception after the response has started can only end the
    connection, so it propagates.
    """

    def __init__(self, app: ASGIApp, handler: Callable[[Request, Exception], Awaitable[Response]]):
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sender(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sender)
        except Exception as exc:
            if started:
                raise
            response = await self.handler(Request(scope), exc)
            await response(scope, receive, send)
