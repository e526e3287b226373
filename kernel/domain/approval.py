"""Human approvals of a step (rebuno-v0 §5)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

# Arguments longer than this (characters of their canonical JSON) are shown as a prefix of that
# text with `args_truncated` set, so an approval record stays small whatever the step carried.
APPROVAL_ARGS_MAX_CHARS = 16 * 1024


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    # Ended because its execution was cancelled (rebuno-v0 §7.4 marks it `expired`; Regent says
    # what happened, docs/api.md).
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    step_id: str
    execution_id: str
    status: ApprovalStatus
    approvers: list[str]  # empty: anyone may decide
    message: str | None
    timeout_at: datetime
    created_at: datetime
    decided_by: str | None = None
    asserted_by: str | None = None
    decided_at: datetime | None = None
    rationale: str | None = None
    # The context an approver decides on (docs/audit.md): which agent and step asked, under which
    # rule and bundle, with the step's arguments as recorded (capped, see APPROVAL_ARGS_MAX_CHARS).
    agent_id: str | None = None
    kind: str | None = None
    target: str | None = None
    rule_id: str | None = None
    reason: str | None = None
    policy_hash: str | None = None
    policy_kind: str | None = None  # yaml | rego | none, as on the decision that asked
    policy_revision: str | None = None
    args: Any = None
    args_truncated: bool = False
    args_chars: int = 0  # length of the recorded canonical JSON text of the arguments
    credential: str | None = None  # how the decider was identified: key | bootstrap | dev
