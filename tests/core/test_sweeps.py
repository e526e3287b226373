"""Singleton sweeps: deadlines, approval expiry, retention, leader gating (rebuno-v0 §5.4, §7.5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernel.core import approvals, executions, steps, sweeps
from kernel.core.kernel import Kernel
from kernel.domain import ApprovalConfig, Decision, Lease, PolicyInput, StepStatus, Verdict
from kernel.identity import args_hash
from kernel.store import SqlStore
from kernel.sweeper import Sweeper
from tests.conftest import Running

KEY = "regent_test_leader"


class AskEveryone:
    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: PolicyInput, tx: Any = None, bundle_id: Any = None) -> Decision:
        return Decision(Verdict.REQUIRE_APPROVAL, "ask", approval=ApprovalConfig(timeout_seconds=60))


def req(target: str = "t") -> steps.StepRequest:
    return steps.StepRequest(kind="tool_call", target=target, args=None, args_text="null", args_hash=args_hash("null"))


def events(k: Kernel, eid: str) -> list[tuple[str, dict[str, Any]]]:
    with k.store.read() as tx:
        return [(e.type, e.payload) for e in tx.list_events(eid, 0, 1000)]


def advance(k: Kernel, seconds: float) -> None:
    k.clock.advance(seconds)  # type: ignore[attr-defined]


# -- deadlines ----------------------------------------------------------------------------
def test_deadline_sweep_cancels_executions_past_their_deadline(kernel: Kernel, running: Running) -> None:
    kernel.deadline_timeout = 60
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    advance(kernel, 61)
    assert sweeps.deadline_sweep(kernel, KEY) == 1
    e = executions.get_execution(kernel, eid)
    assert (e.status, e.failure_reason) == ("cancelled", "deadline_exceeded")
    tail = events(kernel, eid)[-2:]
    assert [t for t, _ in tail] == ["execution.cancelled", "step.cancelled"]
    assert tail[0][1]["reason"] == "deadline_exceeded"
    assert steps.get_step(kernel, eid, a.step_id, None).status == StepStatus.CANCELLED
    with kernel.store.read() as tx:  # the lease is gone: the agent's next write is refused
        assert not tx.renew_lease(did, eid, att, kernel.clock.now())


def test_deadline_sweep_leaves_executions_within_their_deadline(kernel: Kernel, running: Running) -> None:
    kernel.deadline_timeout = 60
    eid, _, _ = running.start()
    advance(kernel, 59)
    assert sweeps.deadline_sweep(kernel, KEY) == 0
    assert executions.get_execution(kernel, eid).status == "running"


def test_deadline_sweep_ignores_executions_without_a_deadline(kernel: Kernel, running: Running) -> None:
    eid, _, _ = running.start()
    advance(kernel, 10**6)
    assert sweeps.deadline_sweep(kernel, KEY) == 0
    assert executions.get_execution(kernel, eid).status == "running"


def test_deadline_sweep_cancels_pending_approvals_of_a_blocked_execution(kernel: Kernel, running: Running) -> None:
    kernel.deadline_timeout = 30
    kernel.policy = AskEveryone()
    eid, did, att = running.start()
    assert steps.submit_step(kernel, Lease("shell", eid, did, att), req()).decision == "blocked"
    advance(kernel, 31)
    assert sweeps.deadline_sweep(kernel, KEY) == 1
    kinds = [t for t, _ in events(kernel, eid)]
    assert kinds[-3:] == ["execution.cancelled", "approval.cancelled", "step.denied"]
    assert executions.get_execution(kernel, eid).status == "cancelled"
    (a,) = approvals.list_approvals(kernel, None)
    assert a.status == "cancelled" and a.rationale == "execution_cancelled" and a.decided_by is None


def test_deadline_sweep_handles_more_than_one_batch(kernel: Kernel, running: Running) -> None:
    kernel.deadline_timeout = 5
    ids = [running.start()[0] for _ in range(7)]
    advance(kernel, 6)
    assert sweeps.cancel_past_deadlines(kernel, batch=3) == 7
    assert {executions.get_execution(kernel, i).status for i in ids} == {"cancelled"}


# -- approvals ----------------------------------------------------------------------------
def test_cleanup_sweep_expires_approvals_past_their_timeout(kernel: Kernel, running: Running) -> None:
    kernel.policy = AskEveryone()
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    advance(kernel, 59)
    assert sweeps.cleanup_sweep(kernel, KEY) == sweeps.CleanupResult()
    advance(kernel, 2)
    assert sweeps.cleanup_sweep(kernel, KEY) == sweeps.CleanupResult(approvals_expired=1)
    assert [t for t, _ in events(kernel, eid)[-4:]] == [
        "approval.expired", "step.denied", "execution.resumed", "dispatch.queued"]
    assert steps.get_step(kernel, eid, a.step_id, None).status == StepStatus.DENIED
    assert executions.get_execution(kernel, eid).status == "running"


def test_cleanup_sweep_folds_in_deadlines_when_asked(kernel: Kernel, running: Running) -> None:
    kernel.deadline_timeout = 1
    eid, _, _ = running.start()
    advance(kernel, 2)
    assert sweeps.cleanup_sweep(kernel, KEY).deadlines_cancelled == 0  # type: ignore[union-attr]
    assert sweeps.cleanup_sweep(kernel, KEY, include_deadlines=True).deadlines_cancelled == 1  # type: ignore[union-attr]
    assert executions.get_execution(kernel, eid).failure_reason == "deadline_exceeded"


# -- retention ----------------------------------------------------------------------------
def _finish(kernel: Kernel, running: Running) -> str:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result={"ok": True})
    executions.finish_execution(kernel, Lease("shell", eid, did, att), output=1)
    return eid


def test_retention_deletes_old_terminal_executions_with_their_records(kernel: Kernel, running: Running) -> None:
    kernel.retention = 3600
    old = _finish(kernel, running)
    advance(kernel, 3601)
    recent = _finish(kernel, running)
    assert sweeps.cleanup_sweep(kernel, KEY) == sweeps.CleanupResult(executions_deleted=1)
    with kernel.store.read() as tx:
        assert tx.get_execution(old) is None
        assert tx.list_events(old, 0, 10) == [] and tx.list_steps(old) == []
        assert tx.get_execution(recent) is not None


def test_retention_never_deletes_a_live_execution(kernel: Kernel, running: Running) -> None:
    kernel.retention = 60
    eid, _, _ = running.start()
    advance(kernel, 10**6)
    assert sweeps.delete_expired_executions(kernel) == 0
    assert executions.get_execution(kernel, eid).status == "running"


def test_retention_counts_from_the_last_update(kernel: Kernel, running: Running) -> None:
    kernel.retention = 60
    eid, did, att = running.start()
    advance(kernel, 120)  # created long ago, finished just now
    executions.finish_execution(kernel, Lease("shell", eid, did, att), output=None)
    assert sweeps.delete_expired_executions(kernel) == 0
    advance(kernel, 61)
    assert sweeps.delete_expired_executions(kernel, batch=1) == 1


def _claimed(kernel: Kernel, eid: str) -> tuple[str, int]:
    from kernel.core.dispatch import claim_due

    c = next(c for c in claim_due(kernel, 100) if c.execution_id == eid)
    return c.dispatch_id, c.attempt


def _deleted(kernel: Kernel, *ids: str) -> list[bool]:
    with kernel.store.read() as tx:
        return [tx.get_execution(i) is None for i in ids]


def test_retention_keeps_a_session_whole_while_one_of_its_executions_is_live(
    kernel: Kernel, running: Running,
) -> None:
    from kernel.core import sessions
    from kernel.core.executions import Lineage

    kernel.retention = 60
    lin = Lineage(session="conv")
    first = executions.create_execution(kernel, "shell", "turn-1", lineage=lin)[0].id
    executions.finish_execution(kernel, Lease("shell", first, *_claimed(kernel, first)), output="a", state={"n": 1})
    advance(kernel, 3600)  # the first turn is long past retention; the session goes on
    second = executions.create_execution(kernel, "shell", "turn-2", lineage=lin)[0].id
    lease = _claimed(kernel, second)
    advance(kernel, 3600)  # the second turn is still running, an hour later
    lone = _finish(kernel, running)  # outside any session: deleted as before
    advance(kernel, 61)
    assert sweeps.delete_expired_executions(kernel) == 1
    assert _deleted(kernel, first, second, lone) == [False, False, True]
    assert sessions.previous_state(kernel, second, None)["state"] == {"n": 1}
    executions.finish_execution(kernel, Lease("shell", second, *lease), output="b")
    advance(kernel, 30)
    assert sweeps.delete_expired_executions(kernel) == 0  # its newest turn ended 30 s ago
    advance(kernel, 31)
    assert sweeps.delete_expired_executions(kernel) == 2  # the session ages out as a whole
    assert _deleted(kernel, first, second) == [True, True]


def test_retention_keeps_the_children_of_a_live_parent_and_the_source_of_a_live_fork(
    kernel: Kernel, running: Running,
) -> None:
    from kernel.core import forks
    from kernel.core.executions import Lineage

    kernel.retention = 60
    parent, _, _ = running.start()
    child = executions.create_execution(kernel, "shell", None, lineage=Lineage(parent_execution_id=parent))[0].id
    executions.finish_execution(kernel, Lease("shell", child, *_claimed(kernel, child)), output="c")
    source = _finish(kernel, running)
    fork = forks.fork_execution(kernel, source, 0)
    did, att = _claimed(kernel, fork.id)
    advance(kernel, 3600)
    assert sweeps.delete_expired_executions(kernel) == 0  # the parent and the fork are live
    assert _deleted(kernel, child, source) == [False, False]
    executions.cancel_execution(kernel, parent)
    executions.finish_execution(kernel, Lease("shell", fork.id, did, att), output=None)
    advance(kernel, 61)
    assert sweeps.delete_expired_executions(kernel) == 4
    assert _deleted(kernel, parent, child, source, fork.id) == [True] * 4


# -- leader gating ------------------------------------------------------------------------
@pytest.mark.postgres
def test_sweeps_skip_when_another_replica_leads(pg_database: str, clock: Any) -> None:
    from kernel.store import open_store
    from tests.conftest import _truncate

    store = open_store(pg_database)
    _truncate(store)
    other = open_store(pg_database)  # the other replica, holding both leader locks
    try:
        k = Kernel(store=store, clock=clock, deadline_timeout=1)
        eid = Running(k).start()[0]
        advance(k, 2)
        with other.leader(KEY) as a, other.leader(f"{KEY}:deadlines") as b:
            assert a and b
            assert sweeps.cleanup_sweep(k, KEY, include_deadlines=True) is None
            assert sweeps.deadline_sweep(k, KEY) is None
            assert executions.get_execution(k, eid).status == "running"
        assert sweeps.deadline_sweep(k, KEY) == 1  # the lock is free again: this replica leads
    finally:
        other.close()
        store.close()


def test_sqlite_is_always_its_own_leader(sqlite_store: SqlStore) -> None:
    with sqlite_store.leader(KEY) as leading:
        assert leading


# -- the background loop ------------------------------------------------------------------
def test_sweeper_runs_both_sweeps_at_start_up_and_stops(kernel: Kernel, running: Running) -> None:
    kernel.deadline_timeout = 1
    kernel.retention = 60
    done = _finish(kernel, running)
    live = running.start()[0]
    advance(kernel, 120)

    async def main() -> None:
        s = Sweeper(kernel, leader_key=KEY, cleanup_interval=3600, deadline_check_interval=3600)
        await s.start()
        for _ in range(1000):  # bounded wait for the first ticks, which run on worker threads
            if executions.get_execution(kernel, live).status == "cancelled" and _gone(kernel, done):
                break
            await asyncio.sleep(0.01)
        await asyncio.wait_for(s.stop(), 5)

    asyncio.run(main())
    assert executions.get_execution(kernel, live).failure_reason == "deadline_exceeded"
    assert _gone(kernel, done)


def _gone(k: Kernel, eid: str) -> bool:
    with k.store.read() as tx:
        return tx.get_execution(eid) is None


def _journal(k: Kernel) -> int:
    from sqlalchemy import func, select

    from kernel.store import tables as t

    with k.store.read() as tx:
        return int(tx.conn.execute(select(func.count()).select_from(t.decision_journal)).scalar_one())


@pytest.mark.parametrize("interval", [0.05, 3600.0], ids=["on-its-interval", "on-stop"])
def test_sweeper_moves_the_decision_journal(kernel: Kernel, running: Running, interval: float) -> None:
    from kernel.core import audit, steps
    from kernel.core.audit import DecisionQuery
    from tests.core.test_steps import req

    eid, did, att = running.start()

    async def main() -> None:
        s = Sweeper(kernel, leader_key=KEY, cleanup_interval=0, deadline_check_interval=3600,
                    decision_flush_interval=interval)
        await s.start()
        await asyncio.to_thread(steps.submit_step, kernel, Lease("shell", eid, did, att), req(target="t"))
        assert interval > 1 or _journal(kernel) <= 1
        for _ in range(300 if interval < 1 else 0):  # bounded wait for a tick
            if _journal(kernel) == 0:
                break
            await asyncio.sleep(0.01)
        assert _journal(kernel) == (0 if interval < 1 else 1)
        await asyncio.wait_for(s.stop(), 5)

    asyncio.run(main())
    assert _journal(kernel) == 0
    assert [r.target for r in audit.list_decisions(kernel, DecisionQuery()).decisions] == ["t"]


def test_retention_leaves_the_write_lock_free_between_batches_for_as_long_as_a_batch_took(
        kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retention pass ran its batches back to back: on SQLite each holds the file's write lock,
    and the requests' writes queued behind all of them (8 stepping workers' round-trip p99 7.8×
    while 10^4 expired executions were deleted, 1.12× with the pause; bench/scale.py retention).
    Between two batches no transaction is open, and the pass waits as long as the batch took.
    Fails before the pause: no wait at all."""
    import time as _time

    from kernel.core import retention

    log: list[tuple[str, float]] = []
    monkeypatch.setattr(retention.time, "sleep", lambda s: log.append(("sleep", s)))
    begin = kernel.store.transaction
    open_tx = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        open_tx.append(1)
        return begin(*args, **kwargs)

    monkeypatch.setattr(kernel.store, "transaction", counted)

    def delete(tx: Any, cutoff: Any, n: int) -> int:
        assert len(open_tx) == len([e for e in log if e[0] == "batch"]) + 1  # one transaction a batch
        t = _time.monotonic()
        while _time.monotonic() - t < 0.01:  # a batch's work (time.sleep is the one patched)
            pass
        log.append(("batch", 0.0))
        return n if len([e for e in log if e[0] == "batch"]) < 3 else 0

    assert retention.delete_in_batches(kernel, delete, kernel.clock.now(), 5) == 10
    assert [e[0] for e in log] == ["batch", "sleep", "batch", "sleep", "batch"]
    assert all(0.01 * retention.PAUSE_FACTOR <= s <= retention.YIELD_MAX for kind, s in log if kind == "sleep")


def test_retention_batches_follow_their_duration_so_a_write_waits_for_a_short_one(
        kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 200 executions took 52-65 ms in the store of 10^6 (bench/scale.py), and a step's
    commit arriving during one waited for the rest of it: the round trip's p99 under retention was
    1.33× SQLite, 2.44× PostgreSQL. Each batch is now resized towards TARGET_SECONDS from the last
    one's duration (here a batch costs 1 ms a row: 15 rows), between MIN_BATCH and the caller's
    batch, and nothing is lost or deleted twice. Fails before: every batch is 200 rows."""
    from kernel.core import retention

    clock = [0.0]
    monkeypatch.setattr(retention.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(retention.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    target = retention.target_seconds(kernel)
    assert target == (0.005 if kernel.store.dialect == "sqlite" else 0.050)  # only SQLite's lock is the store's
    monkeypatch.setattr(retention, "target_seconds", lambda k: 0.015)
    left, sizes = [1000], []

    def delete(tx: Any, cutoff: Any, n: int) -> int:
        sizes.append(n)
        done = min(n, left[0])
        left[0] -= done
        clock[0] += 0.001 * done  # a row costs 1 ms
        return done

    assert retention.delete_in_batches(kernel, delete, kernel.clock.now(), 200) == 1000
    assert left == [0]
    assert sizes[0] == 20  # a tenth of the caller's batch first
    assert all(retention.MIN_BATCH <= n <= 200 for n in sizes)
    assert all(n == 15 for n in sizes[2:-1]), sizes  # 15 ms a batch at 1 ms a row
    # fast rows: the size doubles a batch at most, up to the caller's batch
    left[0], sizes[:] = 5000, []
    monkeypatch.setattr(retention, "target_seconds", lambda k: 1.0)
    assert retention.delete_in_batches(kernel, delete, kernel.clock.now(), 200) == 5000
    assert sizes[:5] == [20, 40, 80, 160, 200]
    assert retention.next_size(50, 10.0, 200) == retention.MIN_BATCH  # a slow batch: the least


def test_a_retention_pass_ends_after_pass_seconds(kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass is bounded in time as well as in batches (the next tick goes on): with batches of
    1 s and their pauses a pass stops once PASS_SECONDS have gone."""
    from kernel.core import retention

    clock = [0.0]
    monkeypatch.setattr(retention.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(retention.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    def delete(tx: Any, cutoff: Any, n: int) -> int:
        clock[0] += 1.0
        return n

    n = retention.delete_in_batches(kernel, delete, kernel.clock.now(), 200)
    assert 0 < n <= 20 * (retention.PASS_SECONDS + 2)
    assert retention.PASS_SECONDS <= clock[0] <= retention.PASS_SECONDS + 2 * (1 + retention.YIELD_MAX)
