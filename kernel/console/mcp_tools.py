"""MCP tools: per agent, each tool its gateways offer with its state (approved, changed, new), who
approved its definition and whether the bundle denies it whatever the arguments; approving is a
confirmation page showing the old and new definition and who the history will name
(docs/console.md, docs/mcp.md)."""

from __future__ import annotations

import difflib
import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.console.web import ConsoleRoute, form, kernel_of, page, redirect, require, viewer
from kernel.core import agents, tool_pins
from kernel.core.policies import Actor
from kernel.domain import ToolPin
from kernel.errors import NotFound
from kernel.lane import call
from kernel.text import check_text

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
_DESCRIPTION_SHOWN = 200  # characters of a description in the list: an upstream's text, hostile and long


def definition_lines(definition: dict[str, Any] | None) -> list[str]:
    """A definition as a reader compares it: the description on lines of its own, then the schema."""
    if definition is None:
        return []
    lines = [f"name: {definition.get('name', '')}", "description:"]
    lines += [f"  {line}" for line in str(definition.get("description") or "").splitlines()]
    lines.append("inputSchema:")
    lines += ["  " + line for line in json.dumps(definition.get("inputSchema"), indent=2, sort_keys=True).splitlines()]
    return lines


def definition_diff(pin: ToolPin) -> list[str]:
    old = definition_lines(pin.approved.definition if pin.approved else None)
    new = definition_lines(pin.offered_definition)
    return list(difflib.unified_diff(old, new, "approved", "offered now", lineterm="", n=3))


def _overview(k: Any, agent_id: str | None) -> dict[str, Any]:
    known = [a.id for a in agents.list_agents(k)]
    chosen = agent_id or (known[0] if known else None)
    if chosen is not None and chosen not in known:
        raise NotFound(f"agent {chosen!r} not found")
    pins = tool_pins.list_pins(k, chosen) if chosen else []
    # What the API's pins say as `denied_always`; hidden from tools/list only where the manifest asks.
    denied = tool_pins.denied_always(k, chosen, [p.tool for p in pins]) if chosen else frozenset()
    return {"agents": known, "agent_id": chosen, "tools": pins, "denied": denied,
            "hides_denied": chosen in k.mcp_hide_denied}


def _actor(v: Any) -> Actor:
    return Actor(v.principal.name, v.principal.credential.value)


@router.get("/console/mcp")
async def tools_page(request: Request) -> Response:
    v = await viewer(request)
    require(v, tool_pins.SCOPE)
    agent_id = request.query_params.get("agent_id") or None
    if agent_id is not None:
        check_text(agent_id, "agent id")
    ctx = await call(_overview, kernel_of(request), agent_id)
    approved = request.query_params.get("approved", "")[: tool_pins.MAX_TOOL_NAME]
    return page(request, v, "mcp_tools.html", section="mcp", approved=approved, shown=_DESCRIPTION_SHOWN, **ctx)


async def _approve_page(request: Request, agent_id: str, tool: str, sha256: str, status: int = 200,
                        error: str = "") -> Response:
    v = await viewer(request)
    require(v, tool_pins.SCOPE)
    check_text(agent_id, "agent id")
    tool_pins.check_tool_name(tool)
    pin = await call(tool_pins.get_pin, kernel_of(request), agent_id, tool)
    stale = pin.offered_sha256 != sha256  # offered anew since the list was read
    return page(request, v, "mcp_approve.html", status=status, section="mcp", agent_id=agent_id, pin=pin,
                sha256=sha256, stale=stale, changes=definition_diff(pin), error=error,
                new_lines=definition_lines(pin.offered_definition))


@router.get("/console/mcp/{agent_id}/approve")
async def confirm_approve(agent_id: str, request: Request) -> Response:
    """The confirmation step of an approval: which definition, what changed, who is named."""
    q = request.query_params
    return await _approve_page(request, agent_id, q.get("tool", ""), q.get("sha256", ""))


@router.post("/console/mcp/{agent_id}/approve")
async def approve(agent_id: str, request: Request) -> Response:
    v = await viewer(request)
    fields = await form(request, v)
    require(v, tool_pins.SCOPE)
    tool, sha256 = str(fields.get("tool") or ""), str(fields.get("sha256") or "")
    if fields.get("confirm") != "yes":  # posted without the confirmation page's own button
        return await _approve_page(request, agent_id, tool, sha256, status=400,
                                   error="Nothing was approved: confirm on this page to approve the definition.")
    await call(tool_pins.approve, kernel_of(request), agent_id, tool, sha256, _actor(v), "console")
    from urllib.parse import urlencode

    return redirect(request, "/console/mcp?" + urlencode({"agent_id": agent_id, "approved": tool}))
