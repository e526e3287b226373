"""Sessions and the sub-agent tree: admission in creation order, the previous turn's state,
suspend/resume of a parent waiting for its children, and what follows an execution's end.

Lock order, everywhere: a session before any execution, an execution's own transaction before
(never inside) its parent's or children's. What an end sets off (admitting the session's next
execution, settling the parent, cancelling the children) therefore runs after the ending
transaction commits, each in a transaction of its own; the sweeps redo any of it a crash skipped.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from kernel.core import events as ev
from kernel.core.kernel import Kernel
from kernel.core.leases import enqueue, require_live_lease
from kernel.core.lifecycle import cancel_one, load_owned
from kernel.core.store_ports import StepStore, Transaction
from kernel.domain import EventType, Execution, ExecutionStatus, Lease, StepStatus
from kernel.errors import ExecutionTerminal

log = logging.getLogger("regent.sessions")
_MAX_CASCADE = 10_000  # bounded: the executions one cancel may reach through the tree


def start_or_queue(k: Kernel, tx: Transaction, e: Execution, now: datetime, extra: list[ev.Ev] | None = None) -> Execution:
    """Insert a new execution: running with a dispatch, or `pending` behind its session's queue.

    Runs under the session's lock when `e.session` is set, so two kernels admitting into one
    session serialise here.
    """
    dl = e.deadline_at.isoformat() if e.deadline_at else None
    created = ev.execution(EventType.EXECUTION_CREATED, e.id, ExecutionStatus.PENDING, deadline_at=dl,
                           session=e.session, parent_execution_id=e.parent_execution_id)
    if e.session is not None and tx.session_occupied(e.session):
        e = _replace(e, status=ExecutionStatus.PENDING)
        tx.insert_execution(e)
        tx.append(e.id, now, [*(extra or []), created])
        return e
    previous = tx.latest_completed(e.session, e.agent_id, e.id) if e.session is not None else None
    e = _replace(e, status=ExecutionStatus.RUNNING, previous_execution_id=previous)
    tx.insert_execution(e)
    _, queued = enqueue(k, tx, e.id, now)
    tx.append(e.id, now, [
        *(extra or []),
        created,
        ev.execution(EventType.EXECUTION_STARTED, e.id, ExecutionStatus.RUNNING, deadline_at=dl,
                     previous_execution_id=previous),
        queued,
    ])
    if previous is not None:
        _inherit_resources(tx, previous, e.id, now)
    return e


def _inherit_resources(tx: Transaction, previous: str, execution_id: str, now: datetime) -> None:
    """A session turn starts with its previous turn's resources: their registrations and bindings,
    so the agent reopens the same resource; generations, counts and checkpoints are the turn's
    own (generation 0, not covered until a capture). docs/api.md, "Resources and checkpoints"."""
    rows = tx.list_resources(previous)
    if not rows:
        return
    base = tx.last_event_seq(execution_id)
    out: list[ev.Ev] = []
    for i, r in enumerate(rows):
        tx.insert_resource({
            "execution_id": execution_id, "key": r.key, "driver_id": r.driver_id, "configuration": r.configuration,
            "coverage_reuse": r.coverage_reuse, "every_steps": r.every_steps, "on_completion": r.on_completion,
            "generation": 0, "binding": r.binding, "checkpoint_ref": None, "covered": False,
            "steps_since_capture": 0, "created_at": now, "registered_seq": base + i + 1,
        })
        out.append((EventType.RESOURCE_REGISTERED.value, {
            "key": r.key, "driver_id": r.driver_id, "generation": 0, "every_steps": int(r.every_steps),
            "on_completion": bool(r.on_completion), "inherited_from": previous}))
    tx.append(execution_id, now, out)


def _replace(e: Execution, **changes: Any) -> Execution:
    import dataclasses

    return dataclasses.replace(e, **changes)


def admit_next(k: Kernel, session: str) -> str | None:
    """Start the session's oldest queued execution if none is running or blocked. Returns its id."""
    now = k.clock.now()
    with k.store.transaction(session=session) as tx:
        if tx.session_live(session) is not None:
            return None
        eid = tx.oldest_pending(session)
        if eid is None:
            return None
        tx.lock_execution(eid)  # before any write (SQLite: the write lock comes after the keyed one)
        e = tx.get_execution(eid)
        if e is None or e.status != ExecutionStatus.PENDING:
            return None
        # A fork keeps its source's previous turn (it reruns the source), queued or not.
        previous = e.previous_execution_id if e.forked_from is not None else tx.latest_completed(
            session, e.agent_id, e.id)
        if not tx.admit(eid, now, previous):
            return None
        _, queued = enqueue(k, tx, eid, now)
        tx.append(eid, now, [
            ev.execution(EventType.EXECUTION_STARTED, eid, ExecutionStatus.RUNNING, previous_execution_id=previous),
            queued,
        ])
        if previous is not None and e.forked_from is None:  # a fork has its own restored resources
            _inherit_resources(tx, previous, eid, now)
        return eid


def previous_state(k: Kernel, execution_id: str, agent_id: str | None) -> dict[str, Any]:
    """The previous turn's `state` (or its output when it recorded none)."""
    with k.store.read() as tx:
        e = load_owned(tx, execution_id, agent_id)
        prev = tx.get_execution(e.previous_execution_id) if e.previous_execution_id else None
    if prev is None:
        return {"state": None}
    state = prev.state if prev.state is not None else prev.output
    return {"state": state, "execution_id": prev.id}


def suspend(k: Kernel, lease: Lease) -> bool:
    """The parent waits for its children without a lease: True if it suspended, False when no
    child is still live. Before answering False it records the ended children's outcomes on their
    spawning steps itself: the handler reads those steps next, and the `settle` that follows a
    child's end may not have run yet (it runs after the child's own commit, or in the sweep)."""

    now = k.clock.now()
    execution_id = lease.execution_id
    with k.store.transaction(lock=execution_id) as tx:
        e = load_owned(tx, execution_id, lease.agent_id)
        if e.status.is_terminal:
            raise ExecutionTerminal("execution is terminal")
        require_live_lease(tx, lease, now)
        live = tx.live_children(execution_id)
        if live == 0:
            recorded = [x for c in tx.children(execution_id) if c.spawned_step_id for x in _record_child(tx, c, now)]
            if recorded:
                tx.append(execution_id, now, recorded)
            return False
        tx.retire_dispatches(execution_id, now)
        tx.append(execution_id, now,
                  [ev.execution(EventType.EXECUTION_SUSPENDED, execution_id, e.status, children_live=live)],
                  suspended=True)
    settle(k, execution_id)  # a child that ended meanwhile has no one else to resume this
    return True


def settle(k: Kernel, parent_id: str) -> bool:
    """Record ended children's outcomes on the parent steps that spawned them and resume the
    parent once it is suspended with no live child. Idempotent. Returns whether it resumed."""
    now = k.clock.now()
    with k.store.transaction(lock=parent_id) as tx:
        p = tx.get_execution(parent_id)
        if p is None or p.status.is_terminal:
            return False
        out: list[ev.Ev] = []
        live = 0
        for c in tx.children(parent_id):
            if not c.status.is_terminal:
                live += 1
                continue
            if c.spawned_step_id:
                out.extend(_record_child(tx, c, now))
        values: dict[str, Any] = {}
        resumed = p.suspended and live == 0
        if resumed:
            _, queued = enqueue(k, tx, parent_id, now)
            out += [ev.execution(EventType.EXECUTION_RESUMED, parent_id, p.status, reason="children_ended"), queued]
            values["suspended"] = False
        if out or values:
            tx.append(parent_id, now, out, **values)
        return resumed


def _record_child(tx: StepStore, c: Execution, now: datetime) -> list[ev.Ev]:
    """The child's end as the outcome of the step that spawned it (once: a terminal step stays)."""
    s = tx.get_step(c.parent_execution_id or "", c.spawned_step_id or "")
    if s is None or s.execution_id != c.parent_execution_id or s.status.is_terminal:
        return []
    if c.status == ExecutionStatus.COMPLETED:
        tx.update_step(s.execution_id, s.step_id, status=StepStatus.SUCCEEDED, result=c.output, completed_at=now)
        return [ev.step(EventType.STEP_SUCCEEDED, s.step_id, s.kind, s.target, child_execution_id=c.id)]
    error = {"reason": f"subagent_{c.status.value}", "message": c.failure_reason or c.status.value,
             "execution_id": c.id}
    tx.update_step(s.execution_id, s.step_id, status=StepStatus.FAILED, error=error, completed_at=now)
    return [ev.step(EventType.STEP_FAILED, s.step_id, s.kind, s.target, error=error, child_execution_id=c.id)]


def ended(k: Kernel, e: Execution) -> None:
    """What an execution's end sets off, after its transaction committed (see the module doc).

    The end itself is recorded: a failure here is logged, not raised to the caller, and the
    cleanup sweep's `repair` does it later."""
    follow_ups: list[tuple[str, Any]] = []
    if e.session is not None:
        follow_ups.append(("admit the next execution of its session", lambda: admit_next(k, e.session or "")))
    if e.parent_execution_id is not None:
        follow_ups.append(("settle its parent", lambda: settle(k, e.parent_execution_id or "")))
    if e.status == ExecutionStatus.CANCELLED:
        follow_ups.append(("cancel its children", lambda: cancel_children(k, e.id)))
    for what, fn in follow_ups:
        try:
            fn()
        except Exception:
            log.exception("after execution %s ended: could not %s (the cleanup sweep retries)", e.id, what)


def cancel_children(k: Kernel, parent_id: str) -> int:
    """Cancel every live descendant (reason `parent_cancelled`), each in its own transaction."""
    todo, done = [parent_id], 0
    while todo and done < _MAX_CASCADE:
        pid = todo.pop()
        with k.store.read() as tx:
            kids = tx.children(pid)
        for c in kids:
            todo.append(c.id)
            if not c.status.is_terminal and cancel_one(k, c.id, "parent_cancelled") is not None:
                done += 1
                if c.session is not None:
                    admit_next(k, c.session)
    return done


def repair(k: Kernel, batch: int = 100) -> int:
    """The sweep's half of `ended`: admit stalled sessions, resume ready suspended parents, cancel
    the live children of cancelled parents."""
    with k.store.read() as tx:
        sessions = tx.stalled_sessions(batch)
        parents = tx.suspended_parents_ready(batch)
        orphaned = tx.cancelled_with_live_children(batch)
    n = sum(1 for s in sessions if admit_next(k, s) is not None)
    n += sum(1 for p in parents if settle(k, p))
    return n + sum(cancel_children(k, p) for p in orphaned)
