"""Filters and paging over 100 000 decisions answer from an index: EXPLAIN on PostgreSQL shows no
sequential scan of the decisions table for any filter, the time range, or a later page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from kernel.core import decisions
from kernel.core.decisions import DecisionQuery
from kernel.core.kernel import Kernel
from kernel.store import SqlStore, open_store
from kernel.store import tables as t
from tests.conftest import scratch_pg_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]
ROWS = 100_000
T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def big() -> Iterator[SqlStore]:
    """100 000 decision rows written in one INSERT … SELECT FROM generate_series (seconds)."""
    with scratch_pg_database("regent_decisions") as url:
        store = open_store(url)
        with store.engine.begin() as c:
            c.execute(text(
                "INSERT INTO decisions (id, agent_id, execution_id, step_id, kind, target, decision, rule_id,"
                " reason, policy_kind, policy_revision, policy_hash, decided_by, credential, event_seq, decided_at)"
                " SELECT lpad(to_hex(i), 36, '0'), 'agent-' || (i % 20), lpad(to_hex(i / 10), 36, '0'), NULL,"
                " 'tool_call', 'target-' || (i % 500),"
                " (ARRAY['allowed','denied','awaiting_approval','rate_limited'])[1 + i % 4],"
                " 'rule-' || (i % 50), NULL, 'yaml', 'r', md5((i % 7)::text) || md5((i % 7)::text), NULL, NULL, i % 10,"
                " :t0 + i * interval '1 second'"
                " FROM generate_series(1, :n) AS i"
            ), {"t0": T0, "n": ROWS})
            c.execute(text("ANALYZE decisions"))
        yield store
        store.close()


def _plan(store: SqlStore, q: DecisionQuery) -> str:
    """EXPLAIN of the statement list_decisions runs for `q` (the store's own query builder)."""
    captured: list[Any] = []
    from sqlalchemy import event

    def grab(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "decisions" in statement:
            captured.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        decisions.list_decisions(Kernel(store=store), q)
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    [(statement, params)] = captured
    with store.engine.connect() as c:
        raw = c.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        plan = cur.fetchone()[0]
    return json.dumps(plan)


QUERIES = {
    "newest page": DecisionQuery(limit=50),
    "agent": DecisionQuery(agent_id="agent-3"),
    "decision": DecisionQuery(decision="denied"),
    "rule id": DecisionQuery(rule_id="rule-7"),
    "target": DecisionQuery(target="target-42"),
    "policy hash": DecisionQuery(policy_hash="c4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849b"),
    "time range": DecisionQuery(since=T0 + timedelta(hours=3), until=T0 + timedelta(hours=4)),
    "agent and time range": DecisionQuery(agent_id="agent-3", since=T0 + timedelta(hours=20)),
    "rule and decision": DecisionQuery(rule_id="rule-8", decision="denied"),
}


@pytest.mark.parametrize("name", list(QUERIES), ids=list(QUERIES))
def test_decision_filters_answer_from_an_index_without_a_full_scan(big: SqlStore, name: str) -> None:
    plan = _plan(big, QUERIES[name])
    assert '"Seq Scan"' not in plan, plan
    assert "ix_decisions_" in plan, plan


def test_a_later_page_answers_from_the_index_too(big: SqlStore) -> None:
    k = Kernel(store=big)
    page = decisions.list_decisions(k, DecisionQuery(rule_id="rule-7", limit=100))
    for _ in range(5):
        assert page.next_cursor is not None
        page = decisions.list_decisions(k, DecisionQuery(rule_id="rule-7", limit=100, cursor=page.next_cursor))
    assert len(page.decisions) == 100 and all(r.rule_id == "rule-7" for r in page.decisions)
    plan = _plan(big, DecisionQuery(rule_id="rule-7", limit=100, cursor=page.next_cursor))
    assert '"Seq Scan"' not in plan and "ix_decisions_rule" in plan, plan


def test_the_table_holds_the_rows_the_test_claims(big: SqlStore) -> None:
    with big.engine.connect() as c:
        assert c.execute(text(f"SELECT count(*) FROM {t.decisions.name}")).scalar_one() == ROWS
