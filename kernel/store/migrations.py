"""Numbered schema migrations with a version table (`regent migrate`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable

from kernel.store import tables as t
from kernel.store.base import SqlStore


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[Connection], None]


def _initial(conn: Connection) -> None:
    # 001 is the schema as declared in tables.py. Until the first release it is edited in place;
    # from then on every change is a new numbered migration with explicit DDL.
    core = [
        t.agents,
        t.policy_revisions,
        t.executions,
        t.events,
        t.steps,
        t.approvals,
        t.dispatches,
        t.dispatch_step_counters,
        t.api_keys,
    ]
    t.metadata.create_all(conn, tables=core)


# The kernel default lease (REGENT_DISPATCH_LEASE_TIMEOUT, docs/configuration.md). A migration
# cannot see the running configuration, so rows whose agent has no lease of its own get this one.
_DEFAULT_LEASE_SECONDS = 120


def _dispatch_lease_expiry(conn: Connection) -> None:
    # 002: the lease expiry on the dispatch row, indexed, so the reaper selects expired rows in SQL
    # instead of filtering the oldest in-flight rows in Python (which long live leases could fill).
    # On a database 001 created from the current tables.py the columns and index exist already.
    have = {c["name"] for c in inspect(conn).get_columns("dispatches")}
    ts = t.UTCDateTime().compile(dialect=conn.dialect)
    if "lease_ms" not in have:
        conn.execute(text("ALTER TABLE dispatches ADD COLUMN lease_ms INTEGER"))
    if "lease_expires_at" not in have:
        conn.execute(text(f"ALTER TABLE dispatches ADD COLUMN lease_expires_at {ts}"))
    if "ix_dispatches_lease" not in {i["name"] for i in inspect(conn).get_indexes("dispatches")}:
        conn.execute(text("CREATE INDEX ix_dispatches_lease ON dispatches (status, lease_expires_at)"))
    # Backfill the rows in flight now: the period is the agent's lease, else the 120 s default
    # (see _DEFAULT_LEASE_SECONDS), and the expiry locked_at + that period; no locked_at, no expiry
    # (the reaper treats such a row as expired, as it always has).
    conn.execute(text(
        "UPDATE dispatches SET lease_ms = 1000 * COALESCE(("
        " SELECT agents.lease_timeout_seconds FROM executions JOIN agents ON agents.id = executions.agent_id"
        " WHERE executions.id = dispatches.execution_id), :default)"
        " WHERE status = 'in_flight' AND lease_ms IS NULL"
    ), {"default": _DEFAULT_LEASE_SECONDS})
    if conn.dialect.name == "sqlite":  # UTCDateTime is `YYYY-MM-DD HH:MM:SS.ffffff` text there
        expiry = "strftime('%Y-%m-%d %H:%M:%f', locked_at, '+' || (lease_ms / 1000.0) || ' seconds') || '000'"
    else:
        expiry = "locked_at + lease_ms * interval '1 millisecond'"
    conn.execute(text(
        f"UPDATE dispatches SET lease_expires_at = {expiry}"
        " WHERE status = 'in_flight' AND lease_expires_at IS NULL AND locked_at IS NOT NULL"
    ))


def _add_columns(conn: Connection, table: str, columns: dict[str, str]) -> None:
    have = {c["name"] for c in inspect(conn).get_columns(table)}
    for name, ddl in columns.items():
        if name not in have:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {ddl}"))


def _audit(conn: Connection) -> None:
    # 003 (docs/audit.md): the durable decisions table, the approval's context, the content hash of
    # every bundle revision, the credential that created an execution, API key expiry and use.
    # Explicit DDL; a database 001 created from the current tables.py has all of it already.
    ts = t.UTCDateTime().compile(dialect=conn.dialect)
    _add_columns(conn, "policy_revisions", {"content_hash": "VARCHAR(64) NOT NULL DEFAULT ''"})
    _add_columns(conn, "executions", {"created_by": "VARCHAR(36)"})
    _add_columns(conn, "approvals", {
        "agent_id": "VARCHAR(200)", "kind": "TEXT", "target": "TEXT", "rule_id": "TEXT", "reason": "TEXT",
        "policy_hash": "VARCHAR(64)", "credential": "VARCHAR(16)",
    })
    _add_columns(conn, "api_keys", {"expires_at": ts, "created_by": "TEXT", "last_used_at": ts})
    rows = conn.execute(text("SELECT id, content FROM policy_revisions WHERE content_hash = ''")).all()
    for rid, content in rows:  # SHA-256 of the stored text (sql_audit.content_hash); no portable SQL one
        digest = hashlib.sha256(str(content).encode("utf-8")).hexdigest()
        conn.execute(text("UPDATE policy_revisions SET content_hash = :h WHERE id = :id"), {"h": digest, "id": rid})
    if not inspect(conn).has_table("decisions"):
        conn.execute(text(
            "CREATE TABLE decisions ("
            " id VARCHAR(36) NOT NULL PRIMARY KEY, agent_id VARCHAR(200) NOT NULL,"
            " execution_id VARCHAR(36) NOT NULL, step_id VARCHAR(64), kind TEXT NOT NULL, target TEXT NOT NULL,"
            " decision VARCHAR(24) NOT NULL, rule_id TEXT NOT NULL, reason TEXT,"
            " policy_kind VARCHAR(16) NOT NULL, policy_revision TEXT NOT NULL, policy_hash VARCHAR(64) NOT NULL,"
            f" decided_by TEXT, credential VARCHAR(16), event_seq BIGINT, decided_at {ts} NOT NULL)"
        ))
    have = {i["name"] for i in inspect(conn).get_indexes("decisions")}
    for name, cols in _DECISION_INDEXES.items():
        if name not in have:
            conn.execute(text(f"CREATE INDEX {name} ON decisions ({cols})"))
    if "ix_policy_revisions_hash" not in {i["name"] for i in inspect(conn).get_indexes("policy_revisions")}:
        conn.execute(text("CREATE INDEX ix_policy_revisions_hash ON policy_revisions (agent_id, content_hash)"))


_DECISION_INDEXES = {
    "ix_decisions_time": "decided_at, id",
    "ix_decisions_agent": "agent_id, decided_at, id",
    "ix_decisions_rule": "rule_id, decided_at, id",
    "ix_decisions_decision": "decision, decided_at, id",
    "ix_decisions_target": "target, decided_at, id",
    "ix_decisions_policy_hash": "policy_hash, decided_at, id",
}


_EXECUTION_COLUMNS_003 = (
    ("session", "VARCHAR(200)"),
    ("parent_execution_id", "VARCHAR(36)"),
    ("spawned_step_id", "VARCHAR(64)"),
    ("previous_execution_id", "VARCHAR(36)"),
    ("state", "TEXT"),
    ("forked_from", "VARCHAR(36)"),
    ("fork_seq", "BIGINT NOT NULL DEFAULT 0"),
    ("fork_bundle_id", "INTEGER"),
    ("suspended", "BOOLEAN NOT NULL DEFAULT false"),
)


def _sessions_and_forks(conn: Connection) -> None:
    # 004: sessions (one running execution per session), sub-agents, forks and resources: eight
    # columns on executions (all nullable or defaulted, so existing rows need no backfill), their
    # indexes, and three tables. A database 001 created from the current tables.py has them already.
    have = {c["name"] for c in inspect(conn).get_columns("executions")}
    for name, ddl in _EXECUTION_COLUMNS_003:
        if name not in have:
            conn.execute(text(f"ALTER TABLE executions ADD COLUMN {name} {ddl}"))
    indexes = {i["name"] for i in inspect(conn).get_indexes("executions")}
    if "ix_executions_session" not in indexes:
        conn.execute(text("CREATE INDEX ix_executions_session ON executions (session, status, id)"))
    if "ix_executions_parent" not in indexes:
        conn.execute(text("CREATE INDEX ix_executions_parent ON executions (parent_execution_id)"))
    t.metadata.create_all(conn, tables=[t.fork_bundles, t.resources, t.resource_checkpoints])


def _shadow_bundles(conn: Connection) -> None:
    # 005: shadow (candidate) bundles, their tallies and disagreements, and the policy audit trail
    # (docs/policy-rollout.md). New tables only; 001 does not create them, so a fresh database
    # gets them here too.
    for table in (t.policy_shadows, t.shadow_tallies, t.shadow_disagreements, t.policy_events):
        table.create(conn, checkfirst=True)


def _step_outcome_seq(conn: Connection) -> None:
    # 006: the seq of each step's outcome event, which a fork's lineage reads instead of copying
    # its source's history (docs/api.md, "Forks"). One nullable column; existing terminal steps
    # are backfilled from their outcome events in one UPDATE … FROM (one pass over the events).
    have = {c["name"] for c in inspect(conn).get_columns("steps")}
    if "outcome_seq" not in have:
        conn.execute(text("ALTER TABLE steps ADD COLUMN outcome_seq BIGINT"))
    step_id = "json_extract(payload, '$.step_id')" if conn.dialect.name == "sqlite" else "(payload::json ->> 'step_id')"
    conn.execute(text(
        "UPDATE steps SET outcome_seq = o.seq FROM ("
        f"  SELECT execution_id, {step_id} AS step_id, MAX(event_seq) AS seq FROM events"
        "  WHERE type IN ('step.succeeded', 'step.failed', 'step.denied')"
        f"  GROUP BY execution_id, {step_id}"
        ") AS o WHERE steps.execution_id = o.execution_id AND steps.step_id = o.step_id"
        " AND steps.outcome_seq IS NULL"
    ))


def _decision_rollup(conn: Connection) -> None:
    # 007: the audit chart's hourly counts (docs/audit.md, "The chart"). New tables only, filled
    # from the decisions table as hours close; nothing to backfill here.
    for table in (t.decision_rollup, t.decision_rollup_hours):
        table.create(conn, checkfirst=True)


def _decision_journal(conn: Connection) -> None:
    # 008 (docs/audit.md): decision records are written to the journal and moved into `decisions`
    # in batches; the judge's record on a decision row; an index for the execution filter.
    _add_columns(conn, "decisions", {"judge": "TEXT"})
    t.decision_journal.create(conn, checkfirst=True)
    if "ix_decisions_execution" not in {i["name"] for i in inspect(conn).get_indexes("decisions")}:
        conn.execute(text("CREATE INDEX ix_decisions_execution ON decisions (execution_id, decided_at, id)"))


def _request_signatures(conn: Connection) -> None:
    # 009: the signed agent mutations the replicas accepted (the shared replay guard). UNLOGGED on
    # PostgreSQL: written on every mutation, worth no WAL; a server crash empties it, which reopens
    # replays for at most one signature window (docs/deployment.md).
    table = t.request_signatures
    if inspect(conn).has_table(table.name):
        return
    ddl = str(CreateTable(table).compile(dialect=conn.dialect))
    if conn.dialect.name == "postgresql":
        ddl = ddl.replace("CREATE TABLE", "CREATE UNLOGGED TABLE", 1)
    conn.execute(text(ddl))
    for index in table.indexes:
        index.create(conn)


_RESOURCE_COLUMNS_010 = (
    ("executions", "restoration", "TEXT"),
    ("resources", "registered_seq", "BIGINT NOT NULL DEFAULT 0"),
    ("resource_checkpoints", "superseded_seq", "BIGINT"),
)


def _resources(conn: Connection) -> None:
    # 010: resources and checkpoints in use (docs/api.md, "Resources and checkpoints"): a fork's
    # restoration, the seq a resource was registered at and the seq a checkpoint stopped covering.
    # Nullable or defaulted columns; the tables (004) had no rows before this version.
    for table, name, ddl in _RESOURCE_COLUMNS_010:
        if name not in {c["name"] for c in inspect(conn).get_columns(table)}:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {ddl}"))


def _judged_decisions(conn: Connection) -> None:
    # 011 (docs/audit.md): a partial index over the records of judge rules, for `judged=true`.
    if "ix_decisions_judged" not in {i["name"] for i in inspect(conn).get_indexes("decisions")}:
        conn.execute(text("CREATE INDEX ix_decisions_judged ON decisions (decided_at, id) WHERE judge IS NOT NULL"))


def _approval_bundle(conn: Connection) -> None:
    # 012 (docs/audit.md): the bundle that asked for an approval in full (its kind and revision
    # beside its hash), so the events a grant, deny, expiry or cancel writes name it as every
    # decision event does. Nullable columns; pending approvals are backfilled from the stored
    # revision with their hash (the ones a later answer reads); decided ones keep what they have.
    _add_columns(conn, "approvals", {"policy_kind": "VARCHAR(16)", "policy_revision": "TEXT"})
    for column, source in (("policy_kind", "kind"), ("policy_revision", "revision")):
        conn.execute(text(
            f"UPDATE approvals SET {column} = (SELECT r.{source} FROM policy_revisions r"
            " WHERE r.agent_id = approvals.agent_id AND r.content_hash = approvals.policy_hash"
            " ORDER BY r.seq DESC LIMIT 1)"
            f" WHERE status = 'pending' AND policy_hash IS NOT NULL AND {column} IS NULL"
        ))


_SWEEP_INDEXES_013 = (
    ("executions", "ix_executions_created", "status, created_at"),
    ("executions", "ix_executions_suspended", "suspended"),
    ("approvals", "ix_approvals_due", "status, timeout_at"),
    ("approvals", "ix_approvals_execution", "execution_id"),
)


def _sweep_indexes(conn: Connection) -> None:
    # 013 (docs/architecture.md, "Query plans at scale"): the sweeps' selects were full scans. On a
    # store of 10^5 executions retention scanned the executions table inside its write transaction
    # each pass, and the approval expiry sweep and retention's delete scanned the approvals table;
    # the repair sweep read every live execution to find the suspended ones.
    for table, name, columns in _SWEEP_INDEXES_013:
        if name not in {i["name"] for i in inspect(conn).get_indexes(table)}:
            conn.execute(text(f"CREATE INDEX {name} ON {table} ({columns})"))


def _steps_by_key_only(conn: Connection) -> None:
    # 014 (bench/journal/2026-12-05-postgres-peer.md): ix_steps_execution (execution_id) duplicated
    # the first column of the steps' unique key, and PostgreSQL's generic plan of a submit's read
    # chose it, then filtered the execution's every step for the one at the call's key: a submit
    # read all the steps its execution had recorded. Every lookup by execution uses the unique
    # index's first column; a step insert now writes two indexes instead of three.
    conn.execute(text("DROP INDEX IF EXISTS ix_steps_execution"))


def _inbox_index(conn: Connection) -> None:
    # 015 (docs/architecture.md, "Query plans at scale"): the inbox page polls its stamp every few
    # seconds, and the stamp's latest decision time (`max(decided_at)`) and the recently decided
    # list read the whole approvals table: 10^4 rows on a store a year old, one more every
    # approval answered. `ix_approvals_decided` answers both from its end.
    if "ix_approvals_decided" not in {i["name"] for i in inspect(conn).get_indexes("approvals")}:
        conn.execute(text("CREATE INDEX ix_approvals_decided ON approvals (decided_at, id)"))


def _mcp_tool_pins(conn: Connection) -> None:
    # 016 (docs/mcp.md, "Pinned tool definitions"): the MCP tools' offered and approved definitions,
    # held by the kernel so every gateway replica reads the same approvals. A new table only.
    t.mcp_tool_pins.create(conn, checkfirst=True)


def _steps_keyed_by_execution(conn: Connection) -> None:
    # 017 (docs/architecture.md, "Query plans at scale"): the steps' primary key was step_id alone,
    # a content hash, so every step insert landed on a random leaf of its index. On PostgreSQL
    # (shared_buffers 128 MB) a store of 10^6 executions / 1.1x10^7 events read ~1 block of
    # steps_pkey per round trip (empty store: 0.01) and wrote 0.84-2.2 WAL full-page images per
    # round trip after each checkpoint (empty: 0): a round trip 1.16-1.22x slower than on an empty
    # store. Keyed (execution_id, step_id), inserts land at the right edge (UUIDv7 execution ids).
    pk = inspect(conn).get_pk_constraint("steps")
    if list(pk["constrained_columns"]) == ["execution_id", "step_id"]:
        return  # a store created at this schema (001 creates tables.py's declaration)
    if conn.dialect.name == "postgresql":
        conn.execute(text(
            f'ALTER TABLE steps DROP CONSTRAINT "{pk["name"]}", ADD PRIMARY KEY (execution_id, step_id)'
        ))
        # Both keys lead with execution_id: without statistics the planner can price the new key's
        # prefix as low as the unique key's full match and walk an execution's steps for a submit
        # (docs/architecture.md). Statistics now, not at autovacuum's first pass.
        conn.execute(text("ANALYZE steps"))
        return
    # SQLite cannot alter a primary key: rebuild the table (create, copy, drop, rename). No table
    # references steps, and steps has no index besides its keys (014 dropped the last one).
    ddl = str(CreateTable(t.steps).compile(dialect=conn.dialect)).strip()
    conn.execute(text(ddl.replace("CREATE TABLE steps ", "CREATE TABLE steps_017 ", 1)))
    have = {c["name"] for c in inspect(conn).get_columns("steps")}
    columns = ", ".join(c.name for c in t.steps.c if c.name in have)
    conn.execute(text(f"INSERT INTO steps_017 ({columns}) SELECT {columns} FROM steps"))
    conn.execute(text("DROP TABLE steps"))
    conn.execute(text("ALTER TABLE steps_017 RENAME TO steps"))


# 018's partial indexes: (name, column, SQLite predicate, PostgreSQL predicate), as tables.py declares.
_PARTIAL_018 = (
    ("ix_executions_parent", "parent_execution_id", "parent_execution_id IS NOT NULL", None),
    ("ix_executions_deadline_at", "deadline_at", "deadline_at IS NOT NULL", None),
    ("ix_executions_suspended", "suspended", "suspended = 1", "suspended"),
)


def _executions_room_to_update(conn: Connection) -> None:
    # 018 (docs/architecture.md, "Query plans at scale"): on PostgreSQL a store of 10^6 executions
    # read 1.8 executions heap blocks and ~0.5 blocks of each of the parent, deadline and suspended
    # indexes per round trip in its first seconds (an empty store: none), a round trip 1.28x as
    # slow. VACUUM leaves a few hundred bytes free at the end of most heap pages and the free space
    # map offers them: an update of a running execution's row (every step moves its event seq) that
    # found no room on its own page went to one of those old pages, read from disk, and the next
    # update of the row found no room there either, so none was a HOT update. Each such update also
    # wrote an index entry for its NULL parent, NULL deadline and false `suspended` at its new
    # tuple's place in the heap: a random leaf of each index. A fillfactor of 90 keeps a tenth of
    # every page the executions table fills from now on for its rows' updates (HOT, on the page),
    # and a new version needs that much room elsewhere, which the old pages' ends do not offer;
    # the three indexes now hold only the rows that have a parent, a deadline or are suspended.
    if conn.dialect.name == "postgresql":
        conn.execute(text("ALTER TABLE executions SET (fillfactor = 90)"))
    for name, column, sqlite_where, pg_where in _PARTIAL_018:
        where = pg_where if conn.dialect.name == "postgresql" and pg_where else sqlite_where
        # A store 001 created at this schema has them partial already: rebuilt on an empty table.
        conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
        conn.execute(text(f"CREATE INDEX {name} ON executions ({column}) WHERE {where}"))


MIGRATIONS: list[Migration] = [
    Migration(1, "initial schema", _initial),
    Migration(2, "dispatch lease expiry", _dispatch_lease_expiry),
    Migration(3, "audit: decisions, approval context, bundle hashes, key metadata", _audit),
    Migration(4, "sessions, sub-agents, forks and resources", _sessions_and_forks),
    Migration(5, "shadow bundles and the policy audit trail", _shadow_bundles),
    Migration(6, "step outcome seqs (fork lineage)", _step_outcome_seq),
    Migration(7, "hourly decision counts for the audit chart", _decision_rollup),
    Migration(8, "decision journal, judge on decision records", _decision_journal),
    Migration(9, "request signatures seen (the shared replay guard)", _request_signatures),
    Migration(10, "resources and checkpoints", _resources),
    Migration(11, "an index of judge rules' decision records", _judged_decisions),
    Migration(12, "the bundle that asked for an approval: kind and revision", _approval_bundle),
    Migration(13, "indexes for the sweeps: retention, approval expiry, suspended parents", _sweep_indexes),
    Migration(14, "steps: no index on execution_id alone (the unique key's leads with it)", _steps_by_key_only),
    Migration(15, "an index of approvals by decision time (the inbox's poll)", _inbox_index),
    Migration(16, "MCP tool pins held by the kernel", _mcp_tool_pins),
    Migration(17, "steps keyed (execution_id, step_id): inserts at the index's right edge", _steps_keyed_by_execution),
    Migration(18, "executions: room on the page for its updates; partial parent, deadline, suspended indexes",
              _executions_room_to_update),
]
LATEST = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table("regent_schema_version"):
        return 0
    v = conn.execute(select(t.schema_version.c.version).order_by(t.schema_version.c.version.desc())).first()
    return int(v[0]) if v else 0


def migrate(store: SqlStore) -> list[Migration]:
    """Apply every pending migration, each in its own transaction. Returns what was applied."""
    applied: list[Migration] = []
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            # Replicas starting together must not race each other through DDL.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended('regent_migrate', 0))"))
        t.metadata.create_all(conn, tables=[t.schema_version])
        have = current_version(conn)
        for m in MIGRATIONS:
            if m.version <= have:
                continue
            m.apply(conn)
            conn.execute(t.schema_version.insert().values(version=m.version, applied_at=datetime.now(UTC)))
            applied.append(m)
    return applied
