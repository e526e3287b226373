"""Pinned MCP tool definitions: a tool's definition hash, and its state against the approved one."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

# Bounds on what an upstream may make the kernel keep: its names and descriptions are hostile.
MAX_TOOL_NAME = 200  # characters of a namespaced tool name (the store's column)
MAX_DEFINITION_BYTES = 64 * 1024  # one definition's canonical JSON; a larger one is never offered
MAX_TOOLS_PER_REPORT = 1000


class ToolState(StrEnum):
    APPROVED = "approved"  # offered with the approved definition: listed and callable
    CHANGED = "changed"  # offered with another definition than the approved one: refused
    NEW = "new"  # never approved: held back
    GONE = "gone"  # approved once, not offered by the gateway's last report


def canonical_definition(name: str, description: str | None, input_schema: Any) -> str:
    """The canonical JSON of {name, description, inputSchema} (the upstream's bare name)."""
    return json.dumps({"name": name, "description": description or "", "inputSchema": input_schema},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def definition_hash(name: str, description: str | None, input_schema: Any) -> str:
    """sha256 of `canonical_definition`: what an approval pins."""
    # surrogatepass: an upstream's JSON may carry lone surrogates ("\ud800"), which UTF-8 cannot.
    text = canonical_definition(name, description, input_schema)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolApproval:
    """Who approved a definition, how (`api`, `cli`, `console`, `manifest`, `trust_new_tools`), when."""

    sha256: str
    by: str | None
    credential: str
    via: str
    at: datetime
    definition: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolPin:
    """One agent's MCP tool as the kernel holds it: the definition last offered, the one approved."""

    agent_id: str
    tool: str  # namespaced: `{prefix}_{name}`
    upstream: str | None = None
    offered_sha256: str | None = None
    offered_definition: dict[str, Any] | None = None
    offered_at: datetime | None = None
    approved: ToolApproval | None = None

    @property
    def state(self) -> ToolState:
        if self.offered_sha256 is None:
            return ToolState.GONE
        if self.approved is None:
            return ToolState.NEW
        return ToolState.APPROVED if self.approved.sha256 == self.offered_sha256 else ToolState.CHANGED
