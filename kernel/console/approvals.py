"""The approvals inbox: pending approvals across agents with what the approver decides on,
grant / deny with a comment, and the latest resolved ones with who and when."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api.threads import call
from kernel.console.web import ConsoleRoute, form, kernel_of, page, redirect, require, viewer
from kernel.core import approvals
from kernel.core.inbox import inbox
from kernel.errors import Conflict, Forbidden, NotFound, ValidationError
from kernel.identity import parse_uuid

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
MAX_COMMENT = 2000


async def _page(request: Request, v: Any, status: int = 200, error: str = "", notice: str = "") -> Response:
    require(v, "approvals:read")
    k = kernel_of(request)
    box = await call(inbox, k)
    # With REGENT_BOOTSTRAP_APPROVALS=false a visitor without a named key cannot decide: no form.
    may_decide = v.can("approvals:write") and (v.principal.name is not None or k.bootstrap_approvals)
    return page(request, v, "approvals.html", status=status, section="approvals", box=box, now=k.clock.now(),
                error=error, notice=notice, may_decide=may_decide)


@router.get("/console/approvals")
async def inbox_page(request: Request) -> Response:
    v = await viewer(request)
    q = request.query_params
    notice = {"granted": "Granted.", "denied": "Denied."}.get(q.get("done", ""), "")
    return await _page(request, v, notice=notice)


@router.post("/console/approvals/{approval_id}/{verb}")
async def decide(approval_id: str, verb: str, request: Request) -> Response:
    v = await viewer(request)
    fields = await form(request, v)
    require(v, "approvals:write")
    if verb not in ("grant", "deny"):
        raise NotFound("no such action")
    try:
        aid = parse_uuid(approval_id)
    except ValidationError:
        raise NotFound("approval not found") from None
    comment = str(fields.get("comment") or "").strip()
    if len(comment) > MAX_COMMENT:
        raise ValidationError(f"validation error: the comment is over {MAX_COMMENT} characters")
    # A named key decides as its name; the bootstrap token and dev access have no identity, so
    # the form asks who is deciding (recorded as given, as the API does).
    asserted = str(fields.get("decided_by") or "").strip()
    try:
        await call(approvals.decide_approval, kernel_of(request), aid, grant=verb == "grant", principal=v.principal,
                   decided_by=asserted, rationale=comment or None)
    except (Forbidden, Conflict) as exc:
        return await _page(request, v, status=403 if isinstance(exc, Forbidden) else 409, error=exc.message)
    return redirect(request, f"/console/approvals?done={'granted' if verb == 'grant' else 'denied'}")
