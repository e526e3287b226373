"""Admin routes (bearer): agents."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import Strict, parse_model, text_field, whole
from kernel.api.deps import agent_param, auth_of, call, kernel_of
from kernel.api.render import JSONResponse, agent_json
from kernel.api.routes.client import _body
from kernel.core import agents
from kernel.core.kernel import MAX_LEASE_SECONDS
from kernel.core.policies import Actor

router = APIRouter()


class RegisterAgentBody(Strict):
    id: text_field(1, 200, "^[A-Za-z0-9][A-Za-z0-9._:@-]*$")  # type: ignore[valid-type]  # agents.AGENT_ID
    webhook_url: text_field(1, None, "^[hH][tT][tT][pP][sS]?://[^\\u0000]+$")  # type: ignore[valid-type]
    secret: text_field(1, agents.MAX_SECRET_CHARS)  # type: ignore[valid-type]
    lease_timeout_seconds: whole(0, MAX_LEASE_SECONDS) | None = None  # type: ignore[valid-type]


@router.post("/v0/agents", openapi_extra=schema.operation(RegisterAgentBody, ok=(201, 200), answer=schema.AGENT))
async def register_agent(request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "agents:write")
    body = parse_model(RegisterAgentBody, await _body(request))
    agent, created = await call(agents.register_agent, kernel_of(request), body.id, body.webhook_url,
                                body.secret, body.lease_timeout_seconds,
                                actor=Actor(principal.name, principal.credential.value))
    return JSONResponse(agent_json(agent), status_code=201 if created else 200)


@router.get("/v0/agents", openapi_extra=schema.operation(answer=schema.array(schema.AGENT)))
async def list_agents(request: Request) -> Response:
    await call(auth_of(request).principal, request, "agents:read")
    rows = await call(agents.list_agents, kernel_of(request))
    return JSONResponse([agent_json(a) for a in rows])


@router.get("/v0/agents/{agent_id}", openapi_extra=schema.operation(answer=schema.AGENT))
async def get_agent(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "agents:read")
    a = await call(agents.get_agent, kernel_of(request), agent_param(agent_id))
    return JSONResponse(agent_json(a, schemas=True))


@router.delete("/v0/agents/{agent_id}", openapi_extra=schema.operation(ok=204))
async def delete_agent(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "agents:write")
    await call(agents.delete_agent, kernel_of(request), agent_param(agent_id))
    return Response(status_code=204)
