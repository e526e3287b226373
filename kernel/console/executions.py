"""Executions: the list (filters, keyset paging, counts per status), one execution's timeline
(live while it runs); its cancel is `kernel.console.cancel`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api.threads import call
from kernel.console.web import (
    ConsoleRoute,
    fragment,
    kernel_of,
    page,
    require,
    time_field,
    viewer,
)
from kernel.core import agents, timeline
from kernel.domain import ExecutionStatus
from kernel.errors import ValidationError
from kernel.identity import parse_uuid, whole_number

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
PAGE_SIZE = 50
TIMELINE_SCOPES = ("executions:read", "approvals:read")  # an approver sees the timelines too


def _uuid(value: str, what: str) -> str:
    try:
        return parse_uuid(value)
    except ValidationError:
        raise ValidationError(f"validation error: {what} {value!r} is not a UUID") from None


@router.get("/console/executions")
async def list_page(request: Request) -> Response:
    v = await viewer(request)
    require(v, "executions:read")
    q = request.query_params
    status = q.get("status") or None
    if status is not None and status not in {s.value for s in ExecutionStatus}:
        raise ValidationError(f"validation error: unknown status {status!r}")
    cursor = _uuid(q["cursor"], "cursor") if q.get("cursor") else None
    agent_id = q.get("agent_id") or None
    k = kernel_of(request)
    result = await call(timeline.execution_page, k, agent_id=agent_id, status=status,
                        created_from=time_field(q.get("from"), "from"), created_to=time_field(q.get("to"), "to"),
                        cursor=cursor, limit=PAGE_SIZE)
    known = await call(agents.list_agents, k)
    filters = {key: q.get(key, "") for key in ("agent_id", "status", "from", "to")}
    return page(request, v, "executions.html", section="executions", page=result, filters=filters,
                agents=[a.id for a in known], statuses=[s.value for s in ExecutionStatus])


def _after(request: Request) -> int:
    return whole_number(request.query_params.get("after_seq")) or 0


@router.get("/console/executions/{execution_id}")
async def timeline_page(execution_id: str, request: Request) -> Response:
    v = await viewer(request)
    require(v, any_of=TIMELINE_SCOPES)
    t = await call(timeline.timeline, kernel_of(request), _uuid(execution_id, "execution id"), _after(request))
    return page(request, v, "timeline.html", section="executions", t=t)


@router.get("/console/executions/{execution_id}/live")
async def timeline_live(execution_id: str, request: Request) -> Response:
    """What a running execution's page polls: 204 while nothing changed, else the new timeline."""
    v = await viewer(request)
    require(v, any_of=TIMELINE_SCOPES)
    eid = _uuid(execution_id, "execution id")
    k = kernel_of(request)
    seq, status = await call(timeline.last_event_seq, k, eid)
    seen = request.query_params.get("seen") or ""
    if whole_number(seen) == seq:
        return Response(status_code=204, headers={"Cache-Control": "no-store"})
    t = await call(timeline.timeline, k, eid, _after(request))
    return fragment(request, "_timeline.html", headers={"X-Regent-Seq": str(seq), "X-Regent-Status": status},
                    t=t, viewer=v)

