"""Steps: one effect of an agent, addressed by a content-derived id (rebuno-v0 §1, §7.3)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class StepKind(StrEnum):
    TOOL_CALL = "tool_call"
    LLM_CALL = "llm_call"
    LOCAL = "local"


class StepStatus(StrEnum):
    PROPOSED = "proposed"
    ALLOWED = "allowed"
    AWAITING_APPROVAL = "awaiting_approval"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STEP_STATUSES


TERMINAL_STEP_STATUSES = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.DENIED, StepStatus.CANCELLED}
)


class Answer(StrEnum):
    """The word a step call answers with: the `decision` field of the v0 API (rebuno-v0 §2.1).
    Submit answers the first seven, an outcome `recorded`, `replay` or `execution_terminal`."""

    PROCEED = "proceed"
    REPLAY = "replay"
    DENIED = "denied"
    RATE_LIMITED = "rate_limited"
    BLOCKED = "blocked"
    EXECUTION_BLOCKED = "execution_blocked"
    EXECUTION_TERMINAL = "execution_terminal"
    RECORDED = "recorded"


class Idempotency(StrEnum):
    SAFE_TO_RETRY = "safe_to_retry"
    AT_MOST_ONCE = "at_most_once"


INDETERMINATE_ERROR: dict[str, str] = {
    "reason": "indeterminate",
    "message": "outcome unknown: this may already have taken effect. Check the state before continuing.",
}


@dataclass(frozen=True, slots=True)
class Step:
    step_id: str
    execution_id: str
    kind: str
    target: str
    args_hash: str
    occurrence: int
    status: StepStatus
    idempotency: str
    args: Any = None  # decoded JSON
    result: Any = None
    error: Any = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    usage_input: int = 0
    usage_output: int = 0
