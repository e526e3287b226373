"""Dispatch rows: deliveries of an execution to its agent, with leases (rebuno-v0 §6)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class DispatchStatus(StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    FAILED = "failed"
    EXHAUSTED = "exhausted"


@dataclass(frozen=True, slots=True)
class Dispatch:
    id: str
    execution_id: str
    status: DispatchStatus
    attempt: int
    max_attempts: int
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    locked_by: str | None = None
    locked_at: datetime | None = None
