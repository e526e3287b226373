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
from kernel.store.prepared import Prepared
from kernel.store.statements import (
    APPEND_WITH_EVENTS,
    GET_STEP,
    LENT_STEP,
    OUTCOME_CONTEXT,
    SET_OUTCOME_SEQ,
    SUBMIT_CONTEXT,
    UPDATE_STEP,
)

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


def _steps_access(store: SqlStore, stmt: Prepared = SUBMIT_CONTEXT, params: dict[str, Any] = PARAMS) -> str:
    """How a statement (the submit's read unless told) reaches the steps table: SQLite's plan
    lines, PostgreSQL's plan nodes."""
    with store.engine.connect() as c:
        raw: Any = c.connection.driver_connection
        if store.dialect == "sqlite":
            plan = stmt._plan(c)
            cur = raw.cursor()
            cur.execute("EXPLAIN QUERY PLAN " + plan.sql, plan.params(params))
            return "\n".join(str(row[-1]) for row in cur.fetchall() if " steps " in f" {row[-1]} ")
        compiled: Any = stmt.stmt.compile(dialect=PGDialect_psycopg(paramstyle="numeric_dollar"))
        names = list(compiled.positiontup)
        values = {**compiled.params, **params}
        cur = ClientCursor(raw)
        cur.execute("PREPARE submit_context AS " + compiled.string)
        cur.execute("SET plan_cache_mode = force_generic_plan")
        args = ", ".join(["%s"] * len(names))
        cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE submit_context({args})", [values[n] for n in names])
        row = cur.fetchone()
        assert row is not None
        found = []

        def walk(node: dict[str, Any]) -> None:
            if node.get("Relation Name") == "steps" and node["Node Type"] != "ModifyTable":
                found.append(f"{node['Node Type']} {node.get('Index Name')}: {node.get('Index Cond')}")
            for sub in node.get("Plans", ()):
                walk(sub)

        walk(row[0][0]["Plan"])
        cur.execute("DEALLOCATE submit_context")  # the next statement's PREPARE takes the name
        raw.rollback()  # the SET goes with the transaction
        return "\n".join(found)


def test_a_submits_read_finds_its_step_by_the_unique_key_not_among_the_executions_steps(store: SqlStore) -> None:
    _seed(store)
    access = _steps_access(store)
    assert access, "the plan does not read the steps table"
    # Every column of the key bounds the lookup: the index is the unique one, not execution_id's alone.
    for column in ("execution_id", "kind", "target", "args_hash", "occurrence"):
        assert column in access, access
    assert "ix_steps_execution" not in access, access


SID = f"{7:064x}"


def test_a_steps_lookup_by_id_and_its_outcome_update_probe_the_primary_key_execution_then_step(
        store: SqlStore) -> None:
    """Migration 017 (issue 33): steps are keyed (execution_id, step_id) and every statement that
    reads or updates a step by id binds its execution, so it is one probe of that key, in the
    generic plan too: the submit's read of a step by id (a collision's check), the outcome's read,
    its step update (PostgreSQL: in the events' one statement; SQLite: UPDATE_STEP), an outcome
    seq's mark and a fork's lent step. No index leads with step_id alone: a statement that bound
    only the step id would scan the table. Before 017 the key was step_id alone, a content hash:
    each insert hit a random leaf (~1 steps_pkey block read per round trip on a store of 10^6
    executions, against 0.01 on an empty one)."""
    _seed(store)
    if store.dialect == "postgresql":
        # With no statistics and this table's 200 rows, PostgreSQL estimates one row for
        # `execution_id = $1` on the unique key as on the primary key: a tie, which goes to the
        # index created last (here the unique key, filtering step_id; after 017's ALTER on an old
        # store, the primary key, and then the submit's read above filters the other way).
        # Measured: with 5 000 rows and no statistics, or once analyzed (autovacuum analyzes a
        # table after 50 rows + 10%), every case takes steps_pkey. A known hazard (the branch's
        # report): a store's first minute, before autovacuum's first ANALYZE of steps.
        with store.engine.begin() as c:
            c.exec_driver_sql("ANALYZE steps")
    outcome = (("updated_at",), 1, None, None, False, (0, ("completed_at", "status")))
    cases: list[tuple[str, Prepared, dict[str, Any]]] = [
        ("get_step", GET_STEP, {"execution_id": EID, "id": SID}),
        ("outcome_context", OUTCOME_CONTEXT, {"execution_id": EID, "dispatch_id": DID, "step_id": SID}),
        ("update_step", UPDATE_STEP.get(("completed_at", "status")),
         {"_execution_id": EID, "_id": SID, "completed_at": T0, "status": "succeeded"}),
        ("set_outcome_seq", SET_OUTCOME_SEQ, {"_execution_id": EID, "_id": SID, "seq": 2}),
        ("lent_step", LENT_STEP, {"execution_id": EID, "id": SID, "cutoff": 5}),
    ]
    if store.dialect == "postgresql":
        cases.append(("append(outcome=)", APPEND_WITH_EVENTS.get(outcome),
                      {"_id": EID, "_n": 1, "updated_at": T0, "type_0": "step.succeeded", "payload_0": "{}",
                       "u__id": SID, "u_completed_at": T0, "u_status": "succeeded"}))
    for name, stmt, params in cases:
        access = _steps_access(store, stmt, params)
        assert access, (name, "the plan does not read the steps table")
        for line in access.splitlines():
            if store.dialect == "sqlite":
                assert line.startswith("SEARCH steps USING") and "(execution_id=? AND step_id=?)" in line, (
                    name, access)
            else:
                assert line.startswith("Index Scan steps_pkey") and "execution_id" in line and "step_id" in line, (
                    name, access)
