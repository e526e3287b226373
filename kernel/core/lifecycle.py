"""One execution's record under its lock: the owner check every route makes, its line of ancestors
in the sub-agent tree, and a cancel without its cascade (`kernel.core.sessions` walks the tree
down; `kernel.core.executions` and the deadline sweep call the cancel)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from kernel.core import events as ev
from kernel.core.kernel import Kernel
from kernel.core.store_ports import ExecutionStore, Transaction
from kernel.domain import ApprovalStatus, EventType, Execution, ExecutionStatus, StepStatus
from kernel.errors import Forbidden, NotFound, invalid

CANCELLED_ERROR = {"reason": "execution_cancelled"}
CANCELLED_RATIONALE = "execution_cancelled"  # an approval's rationale when its execution was cancelled
MAX_ANCESTORS = 100  # how far up the sub-agent tree a walk goes (a bound, whatever the store holds)


@dataclass(frozen=True, slots=True)
class Canceller:
    """Who cancelled an execution and why (docs/audit.md): `by` is the API key's name, or
    `bootstrap` for the shared token and anonymous dev access (`credential` tells them apart).
    The kernel's own cancels (deadline, a parent's cascade) have none."""

    by: str
    credential: str
    rationale: str | None = None


MAX_RATIONALE_CHARS = 2000  # a cancel's why is a sentence or two; the event log is not a document store


def check_rationale(text: str | None) -> str | None:
    """A cancel's why as recorded: trimmed, None when blank; ValidationError past the bound."""
    text = (text or "").strip()
    if len(text) > MAX_RATIONALE_CHARS:
        raise invalid(f"rationale is over {MAX_RATIONALE_CHARS} characters")
    return text or None


@dataclass(frozen=True, slots=True)
class CancelScope:
    """What a cancel of the execution would end, for a confirmation to name."""

    execution: Execution
    pending_approvals: int
    executing_steps: int


def cancel_scope(k: Kernel, execution_id: str) -> CancelScope:
    with k.store.read() as tx:
        e = load_owned(tx, execution_id, None)
        return CancelScope(e, len(tx.list_approvals("pending", execution_id=e.id)),
                           len(tx.steps_in_status(e.id, StepStatus.EXECUTING)))


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


def cancel_in_tx(tx: Transaction, e: Execution, now: datetime, reason: str, who: Canceller | None = None) -> None:
    """Cancel under the lock: pending approvals end `cancelled` (by whoever cancelled), executing
    steps are cancelled. `execution.cancelled` names who and why when a person cancelled."""
    tx.retire_dispatches(e.id, now)
    by = {"cancelled_by": who.by, "credential": who.credential, "rationale": who.rationale} if who else {}
    out: list[ev.Ev] = [ev.execution(EventType.EXECUTION_CANCELLED, e.id, ExecutionStatus.CANCELLED, reason=reason,
                                     **by)]
    decider = {"decided_by": who.by, "credential": who.credential} if who else {}
    for a in tx.list_approvals("pending", execution_id=e.id):
        tx.set_approval(a.id, status=ApprovalStatus.CANCELLED, decided_at=now, rationale=CANCELLED_RATIONALE,
                        **decider)
        step = tx.get_step(a.execution_id, a.step_id)
        kind, target = (step.kind, step.target) if step else ("", None)
        tx.update_step(a.execution_id, a.step_id, status=StepStatus.DENIED, error=CANCELLED_ERROR, completed_at=now)
        out.append(ev.approval(EventType.APPROVAL_CANCELLED, a, ApprovalStatus.CANCELLED.value,
                               rationale=CANCELLED_RATIONALE, **decider))
        out.append(ev.step(EventType.STEP_DENIED, a.step_id, kind, target, error=CANCELLED_ERROR,
                           **ev.asked_fields(a)))
    for s in tx.steps_in_status(e.id, StepStatus.EXECUTING):
        tx.update_step(s.execution_id, s.step_id, status=StepStatus.CANCELLED, error=CANCELLED_ERROR, completed_at=now)
        out.append(ev.step(EventType.STEP_CANCELLED, s.step_id, s.kind, s.target, error=CANCELLED_ERROR))
    tx.append(e.id, now, out, status=ExecutionStatus.CANCELLED, failure_reason=reason, suspended=False)
