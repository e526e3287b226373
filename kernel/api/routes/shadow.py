"""Shadow bundle routes (bearer, `policies:write`): set, read and clear an agent's shadow, its
report, promotion, rollback, and the agent's policy audit trail (docs/policy-rollout.md)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api import schema
from kernel.api.deps import auth_of, call, kernel_of
from kernel.api.render import JSONResponse
from kernel.api.routes.policies import _json as revision_json
from kernel.api.routes.policies import actor_of, bundle_of
from kernel.clock import rfc3339
from kernel.core import shadow
from kernel.core.shadow import Shadow
from kernel.errors import invalid
from kernel.ids import whole_number

router = APIRouter()
# Shadow ids are an INTEGER column: past 2^31 - 1 PostgreSQL refused the lookup (a 500 from R3's
# fuzz; SQLite's INTEGER is 64-bit and found nothing).
MAX_SHADOW_ID = 2**31 - 1


def shadow_json(s: Shadow, with_content: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": s.id,
        "agent_id": s.agent_id,
        "kind": s.kind,
        "revision": s.revision,
        "status": s.status,
        "created_at": rfc3339(s.created_at),
    }
    for key in ("created_by", "last_error"):
        if getattr(s, key):
            out[key] = getattr(s, key)
    if s.ended_at is not None:
        out["ended_at"] = rfc3339(s.ended_at)
    if with_content:
        out["bundle"] = json.loads(s.content) if s.kind == "rego" else s.content
    return out


def _side(decision: str, rule_id: str, reason: str | None, revision: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"decision": decision, "rule_id": rule_id}
    if reason:
        out["reason"] = reason
    if revision:
        out["revision"] = revision
    return out


def sample_json(r: Any) -> dict[str, Any]:
    eid, sid = r.execution_id, r.step_id
    return {
        "execution_id": eid,
        "step_id": sid,
        "kind": r.kind,
        "target": r.target,
        "active": _side(r.active_decision, r.active_rule_id, r.active_reason, r.active_revision),
        "shadow": _side(r.shadow_decision, r.shadow_rule_id, r.shadow_reason, r.shadow_revision),
        "occurred_at": rfc3339(r.occurred_at),
        "links": {"step": f"/v0/executions/{eid}/steps/{sid}", "events": f"/v0/executions/{eid}/events"},
    }


def report_json(rep: dict[str, Any]) -> dict[str, Any]:
    return {
        **rep,
        "shadow": shadow_json(rep["shadow"], with_content=False),
        "top_targets": [{"target": v, "count": n} for v, n in rep["top_targets"]],
        "top_active_rules": [{"rule_id": v, "count": n} for v, n in rep["top_active_rules"]],
        "top_shadow_rules": [{"rule_id": v, "count": n} for v, n in rep["top_shadow_rules"]],
        "samples": [sample_json(r) for r in rep["samples"]],
    }


def _int_param(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    text = request.query_params.get(name)
    if text is None:
        return default
    n = whole_number(text, high)
    if n is None or n < low:
        raise invalid(f"{name} must be a whole number from {low} to {high}")
    return n


@router.put("/v0/policies/{agent_id}/shadow")
async def put_shadow(agent_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "policies:write")
    kind, content = await bundle_of(request)
    s = await call(shadow.store_shadow, kernel_of(request), agent_id, kind, content, actor_of(request, principal))
    return JSONResponse(shadow_json(s, with_content=False))


@router.get("/v0/policies/{agent_id}/shadow")
async def get_shadow(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    s = await call(shadow.get_shadow, kernel_of(request), agent_id)
    return JSONResponse(shadow_json(s))


@router.delete("/v0/policies/{agent_id}/shadow")
async def delete_shadow(agent_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "policies:write")
    await call(shadow.clear_shadow, kernel_of(request), agent_id, actor_of(request, principal))
    return Response(status_code=204)


@router.get("/v0/policies/{agent_id}/shadow/report", openapi_extra=schema.operation(answer=schema.SHADOW_REPORT, query={
    "shadow_id": {"type": "integer", "minimum": 1, "maximum": MAX_SHADOW_ID},
    "samples": {"type": "integer", "minimum": 0, "maximum": 500},
    "top": {"type": "integer", "minimum": 1, "maximum": 100}}))
async def shadow_report(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    sid = _int_param(request, "shadow_id", None, 1, MAX_SHADOW_ID)
    samples = _int_param(request, "samples", 20, 0, 500) or 0
    top = _int_param(request, "top", 10, 1, 100) or 10
    rep = await call(shadow.shadow_report, kernel_of(request), agent_id, sid, samples=samples, top=top)
    return JSONResponse(report_json(rep))


@router.post("/v0/policies/{agent_id}/shadow/promote")
async def promote(agent_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "policies:write")
    r = await call(shadow.promote_shadow, kernel_of(request), agent_id, actor_of(request, principal))
    return JSONResponse(revision_json(r, with_content=False))


@router.post("/v0/policies/{agent_id}/rollback")
async def rollback(agent_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "policies:write")
    r = await call(shadow.rollback_policy, kernel_of(request), agent_id, actor_of(request, principal))
    return JSONResponse(revision_json(r, with_content=False))


@router.get("/v0/policies/{agent_id}/events", openapi_extra=schema.operation(
    answer=schema.array(schema.POLICY_EVENT), query={"limit": {"type": "integer", "minimum": 1, "maximum": 1000}}))
async def policy_events(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    limit = _int_param(request, "limit", 100, 1, 1000) or 100
    rows = await call(shadow.list_policy_events, kernel_of(request), agent_id, limit)
    return JSONResponse([
        {k: v for k, v in {
            "id": r.id, "agent_id": r.agent_id, "type": r.type, "seq": r.seq, "shadow_id": r.shadow_id,
            "actor": r.actor, "credential": r.credential, "payload": json.loads(r.payload),
            "occurred_at": rfc3339(r.occurred_at),
        }.items() if v is not None}
        for r in rows
    ])
