"""The round trip's combined entry reads and the cache of open Connections, on SQLite and PostgreSQL.

`Tx.submit_context` and `Tx.outcome_context` replace three reads each on the hot path; they must
answer exactly what the separate reads answer, missing rows included. The store keeps a few
Connections open between transactions; a Connection whose server session died must never be
handed out twice, and one idle for long enough goes back through the pre-pinging pool.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy.exc import DBAPIError

from kernel.domain import (
    Agent,
    Dispatch,
    DispatchStatus,
    Execution,
    ExecutionStatus,
    Step,
    StepStatus,
)
from kernel.errors import StoreUnavailable
from kernel.ids import new_uuid7
from kernel.store import SqlStore, open_store
from kernel.store.base import _IDLE_MAX
from kernel.store.migrations import migrate
from tests.support import wait_until

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HASH = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"


def _setup(store: SqlStore) -> tuple[str, str]:
    eid, did = new_uuid7(), new_uuid7()
    with store.transaction(lock=eid) as tx:
        tx.upsert_agent(Agent(id="agent", webhook_url="http://127.0.0.1:9/hook", secret="s", registered_at=T0))
        tx.insert_execution(Execution(id=eid, agent_id="agent", input={"i": 1}, status=ExecutionStatus.RUNNING,
                                      created_at=T0, updated_at=T0))
        tx.insert_dispatch(Dispatch(id=did, execution_id=eid, status=DispatchStatus.PENDING, attempt=0,
                                    max_attempts=5, next_attempt_at=T0, created_at=T0, updated_at=T0))
        tx.set_dispatch(did, T0, status=DispatchStatus.IN_FLIGHT, attempt=2, locked_by="r1", locked_at=T0)
    return eid, did


def test_submit_context_answers_what_the_three_reads_answer(store: SqlStore) -> None:
    eid, did = _setup(store)
    with store.transaction(lock=eid) as tx:
        tx.advance_counter(did, "tool_call", "shell.run", HASH, 3)
    with store.read() as tx:
        e, d, n, step = tx.submit_context(eid, did, "tool_call", "shell.run", HASH)
        assert e == tx.get_execution(eid) and d == tx.get_dispatch(did) and step is None
        assert n == tx.get_counter(did, "tool_call", "shell.run", HASH) == 3
        assert e is not None and e.input == {"i": 1} and e.status == ExecutionStatus.RUNNING
        assert d is not None and d.attempt == 2 and d.status == DispatchStatus.IN_FLIGHT
        # Another call's counter, a dispatch that does not exist, an execution that does not exist.
        assert tx.submit_context(eid, did, "tool_call", "shell.other", HASH)[2] == 0
        e2, d2, n2, _ = tx.submit_context(eid, new_uuid7(), "tool_call", "shell.run", HASH)
        assert e2 == e and d2 is None and n2 == 0
        assert tx.submit_context(new_uuid7(), did, "tool_call", "shell.run", HASH) == (None, None, 0, None)


def test_submit_context_reads_the_step_at_the_calls_identity_and_occurrence(store: SqlStore) -> None:
    """The fourth value is the step recorded for (execution, kind, target, args_hash) at the
    dispatch's occurrence counter: the step a submit's id names, read in the same statement."""
    eid, did = _setup(store)

    def step(sid: str, target: str, occurrence: int) -> Step:
        return Step(step_id=sid, execution_id=eid, kind="tool_call", target=target, args_hash=HASH,
                    occurrence=occurrence, status=StepStatus.SUCCEEDED, idempotency="safe_to_retry",
                    result={"n": occurrence}, completed_at=T0)

    with store.transaction(lock=eid) as tx:
        tx.insert_step(step("a" * 64, "shell.run", 0), None)
        tx.insert_step(step("b" * 64, "shell.run", 1), None)
        tx.insert_step(step("c" * 64, "shell.other", 1), None)
    with store.read() as tx:
        at0 = tx.submit_context(eid, did, "tool_call", "shell.run", HASH)[3]  # no counter yet: occurrence 0
        assert at0 == tx.get_step(eid, "a" * 64)
    with store.transaction(lock=eid) as tx:
        tx.advance_counter(did, "tool_call", "shell.run", HASH, 1)
    with store.read() as tx:
        assert tx.submit_context(eid, did, "tool_call", "shell.run", HASH)[2:] == (1, tx.get_step(eid, "b" * 64))
        assert tx.submit_context(eid, did, "tool_call", "shell.other", HASH)[2:] == (0, None)  # its own counter
        assert tx.submit_context(eid, did, "llm_call", "shell.run", HASH)[3] is None  # another kind
    with store.transaction(lock=eid) as tx:
        tx.advance_counter(did, "tool_call", "shell.run", HASH, 2)
    with store.read() as tx:
        assert tx.submit_context(eid, did, "tool_call", "shell.run", HASH)[2:] == (2, None)  # nothing recorded there


def test_submit_context_reads_the_agents_active_policy_ahead_for_the_decision(store: SqlStore) -> None:
    """`active_policy_ref` after a submit_context in the same transaction answers what it read
    (the agent's active revision, or None), without a statement of its own; a policy change in
    that transaction is read afresh."""
    eid, did = _setup(store)
    with store.read() as tx:
        tx.submit_context(eid, did, "tool_call", "shell.run", HASH)
        assert tx.active_policy_ref("agent") is None
    with store.transaction() as tx:
        tx.add_policy_revision("agent", "yaml", "r1", "default_action: allow\n", T0)
        tx.add_policy_revision("agent", "yaml", "r2", "default_action: deny\n", T0)
    with store.read() as tx:
        fresh = tx.active_policy_ref("agent")
    with store.transaction(lock=eid) as tx:
        tx.submit_context(eid, did, "tool_call", "shell.run", HASH)
        ahead = tx.active_policy_ref("agent")
        assert ahead is not None and fresh is not None
        assert (ahead.id, ahead.agent_id, ahead.kind, ahead.revision, ahead.content_hash) == tuple(fresh)
        assert ahead.revision == "r2"
        tx.activate_policy_revision("agent", 1)
        assert tx.active_policy_ref("agent").revision == "r1"
        assert tx.active_policy_ref("other") is None


def test_outcome_context_answers_what_the_three_reads_answer(store: SqlStore) -> None:
    eid, did = _setup(store)
    sid = "a" * 64
    with store.transaction(lock=eid) as tx:
        tx.insert_step(Step(step_id=sid, execution_id=eid, kind="tool_call", target="shell.run", args_hash=HASH,
                            occurrence=0, status=StepStatus.EXECUTING, idempotency="safe_to_retry", started_at=T0),
                       '{"cmd":"ls"}')
    with store.read() as tx:
        e, s, d = tx.outcome_context(eid, sid, did)
        assert (e, s, d) == (tx.get_execution(eid), tx.get_step(eid, sid), tx.get_dispatch(did))
        assert s is not None and s.args == {"cmd": "ls"} and s.status == StepStatus.EXECUTING
        assert tx.outcome_context(eid, "b" * 64, did) == (e, None, d)
        assert tx.outcome_context(eid, sid, new_uuid7()) == (e, s, None)
        assert tx.outcome_context(new_uuid7(), sid, did) == (None, None, None)


def test_a_failed_transaction_leaves_nothing_behind_on_the_reused_connection(store: SqlStore) -> None:
    eid, _ = _setup(store)
    with pytest.raises(RuntimeError), store.transaction(lock=eid) as tx:
        tx.set_execution(eid, T0, status=ExecutionStatus.FAILED)
        raise RuntimeError("the use case failed after writing")
    for _ in range(3):  # whichever cached Connection comes next: no open transaction, nothing kept
        with store.read() as tx:
            e = tx.get_execution(eid)
            assert e is not None and e.status == ExecutionStatus.RUNNING


def test_the_cache_stays_bounded_under_concurrent_transactions(store: SqlStore) -> None:
    eid, _ = _setup(store)
    barrier = threading.Barrier(12, timeout=30)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with store.read() as tx:
                barrier.wait()  # twelve Connections out at once
                assert tx.get_execution(eid) is not None
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    assert 1 <= len(store._idle) <= _IDLE_MAX


def _backend_pid(store: SqlStore) -> int:
    with store.read() as tx:
        return int(tx.conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _terminate(url: str, pid: int) -> None:
    admin = open_store(url)
    try:
        with admin.read() as tx:
            assert tx.conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})").scalar_one()

        def gone() -> bool:  # the server ends the session asynchronously
            with admin.read() as tx:
                return not tx.conn.exec_driver_sql(
                    f"SELECT count(*) FROM pg_stat_activity WHERE pid = {int(pid)}").scalar_one()

        wait_until(gone, f"session {pid} to end")
    finally:
        admin.close()


@pytest.mark.postgres
def test_postgres_a_connection_whose_session_died_is_dropped_not_reused(pg_database: str) -> None:
    store = open_store(pg_database)
    try:
        migrate(store)
        store.idle_fresh_seconds = 60.0  # hand the cached Connection out again without a ping
        _terminate(pg_database, _backend_pid(store))
        with pytest.raises(StoreUnavailable) as info, store.read() as tx:
            tx.get_agent("agent")
        assert isinstance(info.value.__cause__, DBAPIError) and info.value.__cause__.connection_invalidated
        with store.read() as tx:  # the dead one was not put back: a new session answers
            assert tx.get_agent("nobody") is None
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_a_stale_cached_connection_goes_back_through_the_pool_ping(pg_database: str) -> None:
    store = open_store(pg_database)
    try:
        migrate(store)
        store.idle_fresh_seconds = 0.0  # every cached Connection counts as stale
        _terminate(pg_database, _backend_pid(store))
        with store.read() as tx:  # the pool's pre-ping notices the dead session and reconnects
            assert tx.get_agent("nobody") is None
    finally:
        store.close()
