"""`Tx`'s queries on the MCP tool pins (docs/mcp.md, "Pinned tool definitions"). Mixed into `Tx`
(sql.py), which supplies `store`, `conn` and `w`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from kernel.domain import ToolApproval, ToolPin
from kernel.store import tables as t
from kernel.store.dialect import TxPart


def _loads(text: str | None) -> dict[str, Any] | None:
    return json.loads(text) if text else None


def _pin(row: Any) -> ToolPin:
    approved = None
    if row.approved_sha256 is not None:
        approved = ToolApproval(row.approved_sha256, row.approved_by, row.approved_credential or "",
                                row.approved_via or "", row.approved_at, _loads(row.approved_definition))
    return ToolPin(row.agent_id, row.tool, row.upstream, row.offered_sha256, _loads(row.offered_definition),
                   row.offered_at, approved)


def _dumps(definition: dict[str, Any] | None) -> str | None:
    # ASCII: a definition's text is an upstream's, and may hold lone surrogates PostgreSQL refuses.
    return None if definition is None else json.dumps(definition, sort_keys=True, separators=(",", ":"))


class ToolPinQueries(TxPart):
    def tool_pins(self, agent_id: str) -> list[ToolPin]:
        c = t.mcp_tool_pins.c
        rows = self.conn.execute(select(t.mcp_tool_pins).where(c.agent_id == agent_id).order_by(c.tool)).all()
        return [_pin(r) for r in rows]

    def tool_pin(self, agent_id: str, tool: str) -> ToolPin | None:
        c = t.mcp_tool_pins.c
        row = self.conn.execute(select(t.mcp_tool_pins).where(c.agent_id == agent_id, c.tool == tool)).first()
        return _pin(row) if row is not None else None

    def put_tool_offer(self, agent_id: str, tool: str, upstream: str | None, sha256: str | None,
                       definition: dict[str, Any] | None, now: datetime, *, exists: bool) -> None:
        """The definition a gateway offers for the tool now (None: no longer offered)."""
        values = {"upstream": upstream, "offered_sha256": sha256, "offered_definition": _dumps(definition),
                  "offered_at": now}
        c = t.mcp_tool_pins.c
        if exists:
            self.w.execute(update(t.mcp_tool_pins).where(c.agent_id == agent_id, c.tool == tool).values(**values))
        else:
            self.w.execute(insert(t.mcp_tool_pins).values(agent_id=agent_id, tool=tool, **values))

    def put_tool_approval(self, agent_id: str, tool: str, approval: ToolApproval) -> None:
        c = t.mcp_tool_pins.c
        self.w.execute(update(t.mcp_tool_pins).where(c.agent_id == agent_id, c.tool == tool).values(
            approved_sha256=approval.sha256, approved_definition=_dumps(approval.definition),
            approved_by=approval.by, approved_credential=approval.credential, approved_via=approval.via,
            approved_at=approval.at,
        ))
