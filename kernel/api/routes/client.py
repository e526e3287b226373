"""Client routes (bearer): executions, events, cancel, approvals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import WithJsonSchema
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import Name, Strict, parse_model, read_body, text_field, whole
from kernel.api.deps import agent_param, auth_of, call, kernel_of, uuid_param
from kernel.api.render import JSONResponse, approval_json, event_json, execution_json
from kernel.core import approvals, executions, forks
from kernel.core.lifecycle import Canceller, check_rationale
from kernel.domain import ApprovalStatus, ExecutionStatus
from kernel.errors import invalid
from kernel.ids import INT64_MAX, whole_number
from kernel.text import check_text

router = APIRouter()
_EXECUTION_STATUSES = frozenset(s.value for s in ExecutionStatus)
_APPROVAL_STATUSES = frozenset(s.value for s in ApprovalStatus)
# Filters are exact matches, so a status no row can have matches nothing: 200 with an empty list
# (rebuno-v0 §7.2), answered without a query. The schema names the known values but does not
# restrict them.
_EXECUTION_STATUS_PARAM = {"type": "string", "description": "one of " + ", ".join(sorted(_EXECUTION_STATUSES))
                           + "; any other value matches nothing"}
_APPROVAL_STATUS_PARAM = {"type": "string", "default": "pending", "description": "one of "
                          + ", ".join(sorted(_APPROVAL_STATUSES)) + " or all; any other value matches nothing"}


class SpawnedBy(Strict):
    execution_id: Annotated[str, WithJsonSchema(schema.ID)]
    step_id: Annotated[str, WithJsonSchema({"type": "string", "pattern": "^[0-9a-fA-F]{1,64}$"})]


class CreateExecutionBody(Strict):
    agent_id: Name
    input: Any = None
    idempotency_key: text_field(1, 200) | None = None  # type: ignore[valid-type]
    session: str | None = None
    parent_execution_id: Annotated[str, WithJsonSchema(schema.ID)] | None = None
    spawned_by: SpawnedBy | None = None
    on_behalf_of: Any = None  # sent by newer SDKs; accepted and ignored (docs/api.md)


def lineage_of(body: CreateExecutionBody) -> executions.Lineage:
    session = check_session(body.session)
    parent = uuid_param(body.parent_execution_id, "parent_execution_id") if body.parent_execution_id else None
    step = None
    if body.spawned_by is not None:
        by = uuid_param(body.spawned_by.execution_id, "spawned_by.execution_id")
        if parent is not None and parent != by:
            raise invalid("parent_execution_id and spawned_by.execution_id differ")
        parent, step = by, body.spawned_by.step_id.lower()
        if not (0 < len(step) <= 64 and all(ch in "0123456789abcdef" for ch in step)):
            raise invalid("spawned_by.step_id must be a step id (hex)")
    return executions.Lineage(session=session, parent_execution_id=parent, spawned_step_id=step)


def check_session(session: str | None) -> str | None:
    if session is None or session == "":
        return None
    if len(session) > 200 or not session.isprintable():
        raise invalid("session must be 1-200 printable characters")
    return session


class DecideBody(Strict):
    decided_by: text_field(0, approvals.MAX_DECIDED_BY_CHARS) = ""  # type: ignore[valid-type]
    rationale: text_field(0, approvals.MAX_RATIONALE_CHARS) | None = None  # type: ignore[valid-type]


async def _body(request: Request) -> bytes:
    from kernel.api.body import BodyTooLarge

    try:
        return await read_body(request, auth_of(request).max_body_bytes)
    except BodyTooLarge:
        raise invalid("request body over the size limit") from None


def _int_param(value: str | None, default: int, name: str, *, lo: int = 0, hi: int | None = None) -> int:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise invalid(f"{name} must be an integer") from None
    if n < lo:
        raise invalid(f"{name} must be >= {lo}")
    return min(n, hi) if hi is not None else n


@router.post("/v0/executions", status_code=201,
             openapi_extra=schema.operation(CreateExecutionBody, ok=(201, 200), answer=schema.EXECUTION))
async def create_execution(request: Request) -> Response:
    auth = auth_of(request)
    principal = await call(auth.principal, request, "executions:write")
    body = parse_model(CreateExecutionBody, await _body(request))
    if body.idempotency_key is not None and not 0 < len(body.idempotency_key) <= 200:
        raise invalid("idempotency_key must be 1-200 characters")
    e, created = await call(executions.create_execution, kernel_of(request), body.agent_id, body.input,
                            body.idempotency_key, lineage_of(body), principal.creator)
    return JSONResponse(execution_json(e, []), status_code=201 if created else 200)


@router.get("/v0/executions", openapi_extra=schema.operation(answer=schema.EXECUTION_PAGE, query={
    "agent_id": schema.TEXT, "status": _EXECUTION_STATUS_PARAM,
    "session": schema.TEXT, "parent": schema.ID, "cursor": schema.ID,
    "limit": {"type": "integer", "minimum": 1, "maximum": 200}}))
async def list_executions(request: Request) -> Response:
    await call(auth_of(request).principal, request, "executions:read")
    q = request.query_params
    limit = _int_param(q.get("limit"), 50, "limit", lo=1, hi=200)
    cursor = uuid_param(q["cursor"], "cursor") if q.get("cursor") else None
    parent = uuid_param(q["parent"], "parent") if q.get("parent") else None
    agent_id = agent_param(q["agent_id"]) if q.get("agent_id") else None
    status = check_text(q["status"], "status") if q.get("status") else None  # NUL: 400 (docs/api.md, "Text")
    if status is not None and status not in _EXECUTION_STATUSES:
        return JSONResponse({"executions": []})
    rows, next_cursor, children = await call(
        executions.list_executions, kernel_of(request), agent_id, status, cursor, limit,
        check_session(q.get("session")), parent)
    out: dict[str, Any] = {"executions": [execution_json(e, children.get(e.id, [])) for e in rows]}
    if next_cursor:
        out["next_cursor"] = next_cursor
    return JSONResponse(out)


@router.get("/v0/executions/{execution_id}/events", openapi_extra=schema.operation(
    answer=schema.array(schema.EVENT), query={"after_seq": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                                              "limit": {"type": "integer", "minimum": 1, "maximum": 1000}}))
async def list_events(execution_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "executions:read")
    eid = uuid_param(execution_id, "execution id")
    q = request.query_params
    # Unparsable values fall back to the defaults, as Rebuno does (rebuno-v0 §7.2); a whole number
    # past the int64 event seqs is a 400 (no store compares such a value).
    text = (q.get("after_seq") or "0").strip()
    if text.isascii() and text.isdigit() and whole_number(text) is None:
        raise invalid(f"after_seq must be at most {INT64_MAX}")
    try:
        after = max(int(text), 0)
    except ValueError:
        after = 0
    try:
        limit = int(q.get("limit", "100")[:20] or 100)
    except ValueError:
        limit = 100
    limit = 100 if limit <= 0 else min(limit, 1000)
    rows = await call(executions.list_events, kernel_of(request), eid, after, limit)
    return JSONResponse([event_json(e) for e in rows])


class CancelBody(Strict):
    rationale: Name | None = None  # why, in words; `execution.cancelled` records it with who


@router.post("/v0/executions/{execution_id}/cancel",
             openapi_extra=schema.operation(CancelBody, body_required=False, ok=204))
async def cancel_execution(execution_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "executions:write")
    eid = uuid_param(execution_id, "execution id")
    # The official SDK sends no body (Rebuno reads none); `null`, `{}` and `{"rationale": "…"}`
    # are accepted too.
    raw = await _body(request)
    body = parse_model(CancelBody, b"" if raw.strip() == b"null" else raw, allow_empty=True)
    who = Canceller(principal.actor, principal.credential.value, check_rationale(body.rationale))
    await call(executions.cancel_execution, kernel_of(request), eid, who=who)
    return Response(status_code=204)


class ForkBody(Strict):
    at_seq: whole(0, INT64_MAX)  # type: ignore[valid-type]  # and at most the source's last event seq
    session: str | None = None
    # YAML text, or {"kind": "yaml"|"rego", "bundle": <text or {modules, data, manifest}>}
    policy_bundle: str | dict[str, Any] | None = None


def _fork_bundle(value: str | dict[str, Any] | None) -> forks.ForkBundle | None:
    # The bundle's text is stored (a TEXT column), so NUL and lone surrogates are a 400 here, as
    # for POST /v0/policies/{agent_id} (docs/api.md, "Text").
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return forks.ForkBundle("yaml", check_text(value, "policy_bundle"))
    kind, bundle = value.get("kind", "yaml"), value.get("bundle")
    if kind == "rego" and isinstance(bundle, dict):
        from kernel.core.policies import rego_content

        return forks.ForkBundle("rego", check_text(rego_content(bundle), "policy_bundle"))
    if kind == "yaml" and isinstance(bundle, str):
        return forks.ForkBundle("yaml", check_text(bundle, "policy_bundle"))
    raise invalid('policy_bundle is YAML text or {"kind", "bundle"}')


@router.post("/v0/executions/{execution_id}/fork", status_code=201,
             openapi_extra=schema.operation(ForkBody, ok=201, answer=schema.EXECUTION))
async def fork_execution(execution_id: str, request: Request) -> Response:
    auth = auth_of(request)
    await call(auth.principal, request, "executions:write")
    eid = uuid_param(execution_id, "execution id")
    body = parse_model(ForkBody, await _body(request))
    bundle = _fork_bundle(body.policy_bundle)
    if bundle is not None:  # a fork's own bundle governs it: the caller must be allowed to set policy
        await call(auth.principal, request, "policies:write")
    e = await call(forks.fork_execution, kernel_of(request), eid, body.at_seq, check_session(body.session), bundle)
    return JSONResponse(execution_json(e, []), status_code=201)


@router.get("/v0/executions/{execution_id}/fork-points",
            openapi_extra=schema.operation(answer=schema.array(schema.FORK_POINT)))
async def fork_points(execution_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "executions:read")
    eid = uuid_param(execution_id, "execution id")
    return JSONResponse(await call(forks.fork_points, kernel_of(request), eid))


@router.get("/v0/approvals", openapi_extra=schema.operation(answer=schema.array(schema.APPROVAL), query={
    "status": _APPROVAL_STATUS_PARAM}))
async def list_approvals(request: Request) -> Response:
    await call(auth_of(request).principal, request, "approvals:read")
    status = check_text(request.query_params.get("status") or "pending", "status")
    if status != "all" and status not in _APPROVAL_STATUSES:
        return JSONResponse([])
    rows = await call(approvals.list_approvals, kernel_of(request), None if status == "all" else status)
    return JSONResponse([approval_json(a) for a in rows])


@router.get("/v0/approvals/{approval_id}", openapi_extra=schema.operation(answer=schema.APPROVAL))
async def get_approval(approval_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "approvals:read")
    aid = uuid_param(approval_id, "approval id")
    a = await call(approvals.get_approval, kernel_of(request), aid)
    return JSONResponse(approval_json(a))


async def _decide(request: Request, approval_id: str, grant: bool) -> Response:
    principal = await call(auth_of(request).principal, request, "approvals:write")
    aid = uuid_param(approval_id, "approval id")
    body = parse_model(DecideBody, await _body(request), allow_empty=True)
    a = await call(approvals.decide_approval, kernel_of(request), aid, grant=grant, principal=principal,
                   decided_by=body.decided_by, rationale=body.rationale)
    request.app.state.metrics.approval(a.agent_id or "", a.rule_id or "", "granted" if grant else "denied",
                                       principal.credential.value)
    return Response(status_code=204)


@router.post("/v0/approvals/{approval_id}/grant",
             openapi_extra=schema.operation(DecideBody, body_required=False, ok=204))
async def grant(approval_id: str, request: Request) -> Response:
    return await _decide(request, approval_id, True)


@router.post("/v0/approvals/{approval_id}/deny",
             openapi_extra=schema.operation(DecideBody, body_required=False, ok=204))
async def deny(approval_id: str, request: Request) -> Response:
    return await _decide(request, approval_id, False)
