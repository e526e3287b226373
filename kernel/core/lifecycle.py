"""One execution's record under its lock: the owner check every route makes, its line of ancestors
in the sub-agent tree, and a cancel without its cascade (`kernel.core.sessions` walks the tree
down; `kernel.core.executions` and the deadline sweep call the cancel)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime

from kernel.core import events as ev
from kernel.core.kernel import Kernel
from kernel.core.store_ports import ExecutionStore
from kernel.domain import ApprovalStatus, EventType, Execution, ExecutionStatus, StepStatus
from kernel.errors import Forbidden, NotFound
from kernel.store import Tx

CANCELLED_ERROR = {"reason": "execution_cancelled"}
MAX_ANCESTORS = 100  # how far up the sub-agent tree a walk goes (a bound, whatever the store holds)


def load_owned(tx: ExecutionStore, execution_id: str, agent_id: str | None) -> Execution:
    """The execution, checked to belong to the calling agent (None = a client principal)."""
    return owned(tx.get_execution(execution_id), agent_id)


def owned(e: Execution | None, agent_id: str | None) -> Execution:
    """`e` if it exists and belongs to the calling agent (None = a client principal)."""
    if e is None:
        raise NotFound("execution not found")
    if agent_id is not None and e.agent_id != agent_id:
        raise Forbidden("forbidden: execution belongs to another agent")
    return e


def with_ancestors(tx: ExecutionStore, e: Execution) -> Iterator[Execution]:
    """`e`, then its parent, its parent's parent… up to MAX_ANCESTORS executions in all."""
    at: Execution | None = e
    for _ in range(MAX_ANCESTORS):
        if at is None:
            return
        yield at
        at = tx.get_execution(at.parent_execution_id) if at.parent_execution_id else None


def cancel_one(k: Kernel, execution_id: str, reason: str) -> Execution | None:
    """Cancel one execution if it is still live (no cascade; the caller walks the tree)."""
    now = k.clock.now()
    with k.store.transaction(lock=execution_id) as tx:
        e = tx.get_execution(execution_id)
        if e is None or e.status.is_terminal:
            return None
        cancel_in_tx(tx, e, now, reason)
    return dataclasses.replace(e, status=ExecutionStatus.CANCELLED)


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
    tx.append(e.id, now, out, status=ExecutionStatus.CANCELLED, failure_reason=reason, suspended=False)
