"""Audit routes (bearer): the durable decision record (`GET /v0/decisions`) and API key management
(`/v0/api-keys`), docs/audit.md."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import WithJsonSchema
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import NO_NUL, Name, Strict, parse_model, text_field
from kernel.api.deps import auth_of, call, kernel_of, uuid_param
from kernel.api.render import JSONResponse
from kernel.api.routes.client import _body, _int_param
from kernel.clock import parse_time
from kernel.config import seconds
from kernel.core import api_keys, audit
from kernel.errors import invalid

router = APIRouter()

_FILTERS = ("agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id")


def _time_param(value: str | None, name: str) -> datetime | None:
    return parse_time(value, name, naive_is_utc=False) if value else None


@router.get("/v0/decisions", openapi_extra=schema.operation(answer=schema.DECISION_PAGE, query={
    **{name: {"type": "string", "maxLength": 4096, "pattern": NO_NUL} for name in _FILTERS},
    "decision": schema.DECISION_RECORD["properties"]["decision"], "execution_id": schema.ID,
    "judged": {"type": "string", "enum": ["true", "false"]}, "since": schema.TIME, "until": schema.TIME,
    "cursor": schema.TEXT, "limit": {"type": "integer", "minimum": 1, "maximum": audit.MAX_PAGE}}))
async def list_decisions(request: Request) -> Response:
    await call(auth_of(request).principal, request, "decisions:read")
    q = request.query_params
    filters: dict[str, Any] = {}
    for name in _FILTERS:
        value = q.get(name)
        if value is not None and value != "":
            if len(value) > 4096:
                raise invalid(f"{name} is too long")
            filters[name] = value
    judged = q.get("judged")
    if judged not in (None, "", "true", "false"):
        raise invalid("judged must be true or false")
    query = audit.DecisionQuery(
        **filters,
        judged=None if not judged else judged == "true",
        since=_time_param(q.get("since"), "since"),
        until=_time_param(q.get("until"), "until"),
        cursor=q.get("cursor") or None,
        limit=_int_param(q.get("limit"), 50, "limit", lo=1, hi=audit.MAX_PAGE),
    )
    page = await call(audit.list_decisions, kernel_of(request), query)
    out: dict[str, Any] = {"decisions": [audit.decision_json(r) for r in page.decisions]}
    if page.next_cursor:
        out["next_cursor"] = page.next_cursor
    return JSONResponse(out)


class CreateKeyBody(Strict):
    name: text_field(1, 200)  # type: ignore[valid-type]
    scopes: Annotated[list[Name], WithJsonSchema({"type": "array", "minItems": 1, "maxItems": api_keys.MAX_SCOPES,
                                                  "items": {"type": "string", "enum": sorted(api_keys.SCOPES)}})]
    expires_at: Annotated[str, WithJsonSchema(schema.TIME)] | None = None  # RFC 3339 with a zone
    expires_in: str | float | None = None  # seconds or a duration such as 720h


@router.post("/v0/api-keys", status_code=201, openapi_extra=schema.operation(CreateKeyBody, ok=201, answer=schema.API_KEY))
async def create_api_key(request: Request) -> Response:
    """201 with the key and its `token`, shown this once (only its SHA-256 is stored)."""
    principal = await call(auth_of(request).principal, request, "api_keys:manage")
    body = parse_model(CreateKeyBody, await _body(request))
    k = kernel_of(request)
    expires = _time_param(body.expires_at, "expires_at")
    if body.expires_in is not None:
        if expires is not None:
            raise invalid("give expires_at or expires_in, not both")
        try:
            expires = k.clock.now() + timedelta(seconds=seconds(body.expires_in))
        except ValueError as exc:
            raise invalid(f"expires_in: {exc}") from None
        except OverflowError:  # past year 9999 (or infinite)
            raise invalid("expires_in is too far in the future") from None
    key, token = await call(api_keys.create_key, k, body.name, body.scopes, expires_at=expires,
                            created_by=principal)
    return JSONResponse({**key.json(), "token": token}, status_code=201)


@router.get("/v0/api-keys", openapi_extra=schema.operation(answer=schema.array(schema.API_KEY)))
async def list_api_keys(request: Request) -> Response:
    await call(auth_of(request).principal, request, "api_keys:manage")
    keys = await call(api_keys.list_keys, kernel_of(request))
    return JSONResponse([x.json() for x in keys])


@router.delete("/v0/api-keys/{key_id}", openapi_extra=schema.operation(ok=204))
async def revoke_api_key(key_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "api_keys:manage")
    await call(api_keys.revoke_key, kernel_of(request), uuid_param(key_id, "api key id"), principal)
    return Response(status_code=204)
