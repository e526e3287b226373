"""Cancelling an execution from the console: a confirmation page that names the execution and asks
why, then the cancel itself, recorded with who and why (docs/console.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.console.web import ConsoleRoute, form, kernel_of, page, redirect, require, viewer
from kernel.core import executions
from kernel.core.lifecycle import Canceller, cancel_scope, check_rationale
from kernel.errors import ValidationError, invalid
from kernel.ids import parse_uuid
from kernel.lane import call

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API


def _uuid(value: str) -> str:
    try:
        return parse_uuid(value)
    except ValidationError:
        raise invalid(f"execution id {value!r} is not a UUID") from None


async def _confirm_page(request: Request, eid: str, status: int = 200, rationale: str = "",
                        error: str = "") -> Response:
    v = await viewer(request)
    require(v, "executions:write")
    # The page names what a cancel ends: the execution, its pending approvals and executing steps.
    scope = await call(cancel_scope, kernel_of(request), eid)
    return page(request, v, "cancel.html", status=status, section="executions", e=scope.execution,
                pending=scope.pending_approvals, executing=scope.executing_steps, rationale=rationale, error=error)


@router.get("/console/executions/{execution_id}/cancel")
async def confirm(execution_id: str, request: Request) -> Response:
    """The confirmation step: a cancel is never one click (and works without JavaScript)."""
    return await _confirm_page(request, _uuid(execution_id))


@router.post("/console/executions/{execution_id}/cancel")
async def cancel(execution_id: str, request: Request) -> Response:
    v = await viewer(request)
    fields = await form(request, v)
    require(v, "executions:write")
    eid = _uuid(execution_id)
    rationale = str(fields.get("rationale") or "")
    if fields.get("confirm") != "yes":  # a form posted without the confirmation page's own button
        return await _confirm_page(request, eid, status=400, rationale=rationale,
                                   error="Nothing was cancelled: confirm on this page to cancel the execution.")
    try:
        who = Canceller(v.principal.actor, v.principal.credential.value, check_rationale(rationale))
    except ValidationError as exc:
        return await _confirm_page(request, eid, status=400, rationale=rationale, error=exc.message)
    await call(executions.cancel_execution, kernel_of(request), eid, who=who)
    return redirect(request, f"/console/executions/{eid}")
