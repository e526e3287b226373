"""The `input` document a Rego bundle sees for one step (regent.md §3 "Input document")."""

from __future__ import annotations

from typing import Any

from kernel.domain.decision import PolicyInput

__all__ = ["input_document", "rego_time"]


def rego_time(now: str) -> str:
    """``now`` as rego-cpp's time built-ins read it: RFC 3339 with a numeric offset.

    rego-cpp 1.5.2's `time.parse_rfc3339_ns` and `time.parse_ns` (RFC 3339 layouts) are undefined
    for a time ending in `Z` (or `z`), and for a lowercase `t`, and parse `+00:00`; the kernel's
    clock writes `Z` (Rebuno's JSON timestamps). The instant is the same.
    """
    if isinstance(now, str) and len(now) > 11 and now[-1] in "Zz":
        now = now[:-1] + "+00:00"
        if now[10] == "t":
            now = now[:10] + "T" + now[11:]
    return now


def input_document(inp: PolicyInput) -> dict[str, Any]:
    execution = dict(inp.execution)
    created = execution.get("created_at")
    if isinstance(created, str):
        execution["created_at"] = rego_time(created)  # an execution's age is now minus this
    return {
        "agent_id": inp.agent_id,
        "kind": inp.kind,
        "target": inp.target,
        "args": inp.args,
        "idempotency": inp.idempotency,
        "execution": execution,
        "usage": dict(inp.usage),
        "now": rego_time(inp.now),
        "session": inp.session,
    }
