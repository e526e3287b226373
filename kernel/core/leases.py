"""Dispatch rows as other use cases touch them inside their own transactions: enqueue one, renew
or check the live attempt's lease, park an execution until a rate limit refills (rebuno-v0 §6).

Claiming, delivery verdicts and lease reaping are `kernel.core.dispatch`'s; these primitives sit
below it and below sessions, executions and steps, which all call them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from kernel.core import events as ev
from kernel.core.kernel import Kernel
from kernel.core.store_ports import DispatchStore
from kernel.domain import Dispatch, DispatchStatus, EventType, Lease
from kernel.errors import LeaseSuperseded
from kernel.ids import new_uuid7


def enqueue(k: Kernel, tx: DispatchStore, execution_id: str, now: datetime, due: datetime | None = None) -> tuple[Dispatch, ev.Ev]:
    """Insert a pending dispatch; the caller appends the returned `dispatch.queued` event."""
    d = Dispatch(
        id=new_uuid7(),
        execution_id=execution_id,
        status=DispatchStatus.PENDING,
        attempt=0,
        max_attempts=k.dispatch_max_attempts,
        next_attempt_at=due or now,
        created_at=now,
        updated_at=now,
    )
    tx.insert_dispatch(d)
    extra = {"next_attempt_at": due.isoformat()} if due and due > now else {}
    return d, ev.dispatch(EventType.DISPATCH_QUEUED, d.id, execution_id, "pending", 0, **extra)


def require_live_lease(tx: DispatchStore, lease: Lease, now: datetime) -> None:
    """Renew the lease of the live attempt, or raise 409 lease_superseded."""
    if not tx.renew_lease(lease.dispatch_id, lease.execution_id, lease.attempt, now):
        raise LeaseSuperseded()


def check_attempt(d: Dispatch | None, lease: Lease) -> None:
    """Recording a step outcome checks the attempt only (its status does not matter)."""
    if d is None or d.execution_id != lease.execution_id or d.attempt != lease.attempt:
        raise LeaseSuperseded()


def park_until(k: Kernel, tx: DispatchStore, execution_id: str, now: datetime, wait_seconds: float) -> ev.Ev:
    """Rate-limit park: retire every dispatch, enqueue one due after the wait."""
    tx.retire_dispatches(execution_id, now)
    _, queued = enqueue(k, tx, execution_id, now, due=now + timedelta(seconds=wait_seconds))
    return queued
