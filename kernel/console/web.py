"""What every console page shares: the templates (autoescaped), who is looking (the session
cookie → a principal), scope and CSRF checks, and errors rendered as pages instead of JSON."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
import markupsafe
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from kernel.clock import parse_time
from kernel.console.session import ANONYMOUS, BOOTSTRAP, COOKIE, Session, Sessions, Viewer
from kernel.core.api_keys import key_principal
from kernel.core.approvals import Principal
from kernel.core.kernel import Kernel
from kernel.errors import CODE_TO_STATUS, Forbidden, RegentError, invalid
from kernel.ids import whole_number
from kernel.lane import call

HERE = Path(__file__).parent
FORM_LIMIT = 2 * 1024 * 1024  # bytes of a console form (a bundle upload is the largest)
SECURITY_HEADERS = {
    # No inline script or style anywhere, so the policy can forbid both: an injected <script>
    # would not run even if escaping failed somewhere.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _iso(value: datetime | None) -> str:
    """A time for a `datetime` attribute (the page's script shows it in the browser's zone on hover)."""
    return "" if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# Stored JSON values keep lone surrogates (docs/api.md, "Text"), which UTF-8 cannot carry: a page
# that printed one raw failed to encode, and one such execution on the first page made
# /console/executions a 500 for every user. Every value a template prints passes here.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _visible(text: str) -> str:
    """`text` with each lone surrogate as its `\\uXXXX` escape (as JSON writes it), so the page encodes."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


def _json(value: Any, indent: int | None = None) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=True,
                          separators=(",", ": ") if indent else (",", ":"))
    except RecursionError:
        # The indenting encoder recurses in Python, a frame a level; the C one (no indent) goes
        # deeper. A value nested past both is shown by its size rather than failing the page.
        if indent is None:
            return f"(a JSON value nested too deeply to show, {type(value).__name__})"
        return _json(value)
    except ValueError:  # an integer past Python's digit bound cannot be written as text
        return f"(a JSON value too large to show, {type(value).__name__})"
    return _visible(text)


def _pretty(value: Any) -> str:
    return _json(value, indent=2)


def _compact(value: Any, limit: int = 120) -> str:
    text = _json(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _preview(value: Any, limit: int = 120) -> tuple[str, str | None]:
    """(one-line text, the indented whole when the line had to be cut): a short value is shown
    as it is, a long one collapsed behind its first `limit` characters."""
    text = _json(value)
    if len(text) <= limit:
        return text, None
    return text[: limit - 1] + "…", _pretty(value)


def _finalize(value: Any) -> Any:
    """Every `{{ … }}` a template prints: text with a lone surrogate (an execution's stored
    string, a decision's reason quoting one) shown escaped instead of failing the page."""
    if isinstance(value, markupsafe.Markup):  # already escaped: the escapes add no markup
        return markupsafe.Markup(_visible(str(value)))
    return _visible(value) if isinstance(value, str) else value


def _duration(seconds: float) -> str:
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every value is escaped; args and results are attacker-controlled
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=_finalize,
)
templates.filters.update(when=_when, iso=_iso, pretty=_pretty, compact=_compact, preview=_preview, duration=_duration, urlquote=quote)


class SignInRequired(Exception):
    pass


def console_of(request: Request) -> Any:
    return request.app.state.console


def kernel_of(request: Request) -> Kernel:
    return request.app.state.kernel  # type: ignore[no-any-return]


def _principal(request: Request, s: Session) -> tuple[Principal, str] | None:
    c = console_of(request)
    if s.who == ANONYMOUS:
        return (Principal(admin=True, dev=True), "dev (anonymous admin)") if c.dev else None
    if s.who == BOOTSTRAP:
        token = c.bearer_token
        if token is None or not s.fingerprint or s.fingerprint != c.sessions.fingerprint(token):
            return None
        return Principal(admin=True), "bootstrap token"
    p = key_principal(kernel_of(request), s.who)
    return (p, p.name or "api key") if p is not None else None


async def viewer(request: Request) -> Viewer:
    """The signed-in visitor; under regent dev an anonymous admin session is made on first visit."""
    sessions: Sessions = console_of(request).sessions
    s = sessions.verify(request.cookies.get(COOKIE))
    found = await call(_principal, request, s) if s is not None else None
    if found is None or s is None:
        if not console_of(request).dev:
            raise SignInRequired()
        s = sessions.issue(ANONYMOUS)
        request.state.new_session = s
        found = (Principal(admin=True, dev=True), "dev (anonymous admin)")
    principal, label = found
    return Viewer(principal, label, sessions.csrf(s), signed_in=s.who != ANONYMOUS)


def require(v: Viewer, *scopes: str, any_of: tuple[str, ...] = ()) -> None:
    if scopes and not v.can(*scopes):
        raise Forbidden(f"forbidden: this page needs the scope {' '.join(scopes)}")
    if any_of and not any(v.can(s) for s in any_of):
        raise Forbidden(f"forbidden: this page needs one of the scopes {', '.join(any_of)}")


def same_origin(request: Request) -> None:
    """A POST whose Origin names another site is refused before its body is read (a second
    line behind the CSRF token and SameSite=Strict; browsers send Origin on every POST)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        host = request.headers.get("host", "")
        if origin.split("://", 1)[-1].rstrip("/") != host:
            raise Forbidden("forbidden: this form was posted from another site")


def time_field(value: str | None, name: str) -> datetime | None:
    """A search form's date-time field (`datetime-local`, no zone: UTC) or an RFC 3339 time."""
    return parse_time(value, name, naive_is_utc=True) if value else None


async def form(request: Request, v: Viewer) -> dict[str, Any]:
    """A state-changing form's fields, after its CSRF token is checked (403 without it)."""
    same_origin(request)
    length = whole_number(request.headers.get("content-length"))
    if length is not None and length > FORM_LIMIT:
        raise invalid("the form is over the size limit")
    data = await request.form(max_part_size=FORM_LIMIT)
    fields: dict[str, Any] = {}
    for key, value in data.multi_items():
        fields.setdefault(key, value)
    if not console_of(request).sessions.csrf_ok(_session_of(request), fields.get("csrf")):
        raise Forbidden("forbidden: the form's CSRF token is missing or wrong; reload the page and try again")
    return fields


def _session_of(request: Request) -> Session:
    s = getattr(request.state, "new_session", None) or console_of(request).sessions.verify(request.cookies.get(COOKIE))
    assert s is not None  # viewer() ran first
    return s  # type: ignore[no-any-return]


def nav(v: Viewer) -> list[tuple[str, str, str]]:
    """(path, label, id) of the pages this visitor may open."""
    items = [
        ("/console/executions", "Executions", "executions", ("executions:read",)),
        ("/console/approvals", "Approvals", "approvals", ("approvals:read",)),
        ("/console/audit", "Decisions", "audit", ("decisions:read",)),
        ("/console/policies", "Policies", "policies", ("policies:write",)),
        ("/console/mcp", "MCP tools", "mcp", ("policies:write",)),
        ("/console/playground", "Playground", "playground", ("policies:write",)),
    ]
    return [(path, label, ident) for path, label, ident, scopes in items if v.can(*scopes)]


def page(request: Request, v: Viewer | None, name: str, status: int = 200, **context: Any) -> Response:
    html = templates.get_template(name).render(viewer=v, nav=nav(v) if v else [], request_path=request.url.path,
                                               **context)
    return finish(request, HTMLResponse(html, status_code=status))


def fragment(request: Request, name: str, headers: dict[str, str] | None = None, **context: Any) -> Response:
    html = templates.get_template(name).render(**context)
    return finish(request, HTMLResponse(html, headers=headers))


def finish(request: Request, response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    s = getattr(request.state, "new_session", None)
    if s is not None:
        set_cookie(request, response, console_of(request).sessions, s)
    return response


def set_cookie(request: Request, response: Response, sessions: Sessions, s: Session) -> None:
    response.set_cookie(COOKIE, sessions.encode(s), max_age=max(int(s.expires - datetime.now(UTC).timestamp()), 0),
                        path="/console", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def redirect(request: Request, url: str) -> Response:
    return finish(request, RedirectResponse(url, status_code=303))


class ConsoleRoute(APIRoute):
    """Console routes render errors as pages and send visitors without a session to sign in."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            started = time.perf_counter()
            response = await handle(request)
            # The page's own time, so `regent bench` (and a browser's devtools) can tell the
            # server's share of a page load from the network's.
            response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.2f}"
            return response

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                if request.method != "GET":
                    target = "/console"
                return RedirectResponse(f"/console/sign-in?next={quote(target, safe='')}", status_code=303)
            except RegentError as exc:
                status = CODE_TO_STATUS.get(exc.code, 500)
                try:
                    v = await viewer(request)
                except SignInRequired:
                    v = None
                return page(request, v, "error.html", status=status, code=exc.code, message=exc.message)

        return run
