"""The store contract, run on SQLite and on PostgreSQL through the parametrized `store` fixture.

These pin what the core relies on from any backend (rebuno-v0 §11): gapless per-execution event
seqs, terminal step rows that are never overwritten, monotonic occurrence counters, lease fencing,
retiring, keyset paging, and (SQLite) one kernel process per file.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from kernel.domain import (
    Agent,
    Dispatch,
    DispatchStatus,
    Execution,
    ExecutionStatus,
    Step,
    StepStatus,
)
from kernel.errors import ConfigError, StoreConflict
from kernel.ids import new_uuid7
from kernel.store import SqlStore, open_store
from kernel.store.migrations import migrate

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HASH = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"


def _agent(store: SqlStore, agent_id: str = "agent") -> str:
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id=agent_id, webhook_url="http://127.0.0.1:9/hook", secret="s", registered_at=T0))
    return agent_id


def _execution(store: SqlStore, agent_id: str, status: ExecutionStatus = ExecutionStatus.RUNNING) -> str:
    eid = new_uuid7()
    with store.transaction() as tx:
        tx.insert_execution(Execution(id=eid, agent_id=agent_id, input={"i": 1}, status=status,
                                      created_at=T0, updated_at=T0))
    return eid


def _dispatch(store: SqlStore, eid: str, *, status: DispatchStatus = DispatchStatus.IN_FLIGHT,
              attempt: int = 1) -> str:
    did = new_uuid7()
    with store.transaction(lock=eid) as tx:
        tx.insert_dispatch(Dispatch(id=did, execution_id=eid, status=DispatchStatus.PENDING, attempt=0,
                                    max_attempts=5, next_attempt_at=T0, created_at=T0, updated_at=T0))
        if status != DispatchStatus.PENDING or attempt:
            locked = status == DispatchStatus.IN_FLIGHT
            tx.set_dispatch(did, T0, status=status, attempt=attempt, locked_by="r1" if locked else None,
                            locked_at=T0 if locked else None)
    return did


def _step(eid: str, sid: str, status: StepStatus = StepStatus.EXECUTING, occurrence: int = 0,
          target: str = "t") -> Step:
    return Step(step_id=sid, execution_id=eid, kind="tool_call", target=target, args_hash=HASH,
                occurrence=occurrence, status=status, idempotency="safe_to_retry", started_at=T0)


def _seqs(store: SqlStore, eid: str) -> list[int]:
    with store.read() as tx:
        return [e.event_seq for e in tx.list_events(eid, 0, 10_000)]


# -- events -------------------------------------------------------------------------------------


def test_append_gives_gapless_seqs_from_1(store: SqlStore) -> None:
    a = _agent(store)
    e1, e2 = _execution(store, a), _execution(store, a)
    lasts = []
    for eid, n in [(e1, 1), (e2, 2), (e1, 3), (e1, 0), (e2, 1), (e1, 2)]:
        with store.transaction(lock=eid) as tx:
            lasts.append(tx.append(eid, T0, [("test.event", {"i": i}) for i in range(n)]))
    assert lasts == [1, 2, 4, 4, 3, 6]
    assert _seqs(store, e1) == [1, 2, 3, 4, 5, 6]
    assert _seqs(store, e2) == [1, 2, 3]  # each execution counts on its own
    with store.read() as tx:
        evs = tx.list_events(e1, 0, 100)
        assert [e.payload for e in evs] == [{"i": 0}, {"i": 0}, {"i": 1}, {"i": 2}, {"i": 0}, {"i": 1}]
        assert [e.event_seq for e in tx.list_events(e1, 4, 100)] == [5, 6]
        assert [e.event_seq for e in tx.list_events(e1, 0, 2)] == [1, 2]


@pytest.mark.parametrize("n", [8, 9, 25])
def test_append_of_many_events_at_once_keeps_order_and_payloads(store: SqlStore, n: int) -> None:
    # Up to 8 rows go in one multi-row INSERT, more through executemany: both must agree.
    eid = _execution(store, _agent(store))
    with store.transaction(lock=eid) as tx:
        tx.append(eid, T0, [("test.one", {"first": True})])
        assert tx.append(eid, T0, [(f"test.e{i}", {"i": i}) for i in range(n)]) == n + 1
    with store.read() as tx:
        evs = tx.list_events(eid, 1, 100)
    assert [e.event_seq for e in evs] == list(range(2, n + 2))
    assert [(e.type, e.payload) for e in evs] == [(f"test.e{i}", {"i": i}) for i in range(n)]
    assert all(e.occurred_at == T0 for e in evs)
    if store.dialect == "sqlite":
        # Every row of a multi-row INSERT stores the timestamp in the one text format
        # (`YYYY-MM-DD HH:MM:SS.ffffff`); rows after the first once kept Python's "+00:00".
        with store.engine.connect() as c:
            stored = {r[0] for r in c.execute(text("SELECT occurred_at FROM events WHERE execution_id = :e"),
                                              {"e": eid})}
        assert stored == {"2026-12-01 12:00:00.000000"}


def test_append_applies_execution_values_in_the_same_write(store: SqlStore) -> None:
    eid = _execution(store, _agent(store))
    later = T0 + timedelta(seconds=5)
    with store.transaction(lock=eid) as tx:
        tx.append(eid, later, [("execution.completed", {})], status=ExecutionStatus.COMPLETED, output={"o": 1})
    with store.read() as tx:
        e = tx.get_execution(eid)
    assert e is not None and e.status == ExecutionStatus.COMPLETED and e.output == {"o": 1}
    assert e.updated_at == later


def test_a_rolled_back_append_consumes_no_seq(store: SqlStore) -> None:
    eid = _execution(store, _agent(store))
    with store.transaction(lock=eid) as tx:
        tx.append(eid, T0, [("a", {}), ("b", {})])
    with pytest.raises(RuntimeError), store.transaction(lock=eid) as tx:
        tx.append(eid, T0, [("lost", {})])
        raise RuntimeError("abort the use case")
    with store.transaction(lock=eid) as tx:
        assert tx.append(eid, T0, [("c", {})]) == 3
    with store.read() as tx:
        assert [e.type for e in tx.list_events(eid, 0, 100)] == ["a", "b", "c"]


def test_concurrent_appends_under_the_execution_lock_stay_gapless(store: SqlStore) -> None:
    eid = _execution(store, _agent(store))
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(20):
                with store.transaction(lock=eid) as tx:
                    tx.get_execution(eid)  # read, then write: the shape of every use case
                    tx.append(eid, T0, [("w", {"w": n, "i": i}), ("w2", {"w": n, "i": i})])
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    seqs = _seqs(store, eid)
    assert seqs == list(range(1, 4 * 20 * 2 + 1))
    with store.read() as tx:
        evs = tx.list_events(eid, 0, 1000)
    # the two events of one transaction are contiguous
    for first, second in zip(evs[::2], evs[1::2], strict=True):
        assert (first.type, second.type) == ("w", "w2") and first.payload == second.payload


# -- steps ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("terminal", [StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.DENIED,
                                      StepStatus.CANCELLED])
def test_update_step_never_overwrites_a_terminal_row(store: SqlStore, terminal: StepStatus) -> None:
    eid = _execution(store, _agent(store))
    sid = "a" * 64
    done = T0 + timedelta(seconds=1)
    with store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, sid), '{"x":1}')
        assert tx.update_step(eid, sid, status=terminal, result={"r": 1}, error={"reason": "e"}, completed_at=done,
                              usage_input=3, usage_output=4)
    for attempt in [
        {"status": StepStatus.EXECUTING},
        {"status": StepStatus.SUCCEEDED, "result": {"r": 2}},
        {"status": StepStatus.FAILED, "error": {"reason": "other"}},
        {"result": {"r": 3}},
        {"error": None},
        {"completed_at": done + timedelta(hours=1)},
        {"usage_input": 100, "usage_output": 100},
    ]:
        with store.transaction(lock=eid) as tx:
            assert tx.update_step(eid, sid, **attempt) is False, attempt
    with store.read() as tx:
        s = tx.get_step(eid, sid)
    assert s is not None
    assert (s.status, s.result, s.error, s.completed_at, s.usage_input, s.usage_output) == (
        terminal, {"r": 1}, {"reason": "e"}, done, 3, 4)
    assert s.args == {"x": 1}


def test_update_step_moves_non_terminal_rows(store: SqlStore) -> None:
    eid = _execution(store, _agent(store))
    sid = "b" * 64
    with store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, sid, StepStatus.AWAITING_APPROVAL), None)
        assert tx.update_step(eid, sid, status=StepStatus.ALLOWED)
        assert tx.update_step(eid, sid, status=StepStatus.EXECUTING, started_at=T0)
        assert tx.update_step(eid, "c" * 64, status=StepStatus.EXECUTING) is False  # unknown step
    with store.read() as tx:
        s = tx.get_step(eid, sid)
    assert s is not None and s.status == StepStatus.EXECUTING


def test_step_identity_is_unique(store: SqlStore) -> None:
    eid = _execution(store, _agent(store))
    with store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, "d" * 64), None)
    # same step id
    with pytest.raises(StoreConflict), store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, "d" * 64), None)
    # different id, same (execution, kind, target, args_hash, occurrence)
    with pytest.raises(StoreConflict), store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, "e" * 64), None)
    with store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, "f" * 64, occurrence=1), None)
    with store.read() as tx:
        assert sorted(s.step_id for s in tx.list_steps(eid)) == ["d" * 64, "f" * 64]


def test_a_broken_constraint_is_a_store_conflict_that_names_no_values(store: SqlStore) -> None:
    """The store's contract: a write that breaks a constraint raises the kernel's StoreConflict
    (the core never sees the driver's error), and its message names the constraint, never the
    values (PostgreSQL's own message repeats the key)."""
    eid = _execution(store, _agent(store))
    sid = "5ec2e7" + "0" * 58
    with store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, sid), None)
    with pytest.raises(StoreConflict) as caught, store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, sid), None)
    assert isinstance(caught.value.__cause__, IntegrityError)
    assert str(caught.value).startswith("store conflict: ")
    assert "5ec2e7" not in str(caught.value) and eid not in str(caught.value)


# -- occurrence counters --------------------------------------------------------------------------


def test_advance_counter_never_moves_backwards(store: SqlStore) -> None:
    eid = _execution(store, _agent(store))
    did = _dispatch(store, eid)
    key = (did, "tool_call", "t", HASH)
    with store.transaction(lock=eid) as tx:
        assert tx.get_counter(*key) == 0
        tx.advance_counter(*key, 3)
        assert tx.get_counter(*key) == 3
    for to, want in [(1, 3), (3, 3), (0, 3), (5, 5), (4, 5)]:
        with store.transaction(lock=eid) as tx:
            tx.advance_counter(*key, to)
        with store.read() as tx:
            assert tx.get_counter(*key) == want, (to, want)
    with store.read() as tx:  # counters are keyed by every part
        assert tx.get_counter(did, "llm_call", "t", HASH) == 0
        assert tx.get_counter(did, "tool_call", "T", HASH) == 0
        assert tx.get_counter(did, "tool_call", "t", "0" * 64) == 0
        assert tx.get_counter(new_uuid7(), "tool_call", "t", HASH) == 0
    with store.transaction(lock=eid) as tx:
        tx.clear_counters(did)  # a new claim replays from occurrence 0
    with store.read() as tx:
        assert tx.get_counter(*key) == 0


# -- leases ---------------------------------------------------------------------------------------


def test_renew_lease_fences_wrong_attempt_execution_and_status(store: SqlStore) -> None:
    a = _agent(store)
    eid, other = _execution(store, a), _execution(store, a)
    did = _dispatch(store, eid, attempt=2)
    later = T0 + timedelta(seconds=30)

    def locked_at() -> datetime | None:
        with store.read() as tx:
            d = tx.get_dispatch(did)
        assert d is not None
        return d.locked_at

    for args in [(did, eid, 1), (did, eid, 3), (did, other, 2), (new_uuid7(), eid, 2)]:
        with store.transaction(lock=eid) as tx:
            assert tx.renew_lease(args[0], args[1], args[2], later) is False, args
    assert locked_at() == T0  # fenced calls change nothing
    with store.transaction(lock=eid) as tx:
        assert tx.renew_lease(did, eid, 2, later) is True
    assert locked_at() == later
    for status in (DispatchStatus.PENDING, DispatchStatus.FAILED, DispatchStatus.EXHAUSTED):
        with store.transaction(lock=eid) as tx:
            tx.set_dispatch(did, later, status=status)
        with store.transaction(lock=eid) as tx:
            assert tx.renew_lease(did, eid, 2, later + timedelta(seconds=1)) is False, status
    assert locked_at() == later


def test_retire_dispatches(store: SqlStore) -> None:
    a = _agent(store)
    eid, other = _execution(store, a), _execution(store, a)
    live = _dispatch(store, eid, attempt=1)
    queued = _dispatch(store, eid, status=DispatchStatus.PENDING, attempt=0)
    failed = _dispatch(store, eid, status=DispatchStatus.FAILED, attempt=2)
    bystander = _dispatch(store, other, attempt=1)
    later = T0 + timedelta(seconds=9)
    with store.transaction(lock=eid) as tx:
        tx.retire_dispatches(eid, later)
    with store.read() as tx:
        for did in (live, queued, failed):
            d = tx.get_dispatch(did)
            assert d is not None and d.status == DispatchStatus.EXHAUSTED
            assert d.locked_by is None and d.locked_at is None
        assert [d.attempt for d in map(tx.get_dispatch, (live, queued, failed)) if d] == [1, 0, 2]  # kept
        b = tx.get_dispatch(bystander)
        assert b is not None and b.status == DispatchStatus.IN_FLIGHT and b.locked_by == "r1"
        assert live not in tx.due_dispatch_ids(later + timedelta(days=1), 100)
        assert queued not in tx.due_dispatch_ids(later + timedelta(days=1), 100)
    with store.transaction(lock=eid) as tx:
        assert tx.renew_lease(live, eid, 1, later) is False
        tx.retire_dispatches(eid, later)  # idempotent
    with store.transaction(lock=other) as tx:
        assert tx.renew_lease(bystander, other, 1, later) is True


# -- listing ---------------------------------------------------------------------------------------


def test_list_executions_keyset_paging(store: SqlStore) -> None:
    a, b = _agent(store, "a"), _agent(store, "b")
    ids = [_execution(store, a if i % 3 else b) for i in range(11)]
    with store.transaction(lock=ids[0]) as tx:
        tx.set_execution(ids[0], T0, status=ExecutionStatus.COMPLETED)
    newest_first = sorted(ids, reverse=True)
    assert newest_first == ids[::-1]  # UUIDv7: creation order is id order

    def pages(agent_id: str | None, status: str | None, limit: int) -> list[list[str]]:
        out: list[list[str]] = []
        cursor = None
        for _ in range(50):  # bounded
            with store.read() as tx:
                page = [e.id for e in tx.list_executions(agent_id, status, cursor, limit)]
            if not page:
                break
            out.append(page)
            cursor = page[-1]
        return out

    got = pages(None, None, 3)
    assert [len(p) for p in got] == [3, 3, 3, 2]
    assert [x for p in got for x in p] == newest_first  # disjoint, complete, newest first
    assert [x for p in pages("b", None, 2) for x in p] == [x for x in newest_first if ids.index(x) % 3 == 0]
    assert [x for p in pages(None, "completed", 5) for x in p] == [ids[0]]
    assert pages(None, "no-such-status", 5) == []
    assert pages("nobody", None, 5) == []
    with store.read() as tx:
        # the cursor selects ids strictly lower, whether or not it names a row
        assert [e.id for e in tx.list_executions(None, None, ids[5], 100)] == ids[:5][::-1]
        assert tx.list_executions(None, None, "00000000-0000-0000-0000-000000000000", 100) == []
        assert len(tx.list_executions(None, None, "ffffffff-ffff-ffff-ffff-ffffffffffff", 100)) == 11


# -- SQLite: one kernel per file --------------------------------------------------------------------


def test_second_sqlite_store_on_the_same_file_is_refused(tmp_path: Any) -> None:
    path = tmp_path / "one.db"
    first = open_store(f"sqlite:///{path}")
    try:
        migrate(first)
        with pytest.raises(ConfigError) as info:
            open_store(f"sqlite:///{path}")
        assert str(path) in info.value.message
        # a relative spelling of the same file is the same file
        with pytest.raises(ConfigError):
            open_store(f"sqlite:///{path.parent}/./one.db")
        other = open_store(f"sqlite:///{tmp_path / 'two.db'}")  # another file is fine
        other.close()
    finally:
        first.close()
    again = open_store(f"sqlite:///{path}")  # released on close
    again.close()


def test_the_step_paths_entry_reads_decode_an_execution_as_get_execution_does(store: SqlStore) -> None:
    """submit_context and outcome_context read the execution row in joins of their own: every
    column must come back as get_execution's reading of it."""
    agent = _agent(store)
    parent = _execution(store, agent)
    eid = new_uuid7()
    with store.transaction() as tx:
        tx.insert_execution(Execution(
            id=eid, agent_id=agent, input={"big": "x" * 5000, "n": [1, 2]}, status=ExecutionStatus.RUNNING,
            created_at=T0, updated_at=T0, deadline_at=T0 + timedelta(hours=1), idempotency_key="key-1",
            created_by="bootstrap", session="s-1", parent_execution_id=parent, spawned_step_id="a" * 64,
            previous_execution_id=parent, forked_from=parent, fork_seq=7, fork_bundle_id=3,
            restoration={"db": {"covered": True}},
        ))
    did = _dispatch(store, eid)
    with store.transaction(lock=eid) as tx:
        tx.append(eid, T0 + timedelta(seconds=1), [], output={"done": 1}, state={"turn": 2})
        tx.add_usage(eid, 11, 22)
        tx.insert_step(_step(eid, "b" * 64), None)
    with store.read() as tx:
        want = tx.get_execution(eid)
        submit = tx.submit_context(eid, did, "tool_call", "t", HASH)[0]
        outcome = tx.outcome_context(eid, "b" * 64, did)[0]
    assert want is not None and want.state == {"turn": 2} and want.usage_output == 22 and want.fork_seq == 7
    assert submit == want
    assert outcome == want


def test_append_writes_a_new_step_and_its_counter_with_the_events(store: SqlStore) -> None:
    """`append(step=…, counter=…)` (one statement on PostgreSQL): the step row as insert_step
    writes it, its outcome seq when its outcome event is in the batch, the counter advanced and
    never moved back; for an execution that does not exist nothing is written."""
    from kernel.store import tables as t

    eid = _execution(store, _agent(store))
    did = _dispatch(store, eid)
    allowed = _step(eid, "a" * 64, StepStatus.EXECUTING, occurrence=0)
    denied = Step(step_id="b" * 64, execution_id=eid, kind="tool_call", target="t", args_hash=HASH, occurrence=1,
                  status=StepStatus.DENIED, idempotency="at_most_once", error={"reason": "no", "rule_id": "r"},
                  completed_at=T0)
    with store.transaction(lock=eid) as tx:
        last = tx.append(eid, T0, [("step.proposed", {"step_id": "a" * 64}), ("step.allowed", {"step_id": "a" * 64}),
                                   ("step.executing", {"step_id": "a" * 64})],
                         step=(allowed, '{"x":1}'), counter=(did, "tool_call", "t", HASH, 1))
        assert last == 3
    with store.transaction(lock=eid) as tx:
        assert tx.append(eid, T0, [("step.proposed", {"step_id": "b" * 64}), ("step.denied", {"step_id": "b" * 64})],
                         step=(denied, None), counter=(did, "tool_call", "t", HASH, 2)) == 5
        # A counter never moves back, here as through advance_counter.
        tx.append(eid, T0, [("execution.noted", {})], counter=(did, "tool_call", "t", HASH, 1))
    with store.read() as tx:
        a, b = tx.get_step(eid, "a" * 64), tx.get_step(eid, "b" * 64)
        assert a is not None and a.status == StepStatus.EXECUTING and a.started_at == T0
        assert b is not None and b.status == StepStatus.DENIED and b.error == {"reason": "no", "rule_id": "r"}
        assert b.completed_at == T0 and b.idempotency == "at_most_once"
        assert tx.get_counter(did, "tool_call", "t", HASH) == 2
        rows = {r.step_id: r for r in tx.conn.execute(t.steps.select().where(t.steps.c.execution_id == eid))}
        assert rows["a" * 64].args == '{"x":1}' and rows["a" * 64].outcome_seq is None
        assert rows["b" * 64].outcome_seq == 5  # its step.denied event's seq
        assert _seqs(store, eid) == [1, 2, 3, 4, 5, 6]
    ghost = new_uuid7()
    # PostgreSQL's one statement finds no execution and writes nothing; SQLite's step insert
    # fails its foreign key first. Either way the transaction fails and nothing is left.
    with pytest.raises((LookupError, StoreConflict)), store.transaction(lock=ghost) as tx:
        tx.append(ghost, T0, [("step.proposed", {"step_id": "c" * 64})],
                  step=(_step(ghost, "c" * 64), None), counter=(did, "tool_call", "u", HASH, 1))
    with store.read() as tx:
        assert tx.get_step(ghost, "c" * 64) is None and tx.get_counter(did, "tool_call", "u", HASH) == 0


def test_append_records_a_steps_outcome_with_its_event(store: SqlStore) -> None:
    """`append(outcome=(step_id, values))` (one statement on PostgreSQL): the step's update as
    update_step makes it, its outcome_seq the outcome event's seq; a terminal step is never
    overwritten, as through update_step."""
    from kernel.store import tables as t

    eid = _execution(store, _agent(store))
    with store.transaction(lock=eid) as tx:
        tx.insert_step(_step(eid, "a" * 64), None)
        tx.insert_step(_step(eid, "b" * 64, occurrence=1), None)
        tx.append(eid, T0, [("execution.noted", {})])
    done = T0 + timedelta(seconds=5)
    with store.transaction(lock=eid) as tx:
        seq = tx.append(eid, done, [("step.succeeded", {"step_id": "a" * 64, "usage": {"input_tokens": 3}})],
                        outcome=("a" * 64, {"status": StepStatus.SUCCEEDED, "result": {"ok": "é"},
                                            "completed_at": done, "usage_input": 3, "usage_output": 4}))
        assert seq == 2
        tx.append(eid, done, [("execution.noted", {}), ("step.failed", {"step_id": "b" * 64})],
                  outcome=("b" * 64, {"status": StepStatus.FAILED, "error": {"m": 1}, "completed_at": done}))
    with store.transaction(lock=eid) as tx:  # already terminal: the outcome is not overwritten
        tx.append(eid, done, [("step.failed", {"step_id": "a" * 64})],
                  outcome=("a" * 64, {"status": StepStatus.FAILED, "error": "late", "completed_at": done}))
    with store.read() as tx:
        a, b = tx.get_step(eid, "a" * 64), tx.get_step(eid, "b" * 64)
        assert a is not None and a.status == StepStatus.SUCCEEDED and a.result == {"ok": "é"}
        assert a.completed_at == done and (a.usage_input, a.usage_output) == (3, 4)
        assert b is not None and b.status == StepStatus.FAILED and b.error == {"m": 1}
        rows = {r.step_id: r for r in tx.conn.execute(t.steps.select().where(t.steps.c.execution_id == eid))}
        assert rows["a" * 64].outcome_seq == 2 and rows["b" * 64].outcome_seq == 4
    assert _seqs(store, eid) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError), store.transaction(lock=eid) as tx:
        tx.append(eid, done, [("execution.noted", {})], outcome=("b" * 64, {"status": StepStatus.FAILED}))
