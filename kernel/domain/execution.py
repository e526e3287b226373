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
    # Sessions (one running execution per session; the rest wait `pending`), the tree of
    # sub-agents and forks (docs/architecture.md, "Sessions, sub-agents and forks").
    session: str | None = None
    parent_execution_id: str | None = None  # the execution this one is a child of
    spawned_step_id: str | None = None  # the parent's step whose outcome this child records
    previous_execution_id: str | None = None  # the session turn this one continues (set at start)
    state: Any = None  # what the agent completed with for the next turn (opaque JSON)
    forked_from: str | None = None
    fork_seq: int = 0
    fork_bundle_id: int | None = None  # the fork's own policy bundle (fork_bundles row)
    suspended: bool = False  # waiting for its children, holding no dispatch
    # A fork's resources at its fork point: {key: {covered, checkpoint_ref?, generation?}} (docs/api.md).
    restoration: dict[str, Any] | None = None
