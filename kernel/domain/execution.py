"""Executions and their status machine (rebuno-v0 §7.3)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class ExecutionStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class Execution:
    id: str
    agent_id: str
    input: Any  # decoded JSON
    status: ExecutionStatus
    created_at: datetime
    updated_at: datetime
    output: Any = None
    failure_reason: str | None = None
    deadline_at: datetime | None = None
    idempotency_key: str | None = None
    # The token meter (sum of its steps' recorded usage), read with the row so a budget check
    # costs no extra query.
    usage_input: int = 0
    usage_output: int = 0
    # The credential that created it: an API key's id, "bootstrap" or "dev" (docs/audit.md).
    created_by: str | None = None
