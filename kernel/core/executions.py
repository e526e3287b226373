"""Execution use cases: create, read, list, cancel, and the agent's heartbeat/complete/fail."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kernel.core import events as ev
from kernel.core.kernel import Kernel
from kernel.core.leases import require_live_lease
from kernel.core.lifecycle import Canceller, cancel_in_tx, load_owned, owned, with_ancestors
from kernel.core.sessions import ended, start_or_queue
from kernel.core.store_ports import SessionStore, Transaction
from kernel.domain import (
    Event,
    EventType,
    Execution,
    ExecutionStatus,
    Lease,
)
from kernel.errors import Conflict, ExecutionTerminal, NotFound, Overloaded, StoreConflict
from kernel.ids import new_uuid7


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a new execution sits: its session, and its parent in the sub-agent tree."""

    session: str | None = None
    parent_execution_id: str | None = None
    spawned_step_id: str | None = None  # the parent's step this child's outcome is recorded on


def admit(k: Kernel) -> None:
    """Admission control for creates: 503 `overloaded` with Retry-After while the undelivered
    backlog is at REGENT_MAX_BACKLOG (docs/api.md). The count is cached for `k.backlog_ttl`."""
    if k.max_backlog <= 0:
        return
    gauge, now = k.backlog, time.monotonic()
    if now - gauge.read_at >= k.backlog_ttl:
        with k.store.read() as tx:
            gauge.value = tx.count_undelivered()
        gauge.read_at = now
    if gauge.value >= k.max_backlog:
        raise Overloaded(f"overloaded: {gauge.value} executions wait for delivery (bound {k.max_backlog}); "
                         "retry later", retry_after=1)


def create_execution(
    k: Kernel, agent_id: str, input: Any, idempotency_key: str | None = None, lineage: Lineage | None = None,
    created_by: str | None = None,
) -> tuple[Execution, bool]:
    """Create an execution: running and enqueued, or `pending` when its session is busy. A
    repeated idempotency key returns the first one. `created_by`: the creating credential (an API
    key's id, "bootstrap" or "dev"), recorded so that key cannot approve the execution's steps."""
    admit(k)
    now = k.clock.now()
    lin = lineage or Lineage()
    try:
        # A child spawned by a parent's step takes the parent's lock: two creates for one step serialise.
        lock = lin.parent_execution_id if lin.spawned_step_id is not None else None
        with k.store.transaction(session=lin.session, lock=lock) as tx:
            if tx.get_agent(agent_id) is None:
                raise NotFound(f"agent {agent_id!r} not found")
            if idempotency_key is not None:
                existing = tx.find_execution_by_key(agent_id, idempotency_key)
                if existing is not None:
                    return existing, False
            if lin.parent_execution_id is not None:
                _check_parent(tx, lin)
                twin = _spawned_by_step(tx, lin, agent_id)
                if twin is not None:
                    return twin, False
            deadline = now + timedelta(seconds=k.deadline_timeout) if k.deadline_timeout else None
            e = Execution(
                id=new_uuid7(), agent_id=agent_id, input=input, status=ExecutionStatus.RUNNING,
                created_at=now, updated_at=now, deadline_at=deadline, idempotency_key=idempotency_key,
                session=lin.session, parent_execution_id=lin.parent_execution_id,
                spawned_step_id=lin.spawned_step_id,
                created_by=created_by,
            )
            return start_or_queue(k, tx, e, now), True
    except StoreConflict:
        if idempotency_key is None:
            raise
        with k.store.read() as tx:  # a concurrent create with the same key won the race
            existing = tx.find_execution_by_key(agent_id, idempotency_key)
        if existing is None:
            raise
        return existing, False


def _spawned_by_step(tx: SessionStore, lin: Lineage, agent_id: str) -> Execution | None:
    """The child a parent's step already spawned. A parent whose dispatch was lost while it waited
    reruns the spawning tool body (a safe_to_retry step runs again) and asks for the child again:
    it gets the same one, not a second run of the sub-agent."""
    if lin.spawned_step_id is None:
        return None
    twin = next((c for c in tx.children(lin.parent_execution_id or "") if c.spawned_step_id == lin.spawned_step_id),
                None)
    if twin is not None and twin.agent_id != agent_id:
        raise Conflict(f"conflict: step {lin.spawned_step_id} already spawned a child of agent {twin.agent_id!r}")
    return twin


def _check_parent(tx: Transaction, lin: Lineage) -> None:
    parent = tx.get_execution(lin.parent_execution_id or "")
    if parent is None:
        raise NotFound("parent execution not found")
    if parent.status.is_terminal:
        raise ExecutionTerminal("parent execution is terminal")
    if lin.spawned_step_id is not None:
        s = tx.get_step(parent.id, lin.spawned_step_id)
        if s is None or s.execution_id != parent.id:
            raise NotFound("spawning step not found in the parent execution")
    # A live ancestor holds its session until it ends, and it waits for this child: a child queued
    # in that session would wait for it in turn, for ever (docs/api.md, "Sessions and sub-agents").
    if lin.session is None:
        return
    for ancestor in with_ancestors(tx, parent):
        if ancestor.status.is_terminal:
            break
        if ancestor.session == lin.session:
            raise Conflict(f"conflict: session {lin.session!r} is held by an ancestor execution ({ancestor.id}), "
                           "which waits for this child; give the child another session")


def get_execution(k: Kernel, execution_id: str, agent_id: str | None = None) -> Execution:
    with k.store.read() as tx:
        return load_owned(tx, execution_id, agent_id)


def list_executions(
    k: Kernel, agent_id: str | None, status: str | None, cursor: str | None, limit: int,
    session: str | None = None, parent: str | None = None,
) -> tuple[list[Execution], str | None, dict[str, list[str]]]:
    """A page of executions, newest first, with each one's children's ids."""
    with k.store.read() as tx:
        rows = tx.list_executions(agent_id, status, cursor, limit + 1, session=session, parent=parent)
        more = len(rows) > limit
        rows = rows[:limit]
        children = tx.children_ids([e.id for e in rows])
    return rows, (rows[-1].id if more and rows else None), children


def get_execution_tree(k: Kernel, execution_id: str, agent_id: str | None = None) -> tuple[Execution, list[str]]:
    """The execution and its children's ids. An agent may also read its own executions' children."""
    with k.store.read() as tx:
        e = tx.get_execution(execution_id)
        if e is not None and agent_id is not None and e.agent_id != agent_id and e.parent_execution_id:
            parent = tx.get_execution(e.parent_execution_id)
            if parent is not None and parent.agent_id == agent_id:
                return e, tx.children_ids([e.id])[e.id]
        e = owned(e, agent_id)
        return e, tx.children_ids([e.id])[e.id]


def list_events(k: Kernel, execution_id: str, after_seq: int, limit: int) -> list[Event]:
    with k.store.read() as tx:
        load_owned(tx, execution_id, None)
        return tx.list_events(execution_id, after_seq, limit)


def cancel_execution(k: Kernel, execution_id: str, reason: str = "client_cancelled",
                     who: Canceller | None = None) -> None:
    """Cancel, recording who and why; its live children (and theirs) are cancelled after it,
    reason `parent_cancelled`."""
    now = k.clock.now()
    with k.store.transaction(lock=execution_id) as tx:
        e = load_owned(tx, execution_id, None)
        if e.status.is_terminal:
            raise ExecutionTerminal("execution is terminal")
        cancel_in_tx(tx, e, now, reason, who)
    ended(k, dataclasses.replace(e, status=ExecutionStatus.CANCELLED))


def heartbeat(k: Kernel, lease: Lease) -> None:
    now = k.clock.now()
    with k.store.transaction(lock=lease.execution_id) as tx:
        load_owned(tx, lease.execution_id, lease.agent_id)
        require_live_lease(tx, lease, now)


def finish_execution(
    k: Kernel, lease: Lease, *, output: Any = None, error: str | None = None, failed: bool = False, state: Any = None,
) -> None:
    """The agent's handler returned (complete, with the session's next `state`) or raised (fail)."""
    now = k.clock.now()
    execution_id = lease.execution_id
    with k.store.transaction(lock=execution_id) as tx:
        e = load_owned(tx, execution_id, lease.agent_id)
        if e.status.is_terminal:
            raise ExecutionTerminal("execution is terminal")
        require_live_lease(tx, lease, now)
        tx.retire_dispatches(execution_id, now)
        if failed:
            status = ExecutionStatus.FAILED
            tx.append(execution_id, now,
                      [ev.execution(EventType.EXECUTION_FAILED, e.id, ExecutionStatus.FAILED, reason=error or None)],
                      status=ExecutionStatus.FAILED, failure_reason=error or None)
        else:
            status = ExecutionStatus.COMPLETED
            values: dict[str, Any] = {"state": state} if state is not None else {}
            tx.append(execution_id, now,
                      [ev.execution(EventType.EXECUTION_COMPLETED, e.id, ExecutionStatus.COMPLETED, output=output)],
                      status=ExecutionStatus.COMPLETED, output=output, **values)
    ended(k, dataclasses.replace(e, status=status, output=output))
