"""Execution use cases: create, read, list, cancel, and the agent's heartbeat/complete/fail."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from kernel.core import events as ev
from kernel.core.dispatch import enqueue, require_live_lease
from kernel.core.kernel import Kernel
from kernel.domain import (
    ApprovalStatus,
    Event,
    EventType,
    Execution,
    ExecutionStatus,
    StepStatus,
)
from kernel.errors import ExecutionTerminal, Forbidden, NotFound
from kernel.identity import new_uuid7
from kernel.store import Tx

CANCELLED_ERROR = {"reason": "execution_cancelled"}


def create_execution(k: Kernel, agent_id: str, input: Any, idempotency_key: str | None = None) -> tuple[Execution, bool]:
    """Create and enqueue an execution. A repeated idempotency key returns the first one."""
    now = k.clock.now()
    try:
        with k.store.transaction() as tx:
            if tx.get_agent(agent_id) is None:
                raise NotFound(f"agent {agent_id!r} not found")
            if idempotency_key is not None:
                existing = tx.find_execution_by_key(agent_id, idempotency_key)
                if existing is not None:
                    return existing, False
            deadline = now + timedelta(seconds=k.deadline_timeout) if k.deadline_timeout else None
            e = Execution(
                id=new_uuid7(), agent_id=agent_id, input=input, status=ExecutionStatus.RUNNING,
                created_at=now, updated_at=now, deadline_at=deadline, idempotency_key=idempotency_key,
            )
            tx.insert_execution(e)
            _, queued = enqueue(k, tx, e.id, now)
            dl = deadline.isoformat() if deadline else None
            tx.append(e.id, now, [
                ev.execution(EventType.EXECUTION_CREATED, e.id, ExecutionStatus.PENDING, deadline_at=dl),
                ev.execution(EventType.EXECUTION_STARTED, e.id, ExecutionStatus.RUNNING, deadline_at=dl),
                queued,
            ])
            return e, True
    except IntegrityError:
        if idempotency_key is None:
            raise
        with k.store.read() as tx:  # a concurrent create with the same key won the race
            existing = tx.find_execution_by_key(agent_id, idempotency_key)
        if existing is None:
            raise
        return existing, False


def get_execution(k: Kernel, execution_id: str, agent_id: str | None = None) -> Execution:
    with k.store.read() as tx:
        return load_owned(tx, execution_id, agent_id)


def load_owned(tx: Tx, execution_id: str, agent_id: str | None) -> Execution:
    """The execution, checked to belong to the calling agent (None = a client principal)."""
    return owned(tx.get_execution(execution_id), agent_id)


def owned(e: Execution | None, agent_id: str | None) -> Execution:
    """`e` if it exists and belongs to the calling agent (None = a client principal)."""
    if e is None:
        raise NotFound("execution not found")
    if agent_id is not None and e.agent_id != agent_id:
        raise Forbidden("forbidden: execution belongs to another agent")
    return e


def list_executions(k: Kernel, agent_id: str | None, status: str | None, cursor: str | None, limit: int) -> tuple[list[Execution], str | None]:
    with k.store.read() as tx:
        rows = tx.list_executions(agent_id, status, cursor, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)


def list_events(k: Kernel, execution_id: str, after_seq: int, limit: int) -> list[Event]:
    with k.store.read() as tx:
        load_owned(tx, execution_id, None)
        return tx.list_events(execution_id, after_seq, limit)


def cancel_execution(k: Kernel, execution_id: str, reason: str = "client_cancelled") -> None:
    now = k.clock.now()
    with k.store.transaction(lock=execution_id) as tx:
        e = load_owned(tx, execution_id, None)
        if e.status.is_terminal:
            raise ExecutionTerminal("execution is terminal")
        cancel_in_tx(tx, e, now, reason)


def cancel_in_tx(tx: Tx, e: Execution, now: datetime, reason: str) -> None:
    """Cancel under the lock: pending approvals expire, executing steps are cancelled."""
    tx.retire_dispatches(e.id, now)
    out: list[ev.Ev] = [ev.execution(EventType.EXECUTION_CANCELLED, e.id, ExecutionStatus.CANCELLED, reason=reason)]
    for a in tx.list_approvals("pending", execution_id=e.id):
        tx.set_approval(a.id, status=ApprovalStatus.EXPIRED, decided_at=now, rationale="execution_cancelled")
        step = tx.get_step(a.step_id)
        kind, target = (step.kind, step.target) if step else ("", None)
        tx.update_step(a.step_id, status=StepStatus.DENIED, error=CANCELLED_ERROR, completed_at=now)
        out.append(ev.approval(EventType.APPROVAL_EXPIRED, a, "expired", rationale="execution_cancelled"))
        out.append(ev.step(EventType.STEP_DENIED, a.step_id, kind, target, error=CANCELLED_ERROR))
    for s in tx.steps_in_status(e.id, StepStatus.EXECUTING):
        tx.update_step(s.step_id, status=StepStatus.CANCELLED, error=CANCELLED_ERROR, completed_at=now)
        out.append(ev.step(EventType.STEP_CANCELLED, s.step_id, s.kind, s.target, error=CANCELLED_ERROR))
    tx.append(e.id, now, out, status=ExecutionStatus.CANCELLED, failure_reason=reason)


def heartbeat(k: Kernel, agent_id: str, execution_id: str, dispatch_id: str, attempt: int) -> None:
    now = k.clock.now()
    with k.store.transaction(lock=execution_id) as tx:
        load_owned(tx, execution_id, agent_id)
        require_live_lease(tx, execution_id, dispatch_id, attempt, now)


def finish_execution(
    k: Kernel, agent_id: str, execution_id: str, dispatch_id: str, attempt: int,
    *, output: Any = None, error: str | None = None, failed: bool = False,
) -> None:
    """The agent's handler returned (complete) or raised (fail)."""
    now = k.clock.now()
    with k.store.transaction(lock=execution_id) as tx:
        e = load_owned(tx, execution_id, agent_id)
        if e.status.is_terminal:
            raise ExecutionTerminal("execution is terminal")
        require_live_lease(tx, execution_id, dispatch_id, attempt, now)
        tx.retire_dispatches(execution_id, now)
        if failed:
            tx.append(execution_id, now,
                      [ev.execution(EventType.EXECUTION_FAILED, e.id, ExecutionStatus.FAILED, reason=error or None)],
                      status=ExecutionStatus.FAILED, failure_reason=error or None)
        else:
            tx.append(execution_id, now,
                      [ev.execution(EventType.EXECUTION_COMPLETED, e.id, ExecutionStatus.COMPLETED, output=output)],
                      status=ExecutionStatus.COMPLETED, output=output)
