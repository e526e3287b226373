"""Policy admin routes (bearer, `policies:write`): store, read, list and re-activate bundles."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api.body import Strict, parse_model
from kernel.api.deps import auth_of, call, kernel_of
from kernel.api.render import JSONResponse
from kernel.api.routes.client import _body
from kernel.clock import rfc3339
from kernel.core import policies
from kernel.core.policies import PolicyRevision

router = APIRouter()


class StoreBody(Strict):
    bundle: str = ""
    kind: str = "yaml"


def _json(r: PolicyRevision, with_content: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "agent_id": r.agent_id,
        "seq": r.seq,
        "kind": r.kind,
        "revision": r.revision,
        "active": r.active,
        "created_at": rfc3339(r.created_at),
    }
    if with_content:
        out["bundle"] = r.content
    return out


@router.post("/v0/policies/{agent_id}")
async def store_policy(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    body = parse_model(StoreBody, await _body(request), allow_empty=True)
    await call(policies.store_policy, kernel_of(request), agent_id, body.kind, body.bundle)
    return Response(status_code=204)


@router.get("/v0/policies/{agent_id}")
async def get_policy(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    r = await call(policies.active_policy, kernel_of(request), agent_id)
    return JSONResponse(_json(r))


@router.get("/v0/policies/{agent_id}/revisions")
async def list_revisions(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    rows = await call(policies.list_revisions, kernel_of(request), agent_id)
    return JSONResponse([_json(r, with_content=False) for r in rows])


@router.post("/v0/policies/{agent_id}/revisions/{seq}/activate")
async def activate(agent_id: str, seq: int, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    await call(policies.activate_revision, kernel_of(request), agent_id, seq)
    return Response(status_code=204)
