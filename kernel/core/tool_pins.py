"""MCP tool pins (docs/mcp.md, "Pinned tool definitions"): the gateways report the definitions
their upstreams offer, an operator approves one, and every gateway replica reads the approvals
back; each approval is an `mcp.tool_approved` event of the agent's policy audit trail."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel.core.kernel import Kernel
from kernel.core.policies import Actor
from kernel.domain import PolicyEventType, ToolApproval, ToolPin
from kernel.domain.tool_pin import (
    MAX_DEFINITION_BYTES,
    MAX_TOOL_NAME,
    MAX_TOOLS_PER_REPORT,
    canonical_definition,
    definition_hash,
)
from kernel.errors import Conflict, NotFound, invalid

_HASH = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
# How an approval came: an operator through the HTTP API, the CLI or the console; the manifest's
# `mcp.pins`; `trust_new_tools` (the manifest trusting a tool's first-seen definition).
VIA_OPERATOR = ("api", "cli", "console")
MANIFEST = Actor(None, "manifest")
# Who lists and approves an agent's tools: who governs what the agent may do.
SCOPE = "policies:write"


@dataclass(frozen=True, slots=True)
class Offered:
    """One tool as a gateway sees its upstream offer it."""

    tool: str  # namespaced
    upstream: str
    definition: dict[str, Any]  # {name, description, inputSchema}: the upstream's own name
    sha256: str


def check_tool_name(tool: Any) -> str:
    if (not isinstance(tool, str) or not 0 < len(tool) <= MAX_TOOL_NAME or not tool.isprintable()
            or any(0xD800 <= ord(ch) <= 0xDFFF for ch in tool)):
        raise invalid(f"a tool name is 1-{MAX_TOOL_NAME} printable characters")
    return tool


def parse_offered(raw: Any) -> Offered:
    """A reported tool, its hash computed here from its definition (a gateway names none itself)."""
    if not isinstance(raw, dict):
        raise invalid("each offered tool is an object {tool, upstream, definition}")
    tool = check_tool_name(raw.get("tool"))
    upstream = raw.get("upstream")
    if not isinstance(upstream, str) or not _PREFIX.fullmatch(upstream):
        raise invalid(f"tool {tool!r}: `upstream` is the upstream's prefix")
    d = raw.get("definition")
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("description"), str | None):
        raise invalid(f"tool {tool!r}: `definition` is {{name, description, inputSchema}}")
    try:
        text = canonical_definition(d["name"], d.get("description"), d.get("inputSchema"))
    except (TypeError, ValueError, RecursionError):
        raise invalid(f"tool {tool!r}: the definition is not JSON") from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DEFINITION_BYTES:
        raise invalid(f"tool {tool!r}: the definition is over {MAX_DEFINITION_BYTES} bytes")
    definition = json.loads(text)
    return Offered(tool, upstream, definition, definition_hash(d["name"], d.get("description"), d.get("inputSchema")))


def _manifest_pins(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or len(raw) > MAX_TOOLS_PER_REPORT:
        raise invalid("`manifest_pins` maps tool names to definition hashes")
    for tool, digest in raw.items():
        check_tool_name(tool)
        if not isinstance(digest, str) or not _HASH.fullmatch(digest):
            raise invalid(f"`manifest_pins`: {tool!r} needs 64 lowercase hex digits")
    return dict(raw)


def parse_report(body: Any) -> tuple[list[Offered], dict[str, str], bool]:
    """A gateway's report: {tools: [...], manifest_pins: {tool: sha256}, trust_new_tools: bool}."""
    if not isinstance(body, dict):
        raise invalid("the report is an object {tools, manifest_pins, trust_new_tools}")
    tools = body.get("tools", [])
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS_PER_REPORT:
        raise invalid(f"`tools` is a list of at most {MAX_TOOLS_PER_REPORT} tools")
    trust = body.get("trust_new_tools", False)
    if not isinstance(trust, bool):
        raise invalid("`trust_new_tools` is true or false")
    return [parse_offered(t) for t in tools], _manifest_pins(body.get("manifest_pins", {})), trust


def _lock(agent_id: str) -> str:
    return f"mcp-pins:{agent_id}"


def _approve(tx: Any, now: Any, agent_id: str, pin: ToolPin | None, tool: str, sha256: str,
             definition: dict[str, Any] | None, actor: Actor, via: str) -> None:
    tx.put_tool_approval(agent_id, tool, ToolApproval(sha256, actor.name, actor.credential, via, now, definition))
    tx.add_policy_event(agent_id, PolicyEventType.TOOL_APPROVED, now, actor=actor.name, credential=actor.credential,
                        payload={"tool": tool, "from": pin.approved.sha256 if pin and pin.approved else None,
                                 "to": sha256, "via": via})


def _manifest_applies(p: ToolPin | None, digest: str) -> bool:
    """A manifest pin approves a tool no one has approved, or replaces an earlier manifest pin;
    it never undoes an operator's approval."""
    return p is None or p.approved is None or (p.approved.via == "manifest" and p.approved.sha256 != digest)


def _changes(current: Sequence[ToolPin], offers: Mapping[str, Offered], manifest_pins: Mapping[str, str],
             trust_new_tools: bool) -> bool:
    pins = {p.tool: p for p in current}
    for o in offers.values():
        p = pins.get(o.tool)
        if p is None or p.offered_sha256 != o.sha256 or p.upstream != o.upstream:
            return True
        if trust_new_tools and p.approved is None and o.tool not in manifest_pins:
            return True
    return any(_manifest_applies(pins.get(tool), digest) for tool, digest in manifest_pins.items())


def report_offered(k: Kernel, agent_id: str, offered: Sequence[Offered], manifest_pins: Mapping[str, str],
                   trust_new_tools: bool) -> list[ToolPin]:
    """Record what a gateway offers (rows change only when a definition does), apply the
    manifest's pins and `trust_new_tools`, and answer the agent's pins."""
    offers = {o.tool: o for o in offered}  # a name twice: the last one (the catalog keeps one)
    # Each gateway reports every few seconds and almost every report changes nothing: read first,
    # and take the write lock (SQLite's is the database's) only when something is to be written.
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        current = list(tx.tool_pins(agent_id))
    if not _changes(current, offers, manifest_pins, trust_new_tools):
        return current
    now = k.clock.now()
    with k.store.transaction(lock=_lock(agent_id)) as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        pins = {p.tool: p for p in tx.tool_pins(agent_id)}
        for o in offers.values():
            p = pins.get(o.tool)
            if p is None or p.offered_sha256 != o.sha256 or p.upstream != o.upstream:
                tx.put_tool_offer(agent_id, o.tool, o.upstream, o.sha256, o.definition, now, exists=p is not None)
        pins = {p.tool: p for p in tx.tool_pins(agent_id)}
        for tool, digest in manifest_pins.items():
            p = pins.get(tool)
            if _manifest_applies(p, digest):
                if p is None:
                    tx.put_tool_offer(agent_id, tool, None, None, None, now, exists=False)
                _approve(tx, now, agent_id, p, tool, digest, None, MANIFEST, "manifest")
        if trust_new_tools:
            for o in offers.values():
                p = pins.get(o.tool)
                if (p is None or p.approved is None) and o.tool not in manifest_pins:
                    _approve(tx, now, agent_id, p, o.tool, o.sha256, o.definition, MANIFEST, "trust_new_tools")
        return list(tx.tool_pins(agent_id))


def list_pins(k: Kernel, agent_id: str) -> list[ToolPin]:
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        return list(tx.tool_pins(agent_id))


def denied_always(k: Kernel, agent_id: str, tools: Sequence[str]) -> frozenset[str]:
    """The tools (namespaced names, the gateway's step targets, kind `tool_call`) the agent's
    active bundle denies whatever the arguments; a gateway with `mcp.hide_denied_tools` leaves
    them out of tools/list (docs/mcp.md, "Hiding denied tools")."""
    if not tools:
        return frozenset()
    return frozenset(k.policy.denied_always(agent_id, "tool_call", list(tools)))


def get_pin(k: Kernel, agent_id: str, tool: str) -> ToolPin:
    with k.store.read() as tx:
        p = tx.tool_pin(agent_id, tool)
    if p is None:
        raise NotFound(f"agent {agent_id!r} has no MCP tool {tool!r}")
    return p


def approve(k: Kernel, agent_id: str, tool: str, sha256: str, actor: Actor, via: str) -> ToolPin:
    """Approve the definition the gateways offer now for `tool`: only the hash they offer (no
    approving a definition no one has seen). Approving the approved one again records nothing."""
    check_tool_name(tool)
    if not isinstance(sha256, str) or not _HASH.fullmatch(sha256):
        raise invalid("`sha256` is 64 lowercase hex digits")
    if via not in VIA_OPERATOR:
        raise invalid(f"`via` is one of {', '.join(VIA_OPERATOR)}")
    now = k.clock.now()
    with k.store.transaction(lock=_lock(agent_id)) as tx:
        p = tx.tool_pin(agent_id, tool)
        if p is None:
            raise NotFound(f"agent {agent_id!r} has no MCP tool {tool!r} (no gateway has reported it)")
        if p.offered_sha256 != sha256:
            raise Conflict(f"conflict: {tool!r} is offered with definition sha256 {p.offered_sha256}, not {sha256}: "
                           "list the tools again and approve what is offered")
        if p.approved is None or p.approved.sha256 != sha256:
            _approve(tx, now, agent_id, p, tool, sha256, p.offered_definition, actor, via)
        out = tx.tool_pin(agent_id, tool)
    assert out is not None
    return out
