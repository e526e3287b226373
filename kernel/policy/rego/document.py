"""The `input` document a Rego bundle sees for one step (regent.md §3 "Input document")."""

from __future__ import annotations

from typing import Any

from kernel.domain.decision import PolicyInput

__all__ = ["input_document"]


def input_document(inp: PolicyInput) -> dict[str, Any]:
    return {
        "agent_id": inp.agent_id,
        "kind": inp.kind,
        "target": inp.target,
        "args": inp.args,
        "idempotency": inp.idempotency,
        "execution": dict(inp.execution),
        "usage": dict(inp.usage),
        "now": inp.now,
        "session": inp.session,
    }
