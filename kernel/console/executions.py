"""Executions: the list (filters, keyset paging, counts per status), one execution's timeline
(live while it runs); its cancel is `kernel.console.cancel`."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response

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
from kernel.errors import ValidationError, invalid
from kernel.ids import parse_uuid, whole_number
from kernel.lane import call

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
PAGE_SIZE = 50
TIMELINE_SCOPES = ("executions:read", "approvals:read")  # an approver sees the timelines too


def _uuid(value: str, what: str) -> str:
    try:
        return parse_uuid(value)
    except ValidationError:
        raise invalid(f"{what} {value!r} is not a UUID") from None


FIELDS = ("q", "agent_id", "status", "from", "to")  # the list's search form


@router.get("/console/executions")
async def list_page(request: Request) -> Response:
    v = await viewer(request)
    require(v, "executions:read")
    q = request.query_params
    filters = {key: q.get(key, "").strip()[:1024] for key in FIELDS}
    k = kernel_of(request)
    # A search the page cannot run (a date that is not one, an id that cannot be) is said above
    # the form, which keeps what was typed, instead of an error page without the form.
    error, status_code = "", 200
    try:
        status = filters["status"] or None
        if status is not None and status not in {s.value for s in ExecutionStatus}:
            raise invalid(f"unknown status {status!r}")
        cursor = _uuid(q["cursor"], "cursor") if q.get("cursor") else None
        newer = _uuid(q["newer"], "cursor") if q.get("newer") else None
        result = await call(timeline.execution_page, k, agent_id=filters["agent_id"] or None, status=status,
                            created_from=time_field(filters["from"], "from"), created_to=time_field(filters["to"], "to"),
                            cursor=cursor, newer_than=newer, id_starts=filters["q"] or None, limit=PAGE_SIZE)
    except ValidationError as exc:
        error, status_code = exc.message.removeprefix("validation error: "), 400
        counts = await call(timeline.execution_page, k, agent_id=None, status=None, created_from=None,
                            created_to=None, cursor=None, limit=1)
        result = timeline.ExecutionPage([], None, counts.counts, count_cap=counts.count_cap)
    known = await call(agents.list_agents, k)
    here = urlencode({key: value for key, value in filters.items() if value})
    return page(request, v, "executions.html", status=status_code, section="executions", page=result, filters=filters,
                agents=[a.id for a in known], statuses=[s.value for s in ExecutionStatus], error=error, here=here)


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

