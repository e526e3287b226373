"""Creating executions in the core, on SQLite and PostgreSQL: a repeated idempotency key that loses
the race to a concurrent create gets the winner's execution, through the store's StoreConflict."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.core import executions
from kernel.domain import Execution
from kernel.store import Tx
from tests.conftest import Running


def test_a_create_that_loses_the_idempotency_race_returns_the_winners_execution(
    running: Running, monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = running.kernel
    first, created = executions.create_execution(k, "shell", {"n": 1}, idempotency_key="race-1")
    assert created
    # The second create's lookup misses the first (as when the first commits just after it read):
    # its insert then breaks the (agent, key) unique constraint, and the store says StoreConflict.
    lookup = Tx.find_execution_by_key
    misses = [None]

    def racing_lookup(tx: Any, agent_id: str, key: str) -> Execution | None:
        if misses:
            return misses.pop()
        return lookup(tx, agent_id, key)

    monkeypatch.setattr(Tx, "find_execution_by_key", racing_lookup)
    again, created = executions.create_execution(k, "shell", {"n": 2}, idempotency_key="race-1")
    assert not created and not misses
    assert again.id == first.id and again.input == {"n": 1}
