"""A submit's read finds the step at the call's identity with one lookup of the steps table's unique
index (execution, kind, target, args hash, occurrence), never by walking the execution's steps.

With a second index on `execution_id` alone (ix_steps_execution, dropped in migration 014),
PostgreSQL's generic plan for the prepared statement, the one every pooled connection uses from
its sixth submit on, took that index and filtered the execution's steps: each submit read every
step the execution had recorded (the peer bench, 2026-12-05: 63 steps read per submit after ~1 000
round trips over 8 executions, growing with each one). The plan is checked as the kernel runs it:
PREPAREd, with `plan_cache_mode = force_generic_plan` on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg import ClientCursor
from sqlalchemy import insert
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from kernel.store import SqlStore
from kernel.store import tables as t
from kernel.store.statements import SUBMIT_CONTEXT

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EID = "00000000-0000-4000-8000-000000000001"
DID = "00000000-0000-4000-8000-0000000000d1"
STEPS = 200


def _seed(store: SqlStore) -> None:
    """One execution with a long history: STEPS steps of one tool, each with its own args."""
    with store.engine.begin() as c:
        c.execute(insert(t.agents), [{"id": "a", "webhook_url": "http://127.0.0.1:9/h", "secret": "s",
                                      "registered_at": T0}])
        c.execute(insert(t.executions), [{"id": EID, "agent_id": "a", "status": "running", "last_event_seq": 1,
                                          "usage_input": 0, "usage_output": 0, "fork_seq": 0, "suspended": False,
                                          "created_at": T0, "updated_at": T0}])
        c.execute(insert(t.steps), [{"step_id": f"{i:064x}", "execution_id": EID, "kind": "tool_call",
                                     "target": "bench.echo", "args_hash": f"{i:064d}", "occurrence": 0,
                                     "status": "succeeded", "idempotency": "safe_to_retry", "args": "{}",
                                     "usage_input": 0, "usage_output": 0, "started_at": T0}
                                    for i in range(STEPS)])


PARAMS = {"dispatch_id": DID, "kind": "tool_call", "target": "bench.echo", "args_hash": f"{7:064d}",
          "execution_id": EID}


def _steps_access(store: SqlStore) -> str:
    """How the submit's read reaches the steps table: SQLite's plan line, PostgreSQL's plan node."""
    with store.engine.connect() as c:
        raw: Any = c.connection.driver_connection
        if store.dialect == "sqlite":
            plan = SUBMIT_CONTEXT._plan(c)
            cur = raw.cursor()
            cur.execute("EXPLAIN QUERY PLAN " + plan.sql, plan.params(PARAMS))
            return "\n".join(str(row[-1]) for row in cur.fetchall() if " steps " in f" {row[-1]} ")
        compiled: Any = SUBMIT_CONTEXT.stmt.compile(dialect=PGDialect_psycopg(paramstyle="numeric_dollar"))
        names = list(compiled.positiontup)
        values = {**compiled.params, **PARAMS}
        cur = ClientCursor(raw)
        cur.execute("PREPARE submit_context AS " + compiled.string)
        cur.execute("SET plan_cache_mode = force_generic_plan")
        args = ", ".join(["%s"] * len(names))
        cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE submit_context({args})", [values[n] for n in names])
        row = cur.fetchone()
        assert row is not None
        found = []

        def walk(node: dict[str, Any]) -> None:
            if node.get("Relation Name") == "steps":
                found.append(f"{node['Node Type']} {node.get('Index Name')}: {node.get('Index Cond')}")
            for sub in node.get("Plans", ()):
                walk(sub)

        walk(row[0][0]["Plan"])
        raw.rollback()  # the PREPARE and the SET go with the transaction
        return "\n".join(found)


def test_a_submits_read_finds_its_step_by_the_unique_key_not_among_the_executions_steps(store: SqlStore) -> None:
    _seed(store)
    access = _steps_access(store)
    assert access, "the plan does not read the steps table"
    # Every column of the key bounds the lookup: the index is the unique one, not execution_id's alone.
    for column in ("execution_id", "kind", "target", "args_hash", "occurrence"):
        assert column in access, access
    assert "ix_steps_execution" not in access, access
