"""Filters and paging over 100 000 decisions answer from an index: EXPLAIN shows no full scan of
the decisions table for any filter, the time range, or a later page, on PostgreSQL and on SQLite.
(The journal beside it, one flush interval's records, is read whole by design: docs/audit.md.)"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from kernel.core import audit
from kernel.core.audit import DecisionQuery
from kernel.core.kernel import Kernel
from kernel.store import SqlStore, open_store
from kernel.store import tables as t
from kernel.store.migrations import migrate
from tests.conftest import scratch_pg_database

pytestmark = [pytest.mark.timeout(300)]
ROWS = 100_000
T0 = datetime(2026, 11, 1, tzinfo=UTC)


COLUMNS = ("id, agent_id, execution_id, step_id, kind, target, decision, rule_id, reason, policy_kind,"
           " policy_revision, policy_hash, decided_by, credential, event_seq, decided_at")
HASH_1 = "0" * 63 + "1"
EXECUTION_123 = f"{123:036x}"


def _load_postgres(store: SqlStore) -> None:
    with store.engine.begin() as c:
        c.execute(text(
            f"INSERT INTO decisions ({COLUMNS})"
            " SELECT lpad(to_hex(i), 36, '0'), 'agent-' || (i % 20), lpad(to_hex(i / 10), 36, '0'), NULL,"
            " 'tool_call', 'target-' || (i % 500),"
            " (ARRAY['allowed','denied','awaiting_approval','rate_limited'])[1 + i % 4],"
            " 'rule-' || (i % 50), NULL, 'yaml', 'r', lpad(to_hex(i % 7), 64, '0'), NULL, NULL, i % 10,"
            " :t0 + i * interval '1 second'"
            " FROM generate_series(1, :n) AS i"
        ), {"t0": T0, "n": ROWS})
        c.execute(text("ANALYZE decisions"))


def _load_sqlite(store: SqlStore) -> None:
    # The same rows from a recursive CTE; UTCDateTime is `YYYY-MM-DD HH:MM:SS.ffffff` text there.
    with store.engine.begin() as c:
        c.execute(text(
            f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :n)"
            f" INSERT INTO decisions ({COLUMNS})"
            " SELECT printf('%036x', i), 'agent-' || (i % 20), printf('%036x', i / 10), NULL,"
            " 'tool_call', 'target-' || (i % 500),"
            " CASE i % 4 WHEN 0 THEN 'allowed' WHEN 1 THEN 'denied' WHEN 2 THEN 'awaiting_approval'"
            " ELSE 'rate_limited' END,"
            " 'rule-' || (i % 50), NULL, 'yaml', 'r', printf('%064x', i % 7), NULL, NULL, i % 10,"
            " strftime('%Y-%m-%d %H:%M:%f', :t0, '+' || i || ' seconds') || '000'"
            " FROM n"
        ), {"t0": T0.strftime("%Y-%m-%d %H:%M:%S"), "n": ROWS})
        c.execute(text("ANALYZE"))


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def big(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStore]:
    """100 000 decision rows written in one INSERT … SELECT (generate_series or a recursive CTE;
    seconds), and a few in the journal, as a running kernel has between two flushes."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            store = open_store(f"sqlite:///{tmp_path_factory.mktemp('decisions')}/regent.db")
            migrate(store)
            _load_sqlite(store)
        else:
            store = open_store(stack.enter_context(scratch_pg_database("regent_decisions")))
            _load_postgres(store)
        stack.callback(store.close)
        yield store


def _statement(store: SqlStore, q: DecisionQuery) -> tuple[str, Any]:
    """The statement list_decisions runs for `q` (the store's own query builder), and its parameters."""
    captured: list[Any] = []
    from sqlalchemy import event

    def grab(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "decisions" in statement:
            captured.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        audit.list_decisions(Kernel(store=store), q)
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    [(statement, params)] = captured
    return statement, params


def _plan(store: SqlStore, q: DecisionQuery) -> str:
    """EXPLAIN (FORMAT JSON) on PostgreSQL, EXPLAIN QUERY PLAN lines on SQLite."""
    statement, params = _statement(store, q)
    with store.engine.connect() as c:
        raw = c.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        if store.dialect == "sqlite":
            cur.execute("EXPLAIN QUERY PLAN " + statement, params)
            return "\n".join(str(row[-1]) for row in cur.fetchall())
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        plan = cur.fetchone()[0]
    return json.dumps(plan)


def _nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, list):
        for p in plan:
            yield from _nodes(p)
    elif isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _nodes(value)


def _assert_indexed(store: SqlStore, plan: str, index: str = "ix_decisions_") -> None:
    """No full scan of `decisions` (the journal's is allowed), and an index of ours answers."""
    if store.dialect == "sqlite":
        # A full scan reads `SCAN decisions`; an index walk `SCAN decisions USING INDEX ix_…` or `SEARCH …`.
        scans = [line for line in plan.splitlines() if "decisions" in line and "decision_journal" not in line]
        assert scans and all("USING INDEX ix_decisions_" in line or "USING COVERING INDEX ix_decisions_" in line
                             for line in scans), plan
    else:
        seq = [n for n in _nodes(json.loads(plan)) if n["Node Type"] == "Seq Scan"]
        assert all(n.get("Relation Name") == "decision_journal" for n in seq), plan
    assert index in plan, plan


QUERIES = {
    "newest page": DecisionQuery(limit=50),
    "agent": DecisionQuery(agent_id="agent-3"),
    "decision": DecisionQuery(decision="denied"),
    "rule id": DecisionQuery(rule_id="rule-7"),
    "target": DecisionQuery(target="target-42"),
    "policy hash": DecisionQuery(policy_hash=HASH_1),
    "time range": DecisionQuery(since=T0 + timedelta(hours=3), until=T0 + timedelta(hours=4)),
    "agent and time range": DecisionQuery(agent_id="agent-3", since=T0 + timedelta(hours=20)),
    "rule and decision": DecisionQuery(rule_id="rule-8", decision="denied"),
    "execution": DecisionQuery(execution_id=EXECUTION_123),
    "judged": DecisionQuery(judged=True),
}


@pytest.mark.parametrize("name", list(QUERIES), ids=list(QUERIES))
def test_decision_filters_answer_from_an_index_without_a_full_scan(big: SqlStore, name: str) -> None:
    _assert_indexed(big, _plan(big, QUERIES[name]), "ix_decisions_judged" if name == "judged" else "ix_decisions_")


def test_a_later_page_answers_from_the_index_too(big: SqlStore) -> None:
    k = Kernel(store=big)
    page = audit.list_decisions(k, DecisionQuery(rule_id="rule-7", limit=100))
    for _ in range(5):
        assert page.next_cursor is not None
        page = audit.list_decisions(k, DecisionQuery(rule_id="rule-7", limit=100, cursor=page.next_cursor))
    assert len(page.decisions) == 100 and all(r.rule_id == "rule-7" for r in page.decisions)
    _assert_indexed(big, _plan(big, DecisionQuery(rule_id="rule-7", limit=100, cursor=page.next_cursor)),
                    "ix_decisions_rule")


def test_the_table_holds_the_rows_the_test_claims(big: SqlStore) -> None:
    with big.engine.connect() as c:
        assert c.execute(text(f"SELECT count(*) FROM {t.decisions.name}")).scalar_one() == ROWS
