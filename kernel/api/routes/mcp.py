"""MCP tool pins (docs/mcp.md, "Pinned tool definitions"): a gateway, signed as its agent, reports
the definitions it is offered and reads the approvals back; an operator (bearer, `policies:write`)
lists an agent's tools and approves a definition, which the policy audit trail records."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import Strict, loads_json, parse_model
from kernel.api.deps import agent_param, auth_of, call, kernel_of
from kernel.api.render import JSONResponse
from kernel.api.routes.client import _body
from kernel.api.routes.policies import actor_of
from kernel.clock import rfc3339
from kernel.core import tool_pins
from kernel.core.tool_pins import SCOPE as PIN_SCOPE
from kernel.domain import ToolPin
from kernel.errors import Forbidden, invalid

router = APIRouter()


class ReportBody(Strict):
    tools: list[dict[str, Any]] = []  # {tool, upstream, definition: {name, description, inputSchema}}
    manifest_pins: dict[str, str] = {}
    trust_new_tools: bool = False


class ApproveBody(Strict):
    tool: str
    sha256: str
    via: str = "api"  # `cli` when `regent mcp pins approve` sends it


TOOL_PIN = schema._object(
    ("tool", "state"), tool=schema.TEXT, upstream=schema.TEXT,
    state={"type": "string", "enum": ["approved", "changed", "new", "gone"]},
    sha256=schema.TEXT, offered_at=schema.TIME, approved_sha256=schema.TEXT, approved_by=schema.TEXT,
    approved_credential=schema.TEXT, approved_via=schema.TEXT, approved_at=schema.TIME,
    definition={"type": "object"}, approved_definition={"type": "object"},
    # The agent's active bundle denies every call to it whatever the arguments (docs/mcp.md).
    denied_always={"type": "boolean"},
)
TOOL_PINS = schema._object(("agent_id", "tools"), agent_id=schema.TEXT, tools=schema.array(TOOL_PIN))


def pin_json(p: ToolPin, definitions: bool = False, denied: frozenset[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"tool": p.tool, "state": p.state.value, "upstream": p.upstream, "sha256": p.offered_sha256}
    if p.offered_at is not None:
        out["offered_at"] = rfc3339(p.offered_at)
    if p.approved is not None:
        a = p.approved
        out.update(approved_sha256=a.sha256, approved_by=a.by or a.credential, approved_credential=a.credential,
                   approved_via=a.via, approved_at=rfc3339(a.at))
    out = {k: v for k, v in out.items() if v is not None}
    if denied is not None:
        out["denied_always"] = p.tool in denied
    if definitions:  # null when there is none (a manifest pin has its hash only)
        out["definition"] = p.offered_definition
        out["approved_definition"] = p.approved.definition if p.approved else None
    return out


def _with_denied(read: Any, k: Any, agent_id: str, *args: Any) -> tuple[list[ToolPin], frozenset[str]]:
    """`read`'s pins and which of them the agent's bundle denies whatever the arguments, in one
    trip to the worker thread (a gateway reports every few seconds)."""
    pins: list[ToolPin] = read(k, agent_id, *args)
    return pins, tool_pins.denied_always(k, agent_id, [p.tool for p in pins])


def _answer(agent_id: str, pins: list[ToolPin], denied: frozenset[str], definitions: bool = False) -> Response:
    return JSONResponse({"agent_id": agent_id, "tools": [pin_json(p, definitions, denied) for p in pins]})


@router.post("/v0/mcp/{agent_id}/tools", openapi_extra=schema.operation(ReportBody, answer=TOOL_PINS))
async def report_tools(agent_id: str, request: Request) -> Response:
    """A gateway, signed as the agent, reports what its upstreams offer; answers the agent's pins."""
    a = await auth_of(request).agent(request, "repeatable")
    if a.agent_id != agent_param(agent_id):
        raise Forbidden("forbidden: a gateway reports only the tools of the agent it signs as")
    parse_model(ReportBody, a.body)  # the shape, with the model's messages
    offered, manifest_pins, trust = tool_pins.parse_report(loads_json(a.body))
    return _answer(agent_id, *await call(_with_denied, tool_pins.report_offered, kernel_of(request), agent_id,
                                         offered, manifest_pins, trust))


@router.get("/v0/mcp/{agent_id}/tools", openapi_extra=schema.operation(
    answer=TOOL_PINS, query={"definitions": {"type": "boolean"}}))
async def list_tools(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, PIN_SCOPE)
    pins, denied = await call(_with_denied, tool_pins.list_pins, kernel_of(request), agent_param(agent_id))
    return _answer(agent_id, pins, denied, request.query_params.get("definitions") in ("1", "true"))


@router.post("/v0/mcp/{agent_id}/tools/approve", openapi_extra=schema.operation(ApproveBody, answer=TOOL_PIN))
async def approve_tool(agent_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, PIN_SCOPE)
    body = parse_model(ApproveBody, await _body(request))
    if body.via not in ("api", "cli"):  # `console` is the console's own to record
        raise invalid("`via` is api or cli")
    p = await call(tool_pins.approve, kernel_of(request), agent_param(agent_id), body.tool, body.sha256,
                   actor_of(request, principal), body.via)
    return JSONResponse(pin_json(p))
