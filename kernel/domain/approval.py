"""Human approvals of a step (rebuno-v0 §5)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    step_id: str
    execution_id: str
    status: ApprovalStatus
    approvers: list[str] | None
    message: str | None
    timeout_at: datetime
    created_at: datetime
    decided_by: str | None = None
    asserted_by: str | None = None
    decided_at: datetime | None = None
    rationale: str | None = None
