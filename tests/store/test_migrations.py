"""Schema migrations on SQLite and PostgreSQL: a database at the previous version migrates in place.

Each test gets an empty database of its own (PostgreSQL: not the session one other tests truncate),
since these tests change the schema itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from kernel.domain import Agent, Dispatch, DispatchStatus, Execution, ExecutionStatus
from kernel.ids import new_uuid7
from kernel.store import SqlStore, open_store
from kernel.store import tables as t
from kernel.store.migrations import LATEST, current_version, migrate
from tests.conftest import scratch_pg_database

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        s = open_store(f"sqlite:///{tmp_path}/regent.db")
        yield s
        s.close()
        return
    with scratch_pg_database("regent_mig", migrated=False) as url:
        s = open_store(url)
        try:
            yield s
        finally:
            s.close()


def _at_version_1(store: SqlStore) -> None:
    """The schema as version 1 left it: dispatches without the lease expiry columns and index."""
    migrate(store)
    with store.engine.begin() as c:
        c.execute(text("DROP INDEX ix_dispatches_lease"))
        c.execute(text("ALTER TABLE dispatches DROP COLUMN lease_expires_at"))
        c.execute(text("ALTER TABLE dispatches DROP COLUMN lease_ms"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 1))
        assert current_version(c) == 1


def _in_flight(store: SqlStore, agent_id: str, locked_at: datetime | None,
               status: DispatchStatus = DispatchStatus.IN_FLIGHT) -> str:
    """An execution of the agent with one dispatch, written with the version-1 columns only."""
    eid, did = new_uuid7(), new_uuid7()
    with store.transaction(lock=eid) as tx:
        tx.insert_execution(Execution(id=eid, agent_id=agent_id, input=None, status=ExecutionStatus.RUNNING,
                                      created_at=T0, updated_at=T0))
        tx.insert_dispatch(Dispatch(id=did, execution_id=eid, status=DispatchStatus.PENDING, attempt=0,
                                    max_attempts=5, next_attempt_at=T0, created_at=T0, updated_at=T0))
        tx.set_dispatch(did, T0, status=status, attempt=1, locked_by="r1", locked_at=locked_at)
    return did


def _lease(store: SqlStore, did: str) -> tuple[int | None, datetime | None]:
    c = t.dispatches.c
    with store.read() as tx:
        row = tx.conn.execute(select(c.lease_ms, c.lease_expires_at).where(c.id == did)).one()
    return row[0], row[1]


def test_fresh_database_migrates_to_latest_and_again_is_a_no_op(empty_store: SqlStore) -> None:
    assert [m.version for m in migrate(empty_store)] == list(range(1, LATEST + 1))
    assert LATEST >= 2
    assert migrate(empty_store) == []
    with empty_store.engine.connect() as c:
        assert current_version(c) == LATEST


def test_version_1_database_migrates_and_in_flight_rows_get_a_backfilled_lease_expiry(
    empty_store: SqlStore,
) -> None:
    store = empty_store
    _at_version_1(store)
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="own", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0,
                              lease_timeout_seconds=30))
        tx.upsert_agent(Agent(id="dflt", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
    own = _in_flight(store, "own", T0)
    dflt = _in_flight(store, "dflt", T0 + timedelta(seconds=5))
    unlocked = _in_flight(store, "own", None)
    pending = _in_flight(store, "own", None, status=DispatchStatus.PENDING)

    assert [m.version for m in migrate(store)] == list(range(2, LATEST + 1))
    with store.engine.connect() as c:
        assert current_version(c) == LATEST
    assert _lease(store, own) == (30_000, T0 + timedelta(seconds=30))  # the agent's own lease
    # no lease of its own: the 120 s default the migration documents
    assert _lease(store, dflt) == (120_000, T0 + timedelta(seconds=125))
    assert _lease(store, unlocked) == (30_000, None)
    assert _lease(store, pending) == (None, None)  # not in flight: its next claim sets both

    with store.read() as tx:
        due = tx.expired_leases(T0 + timedelta(seconds=30), 120, 100)
        assert [d for d, _, _ in due] == [unlocked, own]  # no expiry counts as expired, first
        assert {d for d, _, _ in tx.expired_leases(T0 + timedelta(seconds=125), 120, 100)} == {unlocked, own, dflt}
    # the migrated row renews like a claimed one: the expiry moves on by its period
    later = T0 + timedelta(seconds=29)
    with store.read() as tx:
        d = tx.get_dispatch(own)
    assert d is not None
    with store.transaction(lock=d.execution_id) as tx:
        assert tx.renew_lease(own, d.execution_id, 1, later)
    assert _lease(store, own) == (30_000, later + timedelta(seconds=30))


def _at_version_2(store: SqlStore) -> None:
    """The schema as version 2 left it: no decisions table, no approval context, no bundle content
    hash, no execution creator, no API key expiry or use."""
    migrate(store)
    with store.engine.begin() as c:
        c.execute(text("DROP TABLE decisions"))
        c.execute(text("DROP INDEX ix_policy_revisions_hash"))
        for table, cols in (
            ("policy_revisions", ["content_hash"]),
            ("executions", ["created_by"]),
            ("approvals", ["agent_id", "kind", "target", "rule_id", "reason", "policy_hash", "credential"]),
            ("api_keys", ["expires_at", "created_by", "last_used_at"]),
        ):
            for col in cols:
                c.execute(text(f"ALTER TABLE {table} DROP COLUMN {col}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 2))
        c.execute(text(
            "INSERT INTO agents (id, webhook_url, secret, registered_at) VALUES ('a', 'http://127.0.0.1:9/h', 's', :t)"
        ), {"t": T0.replace(tzinfo=None) if store.dialect == "sqlite" else T0})
        for seq, content in ((1, "rules: []\n"), (2, "default_action: deny\n")):
            c.execute(text(
                "INSERT INTO policy_revisions (agent_id, seq, kind, revision, content, active, created_at)"
                " VALUES ('a', :seq, 'yaml', 'r', :content, :active, :t)"
            ), {"seq": seq, "content": content, "active": seq == 2,
                "t": T0.replace(tzinfo=None) if store.dialect == "sqlite" else T0})
        assert current_version(c) == 2


def test_version_2_database_migrates_to_the_audit_schema_and_backfills_bundle_hashes(empty_store: SqlStore) -> None:
    import hashlib

    from sqlalchemy import inspect

    store = empty_store
    _at_version_2(store)
    assert [m.version for m in migrate(store)] == list(range(3, LATEST + 1))
    with store.engine.connect() as c:
        insp = inspect(c)
        assert insp.has_table("decisions")
        assert {i["name"] for i in insp.get_indexes("decisions")} >= {
            "ix_decisions_time", "ix_decisions_agent", "ix_decisions_rule", "ix_decisions_decision",
            "ix_decisions_target", "ix_decisions_policy_hash",
        }
        assert {"agent_id", "kind", "target", "rule_id", "reason", "policy_hash", "credential"} <= {
            col["name"] for col in insp.get_columns("approvals")}
        assert "created_by" in {col["name"] for col in insp.get_columns("executions")}
        assert {"expires_at", "created_by", "last_used_at"} <= {col["name"] for col in insp.get_columns("api_keys")}
        hashes = dict(c.execute(text("SELECT seq, content_hash FROM policy_revisions ORDER BY seq")).all())
    assert hashes == {1: hashlib.sha256(b"rules: []\n").hexdigest(),
                      2: hashlib.sha256(b"default_action: deny\n").hexdigest()}
    # the migrated revision decides with its hash, and the decisions table takes rows
    with store.read() as tx:
        assert tx.active_policy_ref("a").content_hash == hashes[2]
        assert tx.policy_revision_by_hash("a", hashes[1]).seq == 1
        assert tx.list_decisions({}, since=None, until=None, before=None, limit=10) == []


_SESSION_COLUMNS = ["session", "parent_execution_id", "spawned_step_id", "previous_execution_id", "state",
                    "forked_from", "fork_seq", "fork_bundle_id", "suspended"]


def _at_version_3(store: SqlStore) -> str:
    """The schema as version 3 left it: no session, tree or fork columns, no fork bundles or
    resources; one execution written then. Returns its id."""
    migrate(store)
    eid = new_uuid7()
    with store.engine.begin() as c:
        c.execute(text("DROP INDEX ix_executions_session"))
        c.execute(text("DROP INDEX ix_executions_parent"))
        c.execute(text("DROP INDEX ix_executions_suspended"))  # 012's, on a column version 4 added
        for table in ("resource_checkpoints", "resources", "fork_bundles"):
            c.execute(text(f"DROP TABLE {table}"))
        for col in _SESSION_COLUMNS:
            c.execute(text(f"ALTER TABLE executions DROP COLUMN {col}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 3))
        at = T0.replace(tzinfo=None) if store.dialect == "sqlite" else T0
        c.execute(text(
            "INSERT INTO agents (id, webhook_url, secret, registered_at) VALUES ('old', 'http://127.0.0.1:9/h', 's', :t)"
        ), {"t": at})
        c.execute(text(
            "INSERT INTO executions (id, agent_id, input, status, last_event_seq, usage_input, usage_output,"
            " created_at, updated_at) VALUES (:id, 'old', 'null', 'running', 0, 0, 0, :t, :t)"
        ), {"id": eid, "t": at})
        assert current_version(c) == 3
    return eid


def test_version_3_database_migrates_to_sessions_and_old_executions_read_with_defaults(empty_store: SqlStore) -> None:
    from sqlalchemy import inspect

    store = empty_store
    eid = _at_version_3(store)
    assert [m.version for m in migrate(store)] == list(range(4, LATEST + 1))
    with store.engine.connect() as c:
        insp = inspect(c)
        assert set(_SESSION_COLUMNS) <= {col["name"] for col in insp.get_columns("executions")}
        assert {"ix_executions_session", "ix_executions_parent"} <= {i["name"] for i in insp.get_indexes("executions")}
        assert all(insp.has_table(name) for name in ("fork_bundles", "resources", "resource_checkpoints"))
    with store.read() as tx:
        e = tx.get_execution(eid)
        assert e is not None
        assert (e.session, e.parent_execution_id, e.fork_seq, e.suspended, e.state) == (None, None, 0, False, None)
        assert not tx.session_occupied("any") and tx.children(eid) == []


_SHADOW_TABLES = ("policy_shadows", "shadow_tallies", "shadow_disagreements", "policy_events")


def test_version_4_database_migrates_and_gets_the_shadow_tables(empty_store: SqlStore) -> None:
    from sqlalchemy import inspect

    store = empty_store
    migrate(store)
    with store.engine.begin() as c:
        for name in reversed(_SHADOW_TABLES):
            c.execute(text(f"DROP TABLE {name}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 4))
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
    assert [m.version for m in migrate(store)][:1] == [5]
    with store.engine.connect() as c:
        names = set(inspect(c).get_table_names())
        assert set(_SHADOW_TABLES) <= names
        assert "ix_shadow_disagreements_shadow" in {i["name"] for i in inspect(c).get_indexes("shadow_disagreements")}
    with store.transaction(lock="shadow:1") as tx:  # the new tables take rows
        sid = tx.add_shadow("a", "yaml", "r1", "rules: []\n", T0, "alice")
        tx.add_shadow_tallies(sid, {("agreed", "allow", "allow"): 2})
        tx.add_shadow_tallies(sid, {("agreed", "allow", "allow"): 3})
        tx.add_policy_event("a", "policy.shadow_set", T0, actor="alice", credential="api_key", shadow_id=sid)
    with store.read() as tx:
        assert [tuple(r) for r in tx.shadow_tallies(sid)] == [("agreed", "allow", "allow", 5)]
        assert [r.type for r in tx.policy_events("a", 10)] == ["policy.shadow_set"]


def test_version_5_database_migrates_and_backfills_the_step_outcome_seqs(empty_store: SqlStore) -> None:
    """006 adds `steps.outcome_seq` (a fork's lineage reads it) and fills it for the steps that
    already had an outcome, from their outcome events; a step without one stays NULL."""
    store = empty_store
    migrate(store)
    eid = new_uuid7()
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
        tx.insert_execution(Execution(id=eid, agent_id="a", input=None, status=ExecutionStatus.RUNNING,
                                      created_at=T0, updated_at=T0))
    with store.engine.begin() as c:
        c.execute(text("ALTER TABLE steps DROP COLUMN outcome_seq"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 5))
        at = T0.replace(tzinfo=None) if store.dialect == "sqlite" else T0
        for sid, status in (("s-done", "succeeded"), ("s-denied", "denied"), ("s-open", "executing")):
            c.execute(text(
                "INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency,"
                " usage_input, usage_output) VALUES (:sid, :eid, 'tool_call', :tg, 'h', 0, :st, 'safe_to_retry', 0, 0)"
            ), {"sid": sid, "tg": sid, "eid": eid, "st": status})
        log = [("step.proposed", "s-done"), ("step.succeeded", "s-done"), ("step.proposed", "s-open"),
               ("step.proposed", "s-denied"), ("step.denied", "s-denied")]
        for seq, (typ, sid) in enumerate(log, start=1):
            c.execute(text(
                "INSERT INTO events (execution_id, event_seq, type, payload, occurred_at) VALUES (:e, :q, :ty, :p, :t)"
            ), {"e": eid, "q": seq, "ty": typ, "p": f'{{"step_id": "{sid}", "step_type": "tool_call"}}', "t": at})
    assert [m.version for m in migrate(store)][:1] == [6]
    with store.engine.connect() as c:
        got = dict(c.execute(text("SELECT step_id, outcome_seq FROM steps WHERE execution_id = :e"), {"e": eid}).all())
    assert got == {"s-done": 2, "s-denied": 5, "s-open": None}


def test_version_6_database_migrates_and_gets_the_decision_rollup_tables(empty_store: SqlStore) -> None:
    from datetime import timedelta

    from sqlalchemy import inspect

    store = empty_store
    migrate(store)
    with store.engine.begin() as c:
        for name in ("decision_rollup_hours", "decision_rollup"):
            c.execute(text(f"DROP TABLE {name}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 6))
    assert [m.version for m in migrate(store)][:1] == [7]
    with store.engine.connect() as c:
        assert {"decision_rollup", "decision_rollup_hours"} <= set(inspect(c).get_table_names())
    hour = T0.replace(minute=0, second=0, microsecond=0)
    with store.transaction() as tx:  # the new tables take rows and sum them back
        tx.insert_rollup([hour], [(hour, "a", "denied", "default", "0" * 64, 3)], T0)
    with store.read() as tx:
        assert tx.rollup_hours(hour, hour + timedelta(hours=1)) == {hour}
        assert tx.sum_rollup({"decision": "denied"}, hour, hour + timedelta(hours=1)) == [(hour, "denied", 3)]


def test_version_9_database_migrates_to_resources_in_use(empty_store: SqlStore) -> None:
    """010 adds a fork's `restoration`, a resource's `registered_seq` and a checkpoint's
    `superseded_seq`; an execution written before reads with no restoration."""
    from sqlalchemy import inspect

    store = empty_store
    migrate(store)
    eid = new_uuid7()
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
        tx.insert_execution(Execution(id=eid, agent_id="a", input=None, status=ExecutionStatus.RUNNING,
                                      created_at=T0, updated_at=T0))
    with store.engine.begin() as c:
        for table, col in (("executions", "restoration"), ("resources", "registered_seq"),
                           ("resource_checkpoints", "superseded_seq")):
            c.execute(text(f"ALTER TABLE {table} DROP COLUMN {col}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 9))
    assert [m.version for m in migrate(store)] == list(range(10, LATEST + 1))
    with store.engine.connect() as c:
        insp = inspect(c)
        assert "restoration" in {col["name"] for col in insp.get_columns("executions")}
        assert "registered_seq" in {col["name"] for col in insp.get_columns("resources")}
        assert "superseded_seq" in {col["name"] for col in insp.get_columns("resource_checkpoints")}
    with store.read() as tx:
        e = tx.get_execution(eid)
        assert e is not None and e.restoration is None
        assert tx.list_resources(eid) == []


def test_version_7_database_migrates_to_the_decision_journal_and_the_judged_index(empty_store: SqlStore) -> None:
    """008 adds `decisions.judge`, the journal and the execution index; 011 the partial index of
    judge rules' records. A record written before reads with no judge."""
    from sqlalchemy import inspect

    store = empty_store
    migrate(store)
    with store.engine.begin() as c:
        c.execute(text("DROP TABLE decision_journal"))
        c.execute(text("DROP INDEX ix_decisions_execution"))
        c.execute(text("DROP INDEX ix_decisions_judged"))
        c.execute(text("ALTER TABLE decisions DROP COLUMN judge"))
        c.execute(text(
            "INSERT INTO decisions (id, agent_id, execution_id, kind, target, decision, rule_id, policy_kind,"
            " policy_revision, policy_hash, decided_at) VALUES ('d1', 'a', 'e1', 'tool_call', 't', 'allowed',"
            " 'r', 'yaml', 'r1', '', :at)"), {"at": T0})
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 7))
    assert [m.version for m in migrate(store)] == list(range(8, LATEST + 1))
    with store.engine.connect() as c:
        insp = inspect(c)
        assert "judge" in {col["name"] for col in insp.get_columns("decisions")}
        assert insp.has_table("decision_journal")
        assert {"ix_decisions_execution", "ix_decisions_judged"} <= {i["name"] for i in insp.get_indexes("decisions")}
    with store.read() as tx:
        [r] = tx.list_decisions({}, since=None, until=None, before=None, limit=10)
    assert (r.id, r.judge) == ("d1", None)


def test_version_11_database_migrates_and_pending_approvals_get_the_bundle_that_asked(empty_store: SqlStore) -> None:
    """012 adds the asking bundle's kind and revision to approvals; pending ones are filled in from
    the stored revision with their hash, decided ones are left as they are."""
    from kernel.domain import Approval, ApprovalStatus

    store = empty_store
    migrate(store)
    eid = new_uuid7()
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
        tx.add_policy_revision("a", "yaml", "rev-1", "rules: []\n", T0)
        digest = tx.active_policy("a").content_hash
        tx.insert_execution(Execution(id=eid, agent_id="a", input=None, status=ExecutionStatus.BLOCKED,
                                      created_at=T0, updated_at=T0))
        for aid, status in (("00000000-0000-7000-8000-000000000001", ApprovalStatus.PENDING),
                            ("00000000-0000-7000-8000-000000000002", ApprovalStatus.GRANTED)):
            tx.insert_approval(Approval(id=aid, step_id="s" + aid[-1], execution_id=eid, status=status, approvers=[],
                                        message=None, timeout_at=T0, created_at=T0, agent_id="a",
                                        policy_hash=digest))
    with store.engine.begin() as c:
        for col in ("policy_kind", "policy_revision"):
            c.execute(text(f"ALTER TABLE approvals DROP COLUMN {col}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 11))
    assert [m.version for m in migrate(store)] == list(range(12, LATEST + 1))
    with store.read() as tx:
        got = {a.id[-1]: (a.policy_kind, a.policy_revision) for a in tx.list_approvals(None, execution_id=eid)}
    assert got == {"1": ("yaml", "rev-1"), "2": (None, None)}


def test_version_12_database_migrates_and_gets_the_sweeps_indexes(empty_store: SqlStore) -> None:
    from sqlalchemy import inspect

    store = empty_store
    migrate(store)
    names = (("executions", "ix_executions_created"), ("executions", "ix_executions_suspended"),
             ("approvals", "ix_approvals_due"), ("approvals", "ix_approvals_execution"))
    with store.engine.begin() as c:
        for _, name in names:
            c.execute(text(f"DROP INDEX {name}"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 12))
    assert [m.version for m in migrate(store)] == list(range(13, LATEST + 1))
    with store.engine.connect() as c:
        for table, name in names:
            assert name in {i["name"] for i in inspect(c).get_indexes(table)}


def test_version_15_database_migrates_and_gets_the_mcp_tool_pins_table(empty_store: SqlStore) -> None:
    from sqlalchemy import inspect

    from kernel.domain import ToolApproval

    store = empty_store
    migrate(store)
    with store.engine.begin() as c:
        c.execute(text("DROP TABLE mcp_tool_pins"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 15))
        assert not inspect(c).has_table("mcp_tool_pins")
    assert [m.version for m in migrate(store)] == list(range(16, LATEST + 1))
    with store.transaction() as tx:  # the new table takes rows
        tx.upsert_agent(Agent(id="files", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
        tx.put_tool_offer("files", "fs_read", "fs", "a" * 64, {"name": "read"}, T0, exists=False)
        tx.put_tool_approval("files", "fs_read", ToolApproval("a" * 64, "alice", "key", "api", T0))
    with store.read() as tx:
        [pin] = tx.tool_pins("files")
    assert pin.state == "approved" and pin.approved is not None and pin.approved.by == "alice"


# The steps table as 016 left it: keyed by step_id alone (SQLite cannot alter a primary key).
_STEPS_016_SQLITE = """CREATE TABLE steps_016 (
    step_id VARCHAR(64) NOT NULL, execution_id VARCHAR(36) NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL,
    args_hash VARCHAR(64) NOT NULL, occurrence INTEGER NOT NULL, status VARCHAR(20) NOT NULL,
    idempotency TEXT NOT NULL, args TEXT, result TEXT, error TEXT, usage_input BIGINT NOT NULL,
    usage_output BIGINT NOT NULL, started_at DATETIME, completed_at DATETIME, outcome_seq BIGINT,
    PRIMARY KEY (step_id), UNIQUE (execution_id, kind, target, args_hash, occurrence),
    FOREIGN KEY(execution_id) REFERENCES executions (id) ON DELETE CASCADE
)"""


def test_version_16_database_migrates_and_steps_are_keyed_by_execution_then_step(empty_store: SqlStore) -> None:
    """017 rekeys steps (execution_id, step_id): every row is kept, the unique key of a step's
    identity and the foreign key to executions stay, and no index on step_id alone is left."""
    from sqlalchemy import inspect

    from kernel.domain import Step, StepStatus
    from kernel.errors import StoreConflict

    store = empty_store
    migrate(store)
    eids = [new_uuid7(), new_uuid7()]
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
        for eid in eids:
            tx.insert_execution(Execution(id=eid, agent_id="a", input=None, status=ExecutionStatus.RUNNING,
                                          created_at=T0, updated_at=T0))
    with store.engine.begin() as c:
        if store.dialect == "postgresql":
            c.execute(text("ALTER TABLE steps DROP CONSTRAINT steps_pkey, ADD PRIMARY KEY (step_id)"))
        else:
            c.execute(text(_STEPS_016_SQLITE))
            c.execute(text("DROP TABLE steps"))
            c.execute(text("ALTER TABLE steps_016 RENAME TO steps"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 16))
        assert inspect(c).get_pk_constraint("steps")["constrained_columns"] == ["step_id"]
    rows = [Step(step_id=f"{i}{eid[-4:]}".ljust(64, "0"), execution_id=eid, kind="tool_call", target=f"t{i}",
                 args_hash="h", occurrence=0, status=StepStatus.SUCCEEDED, idempotency="safe_to_retry",
                 started_at=T0, completed_at=T0)
            for eid in eids for i in range(3)]
    with store.transaction() as tx:
        for s in rows:
            tx.insert_step(s, '{"x": 1}')
    assert [m.version for m in migrate(store)] == list(range(17, LATEST + 1))
    with store.engine.connect() as c:
        i = inspect(c)
        assert i.get_pk_constraint("steps")["constrained_columns"] == ["execution_id", "step_id"]
        assert [u["column_names"] for u in i.get_unique_constraints("steps")] == [
            ["execution_id", "kind", "target", "args_hash", "occurrence"]]
        assert [(f["referred_table"], f["constrained_columns"]) for f in i.get_foreign_keys("steps")] == [
            ("executions", ["execution_id"])]
        assert all(x["column_names"][:1] != ["step_id"] for x in i.get_indexes("steps"))
    with store.read() as tx:
        for s in rows:
            got = tx.get_step(s.execution_id, s.step_id)
            assert got is not None and (got.target, got.status, got.started_at) == (s.target, s.status, T0)
    with pytest.raises(StoreConflict), store.transaction() as tx:  # the unique key still holds
        tx.insert_step(dataclasses.replace(rows[0], step_id="z" * 64), None)


def _executions_indexes(store: SqlStore) -> dict[str, str]:
    """index name → its definition as the store holds it."""
    with store.engine.connect() as c:
        if store.dialect == "postgresql":
            q = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'executions'"
        else:
            q = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'executions'"
        return {str(n): str(d or "") for n, d in c.execute(text(q)).all()}


def test_version_17_database_migrates_to_partial_executions_indexes_and_room_to_update(empty_store: SqlStore) -> None:
    """018 rebuilds the parent, deadline and suspended indexes partial (only the rows that have
    one, or are suspended), keeps what they answer, and on PostgreSQL leaves a tenth of each new
    executions page for its rows' updates."""
    store = empty_store
    migrate(store)
    with store.engine.begin() as c:
        for name, column in (("ix_executions_parent", "parent_execution_id"),
                             ("ix_executions_deadline_at", "deadline_at"), ("ix_executions_suspended", "suspended")):
            c.execute(text(f"DROP INDEX {name}"))
            c.execute(text(f"CREATE INDEX {name} ON executions ({column})"))
        if store.dialect == "postgresql":
            c.execute(text("ALTER TABLE executions RESET (fillfactor)"))
        c.execute(t.schema_version.delete().where(t.schema_version.c.version > 17))
    assert all(" WHERE " not in d.upper() for n, d in _executions_indexes(store).items()
               if n in ("ix_executions_parent", "ix_executions_deadline_at", "ix_executions_suspended"))
    parent, child = new_uuid7(), new_uuid7()
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/h", secret="s", registered_at=T0))
        tx.insert_execution(Execution(id=parent, agent_id="a", input=None, status=ExecutionStatus.RUNNING,
                                      created_at=T0, updated_at=T0))
        tx.insert_execution(Execution(id=child, agent_id="a", input=None, status=ExecutionStatus.RUNNING,
                                      created_at=T0, updated_at=T0, parent_execution_id=parent,
                                      deadline_at=T0 + timedelta(minutes=1)))
    with store.engine.begin() as c:
        c.execute(t.executions.update().where(t.executions.c.id == parent).values(suspended=True))

    assert [m.version for m in migrate(store)] == list(range(18, LATEST + 1))
    defs = _executions_indexes(store)
    assert "parent_execution_id IS NOT NULL" in defs["ix_executions_parent"]
    assert "deadline_at IS NOT NULL" in defs["ix_executions_deadline_at"]
    assert " WHERE " in defs["ix_executions_suspended"].upper()
    with store.read() as tx:
        assert [e.id for e in tx.children(parent)] == [child]
        assert tx.execution_ids_past_deadline(T0 + timedelta(minutes=2), 10) == [child]
        assert tx.suspended_parents_ready(10) == []  # its child is live
    if store.dialect == "postgresql":
        with store.engine.connect() as c:
            opts = c.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'executions'")).scalar()
        assert opts == ["fillfactor=90"]
