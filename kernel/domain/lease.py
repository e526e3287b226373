"""A lease: the live attempt of a dispatch an agent holds on an execution (rebuno-v0 §6)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lease:
    """Who calls (`agent_id`), on which execution, under which dispatch attempt (the
    `Rebuno-Dispatch-Id` and `Rebuno-Dispatch-Attempt` headers). Every agent call that changes
    an execution carries one; a use case checks it against the dispatch row under the lock."""

    agent_id: str
    execution_id: str
    dispatch_id: str
    attempt: int
