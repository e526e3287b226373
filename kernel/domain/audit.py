"""The durable decision record: who or what decided a step, under which bundle (docs/audit.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class DecisionOutcome(StrEnum):
    """What a decision record says happened; one per decision event type."""

    ALLOWED = "allowed"  # step.allowed by policy
    DENIED = "denied"  # step.denied by policy
    AWAITING_APPROVAL = "awaiting_approval"  # step.awaiting_approval
    RATE_LIMITED = "rate_limited"  # step.rate_limited (refused or parked to wait)
    APPROVAL_GRANTED = "approval_granted"  # approval.granted by a person
    APPROVAL_DENIED = "approval_denied"  # approval.denied by a person
    APPROVAL_EXPIRED = "approval_expired"  # approval.expired by the sweep


class Credential(StrEnum):
    """How the caller behind a decision proved who it was."""

    KEY = "key"  # a scoped API key: the decider is the key's name
    BOOTSTRAP = "bootstrap"  # the shared bearer token: the decider is only asserted
    DEV = "dev"  # `regent dev` without a token


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One row of the decisions table, written in the transaction of its event and kept after the
    execution is deleted (its own retention). `event_seq` is the decision event's seq in the
    execution's log while that log exists."""

    id: str  # UUIDv7
    agent_id: str
    execution_id: str
    step_id: str | None
    kind: str
    target: str
    decision: DecisionOutcome
    rule_id: str
    decided_at: datetime
    reason: str | None = None
    policy_kind: str = ""
    policy_revision: str = ""
    policy_hash: str = ""
    decided_by: str | None = None
    credential: str | None = None
    event_seq: int | None = None
    judge: dict[str, Any] | None = None  # a judge rule's record (what was asked, the answer, latency)


@dataclass(frozen=True, slots=True)
class DecisionAt:
    """A decision record and the event it records, for the write of a batch of events: the record
    takes that event's seq. `event` is one of the batch's events (the same object), so the writer
    names the event, not its position in the batch."""

    event: tuple[str, dict[str, Any]]
    record: DecisionRecord
