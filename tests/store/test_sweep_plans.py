"""The sweeps' statements answer from an index, never a full scan of executions or approvals:
retention's select of expired executions and its deletes by execution, and the approval expiry
sweep's select. On a store a year old (bench/scale.py) those scans ran on every pass, inside
retention's write transaction. EXPLAIN on SQLite without statistics (the kernel never runs ANALYZE)
and on PostgreSQL with sequential scans discouraged, so only a missing index can produce one."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, insert

from kernel.store import SqlStore
from kernel.store import tables as t

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EID = "00000000-0000-4000-8000-000000000001"


def _seed(store: SqlStore) -> None:
    """One expired terminal execution with a step, an event, an approval and a dispatch."""
    with store.engine.begin() as c:
        c.execute(insert(t.agents), [{"id": "a", "webhook_url": "http://127.0.0.1:9/h", "secret": "s",
                                      "registered_at": T0}])
        c.execute(insert(t.executions), [{"id": EID, "agent_id": "a", "status": "completed", "last_event_seq": 1, "usage_input": 0, "usage_output": 0, "fork_seq": 0, "suspended": False,
                                          "created_at": T0, "updated_at": T0}])
        c.execute(insert(t.events), [{"execution_id": EID, "event_seq": 1, "type": "execution.completed",
                                      "payload": "{}", "occurred_at": T0}])
        c.execute(insert(t.approvals), [{"id": "00000000-0000-4000-8000-0000000000a1", "step_id": "s" * 64,
                                         "execution_id": EID, "status": "granted", "timeout_at": T0,
                                         "created_at": T0}])


def _captured(store: SqlStore, run: Callable[[], Any]) -> Iterator[tuple[str, Any]]:
    got: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        if re.search(r"\b(executions|approvals)\b", statement) and not statement.lstrip().upper().startswith(
                ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")):
            got.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        run()
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    return iter(got)


def _plan(store: SqlStore, statement: str, params: Any) -> str:
    with store.engine.connect() as c:
        raw = c.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        if store.dialect == "sqlite":
            cur.execute("EXPLAIN QUERY PLAN " + statement, params)
            return "\n".join(str(row[-1]) for row in cur.fetchall())
        cur.execute("SET enable_seqscan = off")
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        plan = json.dumps(cur.fetchone()[0])
        cur.execute("RESET enable_seqscan")
        raw.rollback()
    return plan


def _full_scans(store: SqlStore, plan: str) -> list[str]:
    """The plan's full scans of executions or approvals (SQLite: `SCAN x` with no index)."""
    if store.dialect == "sqlite":
        return [ln for ln in plan.splitlines()
                if re.match(r"SCAN (executions|approvals|other)\b", ln) and "USING" not in ln]
    return re.findall(r'"Node Type": "Seq Scan", [^}]*?"Relation Name": "(executions|approvals)"', plan)


def _assert_no_full_scan(store: SqlStore, run: Callable[[], Any], bounded_by: str) -> None:
    """No full scan, and the first statement's index range is bounded by the `bounded_by` column
    (an index on the filter's first column alone would walk every row of that status)."""
    statements = list(_captured(store, run))
    assert statements, "the sweep ran no statement on executions or approvals"
    for i, (statement, params) in enumerate(statements):
        plan = _plan(store, statement, params)
        assert _full_scans(store, plan) == [], plan
        if i == 0:
            bound = rf"{bounded_by}<" if store.dialect == "sqlite" else rf'"Index Cond": "[^"]*\b{bounded_by} <'
            assert re.search(bound, plan), plan


def test_retention_selects_and_deletes_expired_executions_without_scanning_a_table(store: SqlStore) -> None:
    _seed(store)

    def run() -> None:
        with store.transaction() as tx:
            assert tx.delete_terminal_executions_before(T0 + timedelta(days=1), 200) == 1

    _assert_no_full_scan(store, run, "created_at")


def test_the_approval_expiry_sweep_selects_due_approvals_without_scanning_the_table(store: SqlStore) -> None:
    _seed(store)

    def run() -> None:
        with store.read() as tx:
            tx.expired_approvals(T0 + timedelta(days=1), 100)

    _assert_no_full_scan(store, run, "timeout_at")


def test_the_console_status_counts_read_bounded_index_ranges_not_the_whole_table(store: SqlStore) -> None:
    from kernel.core import timeline
    from kernel.core.kernel import Kernel

    _seed(store)
    k = Kernel(store=store)

    def run() -> None:
        timeline.execution_page(k, agent_id=None, status=None, created_from=None, created_to=None, cursor=None,
                                limit=50)

    counts = [(s, p) for s, p in _captured(store, run) if "count(" in s.lower()]
    assert counts, "the page counted nothing"
    for statement, params in counts:
        plan = _plan(store, statement, params)
        assert _full_scans(store, plan) == [], plan
        if store.dialect == "sqlite":  # `SEARCH … (status=?)`, not `SCAN … USING COVERING INDEX`
            assert all(ln.startswith("SEARCH") for ln in plan.splitlines() if "executions" in ln), plan
        else:
            assert re.search(r'"Index Cond": "[^"]*\bstatus\b', plan), plan
        # Each reads at most 1 001 entries: at 10 001 a view of the store of 10^6 read about 30 000
        # against 17 000 at 10^5 (three statuses past the cap against one; bench/scale.py, p99
        # 1.6x SQLite, 2.25x PostgreSQL). Fails before the cap came down to 1 000.
        bounds = [v for v in (params.values() if isinstance(params, dict) else params) if isinstance(v, int)]
        assert bounds and max(bounds) <= 1_001, (statement, params)


def test_the_decision_journal_flush_reuses_its_statements_so_their_cache_keys_are_computed_once(
        store: SqlStore) -> None:
    seen: list[list[Any]] = []

    def grab(conn: Any, clauseelement: Any, multiparams: Any, params: Any, options: Any) -> None:
        seen[-1].append(clauseelement)

    event.listen(store.engine, "before_execute", grab)
    try:
        for _ in range(2):
            seen.append([])
            with store.transaction() as tx:
                tx.flush_decision_journal(1000)
    finally:
        event.remove(store.engine, "before_execute", grab)
    first, second = seen
    assert first and len(first) == len(second)
    assert all(a is b for a, b in zip(first, second, strict=True))


def test_the_repair_sweep_finds_suspended_parents_from_an_index_not_every_live_execution(store: SqlStore) -> None:
    _seed(store)

    def run() -> None:
        with store.read() as tx:
            tx.suspended_parents_ready(100)

    (statement, params), *_ = list(_captured(store, run))
    plan = _plan(store, statement, params)
    assert _full_scans(store, plan) == [], plan
    if store.dialect == "sqlite":
        assert re.search(r"(SEARCH|SCAN) (executions|other) USING (COVERING )?INDEX ix_executions_suspended", plan), plan
    else:  # partial (migration 018): the index's predicate is the condition, so it has no Index Cond
        assert '"Index Name": "ix_executions_suspended"' in plan, plan


def test_the_parent_and_deadline_lookups_read_their_partial_indexes(store: SqlStore) -> None:
    """Migration 018 made ix_executions_parent and ix_executions_deadline_at partial (`IS NOT
    NULL`): SQLite uses such an index only when the query compares the column, PostgreSQL when it
    can prove the predicate. Every statement that looks executions up by parent or deadline must
    still read its index, never the table."""
    _seed(store)

    def run() -> None:
        with store.read() as tx:
            tx.children(EID)
            tx.children_ids([EID])
            tx.live_children(EID)
            tx.cancelled_with_live_children(100)
            tx.execution_ids_past_deadline(T0, 100)

    statements = list(_captured(store, run))
    assert len(statements) == 5, statements
    for (statement, params), index in zip(statements, ["ix_executions_parent"] * 4 + ["ix_executions_deadline_at"],
                                          strict=True):
        plan = _plan(store, statement, params)
        assert _full_scans(store, plan) == [], plan
        if store.dialect == "sqlite":
            assert re.search(rf"USING (COVERING )?INDEX {index}\b", plan), (statement, plan)
        else:
            assert f'"Index Name": "{index}"' in plan, (statement, plan)


def test_the_inbox_poll_reads_the_latest_decision_from_an_index_not_the_approvals_table(store: SqlStore) -> None:
    """The inbox page polls `approvals_stamp` every few seconds; its `max(decided_at)` and the
    recently decided list read every approval (SQLite: `SEARCH approvals` with no index; PostgreSQL:
    a Seq Scan) before migration 015's `ix_approvals_decided`. Fails before it."""
    _seed(store)

    def run() -> None:
        with store.read() as tx:
            tx.approvals_stamp()
            tx.recently_decided_approvals(20)

    statements = list(_captured(store, run))
    assert len(statements) >= 3
    for statement, params in statements:
        plan = _plan(store, statement, params)
        if store.dialect == "sqlite":
            unindexed = [ln for ln in plan.splitlines()
                         if re.match(r"(SCAN|SEARCH) approvals\b", ln) and "USING" not in ln]
        else:
            unindexed = _full_scans(store, plan)
        assert unindexed == [], plan
