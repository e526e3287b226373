"""Sign in with an API key or the bootstrap token (regent serve), and sign out."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.console.session import BOOTSTRAP, COOKIE
from kernel.console.web import (
    ConsoleRoute,
    SignInRequired,
    console_of,
    finish,
    page,
    redirect,
    same_origin,
    set_cookie,
    viewer,
)
from kernel.errors import Unauthorized
from kernel.lane import call

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API


def _next(value: str | None) -> str:
    # Only a path inside the console: never an open redirect to another site.
    if value and value.startswith("/console") and not value.startswith("//") and "\\" not in value:
        return value
    return "/console"


@router.get("/console")
async def home(request: Request) -> Response:
    v = await viewer(request)
    from kernel.console.web import nav

    pages = nav(v)
    return redirect(request, pages[0][0] if pages else "/console/sign-in")


@router.get("/console/sign-in")
async def sign_in_form(request: Request) -> Response:
    try:
        v = await viewer(request)
    except SignInRequired:
        v = None
    return page(request, v, "sign_in.html", next=_next(request.query_params.get("next")), error=None)


@router.post("/console/sign-in")
async def sign_in(request: Request) -> Response:
    # No session yet, so no CSRF token to check: SameSite=Strict and the token itself (which a
    # forging site does not have) stand in for it. The response sets a fresh session.
    same_origin(request)
    data = await request.form(max_part_size=16 * 1024)
    token = str(data.get("token") or "").strip()
    nxt = _next(str(data.get("next") or ""))
    c = console_of(request)
    auth = request.app.state.auth
    try:
        await call(auth.token_principal, token)
    except Unauthorized:
        return page(request, None, "sign_in.html", status=401, next=nxt,
                    error="That key or token is not valid (unknown, revoked, expired or mistyped).")
    if auth.is_bootstrap(token):
        s = c.sessions.issue(BOOTSTRAP, c.sessions.fingerprint(token))
    else:
        s = c.sessions.issue(token[4:].partition(".")[0].lower())
    response = redirect(request, nxt)
    set_cookie(request, response, c.sessions, s)
    return response


@router.post("/console/sign-out")
async def sign_out(request: Request) -> Response:
    from kernel.console.web import form

    v = await viewer(request)
    await form(request, v)
    response = redirect(request, "/console/sign-in")
    response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
    return finish(request, response)
