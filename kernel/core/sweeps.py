"""Singleton sweeps (rebuno-v0 §5.4, §7.5): deadlines, approval expiry, retention. Each pass runs
only on the replica holding the leader lock; the others skip it and return None."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta

from kernel.core.approvals import expire_approvals
from kernel.core.audit import delete_expired_decisions, flush_decision_journal, roll_up_recent
from kernel.core.executions import cancel_in_tx
from kernel.core.kernel import Kernel
from kernel.core.retention import delete_in_batches
from kernel.core.sessions import ended, repair
from kernel.core.shadow import delete_expired_disagreements
from kernel.domain import ExecutionStatus

DEADLINE_REASON = "deadline_exceeded"
_MAX_BATCHES = 100  # bounded: a pass handles at most this many batches; the next tick goes on


@dataclass(frozen=True, slots=True)
class CleanupResult:
    approvals_expired: int = 0
    executions_deleted: int = 0
    deadlines_cancelled: int = 0
    decisions_deleted: int = 0
    disagreements_deleted: int = 0  # shadow disagreement rows past REGENT_SHADOW_RETENTION
    sessions_repaired: int = 0  # stalled sessions admitted, ready suspended parents resumed
    # hours of decision counts rolled up for the audit chart (bookkeeping, not compared)
    decision_hours_rolled_up: int = field(default=0, compare=False)


def cancel_past_deadlines(k: Kernel, batch: int = 100) -> int:
    """Cancel every non-terminal execution whose `deadline_at` has passed (reason
    `deadline_exceeded`), through the client cancel path. Not leader-gated; see `deadline_sweep`."""
    now = k.clock.now()
    total = 0
    for _ in range(_MAX_BATCHES):
        with k.store.read() as tx:
            ids = tx.execution_ids_past_deadline(now, batch)
        done = 0
        for eid in ids:
            with k.store.transaction(lock=eid) as tx:
                e = tx.get_execution(eid)  # re-read under the lock: it may have finished meanwhile
                if e is None or e.status.is_terminal or e.deadline_at is None or e.deadline_at > now:
                    continue
                cancel_in_tx(tx, e, now, DEADLINE_REASON)
                done += 1
            ended(k, dataclasses.replace(e, status=ExecutionStatus.CANCELLED))
        total += done
        if len(ids) < batch or done == 0:
            break
    return total


def expire_due_approvals(k: Kernel, batch: int = 100) -> int:
    """Expire pending approvals past their timeout, in bounded batches."""
    total = 0
    for _ in range(_MAX_BATCHES):
        n = expire_approvals(k, batch)
        total += n
        if n < batch:
            break
    return total


def delete_expired_executions(k: Kernel, batch: int = 200) -> int:
    """Retention: delete terminal executions last updated before now − retention, with their
    events, steps, approvals and dispatches. Live executions are never deleted, however old."""
    if k.retention <= 0:
        return 0
    cutoff = k.clock.now() - timedelta(seconds=k.retention)
    return delete_in_batches(k, lambda tx, before, n: tx.delete_terminal_executions_before(before, n), cutoff, batch)


def deadline_sweep(k: Kernel, leader_key: str) -> int | None:
    """The dedicated deadline loop's tick, under `<leader key>:deadlines`."""
    with k.store.leader(f"{leader_key}:deadlines") as leading:
        if not leading:
            return None
        return cancel_past_deadlines(k)


def decision_journal_sweep(k: Kernel, leader_key: str) -> int | None:
    """The decision journal's tick, under `<leader key>:decisions`: its records into the indexed
    table (docs/audit.md)."""
    with k.store.leader(f"{leader_key}:decisions") as leading:
        if not leading:
            return None
        return flush_decision_journal(k)


def cleanup_sweep(k: Kernel, leader_key: str, *, include_deadlines: bool = False) -> CleanupResult | None:
    """The cleanup tick: approval expiry, the executions' retention and the decisions' own (and
    deadlines when their own loop is off)."""
    with k.store.leader(leader_key) as leading:
        if not leading:
            return None
        return CleanupResult(
            approvals_expired=expire_due_approvals(k),
            executions_deleted=delete_expired_executions(k),
            deadlines_cancelled=cancel_past_deadlines(k) if include_deadlines else 0,
            decisions_deleted=delete_expired_decisions(k),
            disagreements_deleted=delete_expired_disagreements(k),
            sessions_repaired=repair(k),
            decision_hours_rolled_up=roll_up_recent(k),
        )
