"""Audit routes (bearer): the durable decision record, `GET /v0/decisions` (docs/audit.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api.deps import auth_of, call, kernel_of
from kernel.api.render import JSONResponse
from kernel.api.routes.client import _int_param
from kernel.core import decisions
from kernel.errors import ValidationError

router = APIRouter()

_FILTERS = ("agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id")


def _time_param(value: str | None, name: str) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(f"validation error: {name} must be an RFC 3339 time") from None
    if when.tzinfo is None:
        raise ValidationError(f"validation error: {name} must carry a time zone (e.g. Z)")
    return when


@router.get("/v0/decisions")
async def list_decisions(request: Request) -> Response:
    await call(auth_of(request).principal, request, "decisions:read")
    q = request.query_params
    filters: dict[str, Any] = {}
    for name in _FILTERS:
        value = q.get(name)
        if value is not None and value != "":
            if len(value) > 4096:
                raise ValidationError(f"validation error: {name} is too long")
            filters[name] = value
    query = decisions.DecisionQuery(
        **filters,
        since=_time_param(q.get("since"), "since"),
        until=_time_param(q.get("until"), "until"),
        cursor=q.get("cursor") or None,
        limit=_int_param(q.get("limit"), 50, "limit", lo=1, hi=decisions.MAX_PAGE),
    )
    page = await call(decisions.list_decisions, kernel_of(request), query)
    out: dict[str, Any] = {"decisions": [decisions.decision_json(r) for r in page.decisions]}
    if page.next_cursor:
        out["next_cursor"] = page.next_cursor
    return JSONResponse(out)
