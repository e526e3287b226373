"""The policy audit trail's event types: who changed which bundle decides, the shadow beside it,
and which MCP tool definitions were approved."""

from __future__ import annotations

from enum import StrEnum


class PolicyEventType(StrEnum):
    ACTIVATED = "policy.activated"  # a revision became the agent's active bundle
    CLEARED = "policy.cleared"  # the agent's active bundle was removed (permissive)
    PROMOTED = "policy.promoted"  # the shadow bundle became the active one
    ROLLED_BACK = "policy.rolled_back"  # the previous active revision came back
    SHADOW_SET = "policy.shadow_set"  # a shadow bundle was set beside the active one
    SHADOW_CLEARED = "policy.shadow_cleared"  # the shadow bundle was removed
    TOOL_APPROVED = "mcp.tool_approved"  # an MCP tool's definition was approved (pinned; docs/mcp.md)

    @property
    def changes_active(self) -> bool:
        """Does this event change which revision is active (what a rollback reads back)?"""
        return self in _ACTIVATING


_ACTIVATING = frozenset({PolicyEventType.ACTIVATED, PolicyEventType.CLEARED, PolicyEventType.PROMOTED,
                         PolicyEventType.ROLLED_BACK})
# The stored names of the events that change which revision is active (rollback reads them back).
ACTIVATIONS: tuple[str, ...] = tuple(e.value for e in PolicyEventType if e.changes_active)
