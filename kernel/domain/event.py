"""The closed event taxonomy: `<entity>.<past participle>` (rebuno-v0 §7.7)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class EventType(StrEnum):
    EXECUTION_CREATED = "execution.created"
    EXECUTION_STARTED = "execution.started"
    EXECUTION_BLOCKED = "execution.blocked"
    EXECUTION_RESUMED = "execution.resumed"
    EXECUTION_COMPLETED = "execution.completed"
    EXECUTION_FAILED = "execution.failed"
    EXECUTION_CANCELLED = "execution.cancelled"
    EXECUTION_SUSPENDED = "execution.suspended"
    EXECUTION_FORKED = "execution.forked"
    STEP_PROPOSED = "step.proposed"
    STEP_ALLOWED = "step.allowed"
    STEP_DENIED = "step.denied"
    STEP_AWAITING_APPROVAL = "step.awaiting_approval"
    STEP_RATE_LIMITED = "step.rate_limited"
    STEP_EXECUTING = "step.executing"
    STEP_SUCCEEDED = "step.succeeded"
    STEP_FAILED = "step.failed"
    STEP_CANCELLED = "step.cancelled"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_GRANTED = "approval.granted"
    APPROVAL_DENIED = "approval.denied"
    APPROVAL_EXPIRED = "approval.expired"
    APPROVAL_CANCELLED = "approval.cancelled"  # its execution was cancelled (Regent; Rebuno says expired)
    DISPATCH_QUEUED = "dispatch.queued"
    DISPATCH_ACKED = "dispatch.acked"
    DISPATCH_FAILED = "dispatch.failed"
    DISPATCH_DISCARDED = "dispatch.discarded"
    RESOURCE_REGISTERED = "resource.registered"
    RESOURCE_BOUND = "resource.bound"
    RESOURCE_CHECKPOINTED = "resource.checkpointed"
    RESOURCE_CAPTURE_FAILED = "resource.capture_failed"


DECISION_EVENTS = frozenset(
    {
        EventType.STEP_ALLOWED,
        EventType.STEP_DENIED,
        EventType.STEP_AWAITING_APPROVAL,
        EventType.STEP_RATE_LIMITED,
    }
)


@dataclass(frozen=True, slots=True)
class Event:
    execution_id: str
    event_seq: int
    type: str
    payload: dict[str, Any]
    occurred_at: datetime
