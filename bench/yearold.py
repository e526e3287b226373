"""A store a year old, written directly (not over HTTP) in a few INSERT … SELECT statements.

Shape, for `n` executions (i = 1 … n): 20 agents; each execution has 1–3 steps (i % 3 + 1, two
on average) and 3 + 4 × steps events (created, started, proposed / allowed / executing /
succeeded per step, its end): 11 per execution on average, so 10^6 executions are 1.1 × 10^7
events. One step row and one decision record per step, one retired dispatch per execution; 93 %
completed, 5 % failed, 2 % cancelled; every 100th has a granted approval, every 20th belongs to a
session (5 turns a session), every 1000th is a fork of the one before. Execution ids are UUIDv7
of their creation time, as the kernel's are (shape 2; shape 1's were random); one decision in 20 is
a denial (shape 3; before, none was). They span the last 365
days, except the first `expired` executions, which are 400–430 days old (past a 400-day
retention, for the retention figure). Secondary indexes are dropped for the load and rebuilt
after it, and the tables analysed, as `bench/audit.py` does.

Stores are cached between runs (they take minutes): SQLite files under `cache_dir()` and
PostgreSQL template databases `regent_yearold_<n>_<expired>_s<shape>`; a run copies the file or
creates its database `TEMPLATE` the cached one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, text

AGENTS = 20
RETENTION_DAYS = 400  # the kernel's REGENT_RETENTION for the scale scenario
DAY = 86400
NOW = datetime.now(UTC).replace(microsecond=0, second=0, minute=0)  # one hour a store's dates stay valid


def cache_dir() -> Path:
    d = Path(os.environ.get("REGENT_BENCH_CACHE", Path.home() / ".cache" / "regent-bench"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _age_sql(n: int, expired: int, i: str = "i") -> str:
    """Seconds before NOW that execution `i` was created."""
    return (f"CASE WHEN {i} <= {expired} THEN {430 * DAY} - {i} * {20 * DAY // max(expired, 1)} "
            f"ELSE 3600 + ({365 * DAY} * ({n} - {i})) / {max(n - expired, 1)} END")


# One decision in 20 is a denial: by the execution's random bits (SQLite: its rowid) and the step's
# number (outcome_seq 6, 10, 14 → 1, 2, 3). Shapes 1 and 2 tested outcome_seq % 20, which none of
# those is: their stores held no denied decision, so the "denied" reads paged an empty result.
_DENIED = "({h} + s.outcome_seq / 4) % 20 = 0"
_PG_RANDOM = "('x' || substr(e.id, 25, 8))::bit(32)::bigint"  # a v7 id's last group is random, not time


def _uuid7(ms: str, r: str) -> str:
    """A UUIDv7 as the kernel writes it (`kernel.ids.new_uuid7`), from SQL expressions for 12 hex
    digits of Unix milliseconds (`ms`) and at least 18 random ones (`r`): the version 7, then the
    random bits with the RFC 9562 variant. Ids in creation order sort in time order, as a real
    store's do, so the bench's new executions go to the right end of every id index."""
    return (f"substr({ms},1,8)||'-'||substr({ms},9,4)||'-7'||substr({r},1,3)||'-8'||substr({r},4,3)"
            f"||'-'||substr({r},7,12)")


# -- SQLite ------------------------------------------------------------------------------------------


def _sqlite_ts(seconds_expr: str, base: str = ":now", sign: str = "-") -> str:
    return f"strftime('%Y-%m-%d %H:%M:%S', {base}, '{sign}' || ({seconds_expr}) || ' seconds') || '.000000'"


def _build_sqlite(path: Path, n: int, expired: int) -> None:
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(f"sqlite:///{path}")
    try:
        migrate(store)
    finally:
        store.close()
    c = sqlite3.connect(path, isolation_level=None)
    try:
        c.execute("PRAGMA journal_mode=OFF")
        c.execute("PRAGMA synchronous=OFF")
        c.execute("PRAGMA cache_size=-1000000")
        c.execute("PRAGMA temp_store=MEMORY")
        ddl = [r[0] for r in c.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                                       "AND tbl_name IN ('executions','steps','decisions','approvals','dispatches')")]
        c.execute("BEGIN")
        for stmt in ddl:
            c.execute("DROP INDEX " + stmt.split(" INDEX ", 1)[1].split(" ON ", 1)[0])
        now = NOW.strftime("%Y-%m-%d %H:%M:%S")
        for a in range(AGENTS):
            c.execute("INSERT INTO agents (id, webhook_url, secret, lease_timeout_seconds, registered_at) "
                      "VALUES (?, 'http://127.0.0.1:9/webhook', 'yearold-secret', 3600, ?)", (f"agent-{a}", now + ".000000"))
        status = ("CASE WHEN i % 100 < 93 THEN 'completed' WHEN i % 100 < 98 THEN 'failed' ELSE 'cancelled' END")
        c.execute(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n), "
            f"h(i, x, ms) AS (SELECT i, lower(hex(randomblob(16))),"
            f" printf('%012x', (CAST(strftime('%s', :now) AS INTEGER) - ({_age_sql(n, expired)})) * 1000) FROM s) "
            "INSERT INTO executions (id, agent_id, input, status, output, last_event_seq, usage_input, usage_output,"
            " created_at, updated_at, session, forked_from, fork_seq, suspended) "
            f"SELECT {_uuid7('ms', 'x')},"
            " 'agent-' || (i % 20), '{\"n\":' || i || ',\"task\":\"summarise the quarterly report\"}', "
            f" {status}, '{{\"ok\":true}}', 3 + 4 * (i % 3 + 1), 0, 0,"
            f" {_sqlite_ts(_age_sql(n, expired))}, {_sqlite_ts(_age_sql(n, expired) + ' - 30')},"
            " CASE WHEN i % 20 = 0 THEN 'session-' || (i / 100) END, NULL, 0, 0 FROM h",
            {"n": n, "now": now})
        # Forks: every 1000th execution forks the one created just before it (by creation order).
        c.execute("CREATE TEMP TABLE ord AS SELECT id, row_number() OVER (ORDER BY created_at, id) AS i FROM executions")
        c.execute("CREATE INDEX temp.ord_i ON ord (i)")
        c.execute("UPDATE executions SET forked_from = (SELECT p.id FROM ord o JOIN ord p ON p.i = o.i - 1 "
                  "WHERE o.id = executions.id), fork_seq = 3 "
                  "WHERE id IN (SELECT id FROM ord WHERE i % 1000 = 999)")
        c.execute("CREATE TEMP TABLE tmpl (k INTEGER, pos INTEGER, step INTEGER, type TEXT)")
        for k in (1, 2, 3):
            rows = [(k, 1, 0, "execution.created"), (k, 2, 0, "execution.started")]
            for s in range(1, k + 1):
                for j, typ in enumerate(("step.proposed", "step.allowed", "step.executing", "step.succeeded")):
                    rows.append((k, 2 + (s - 1) * 4 + j + 1, s, typ))
            rows.append((k, 3 + 4 * k, 0, "execution.end"))
            c.executemany("INSERT INTO tmpl VALUES (?, ?, ?, ?)", rows)
        sid = "replace(e.id, '-', '') || printf('%032x', tm.step)"
        c.execute(
            "INSERT INTO events (execution_id, event_seq, type, payload, occurred_at) "
            "SELECT e.id, tm.pos, CASE tm.type WHEN 'execution.end' THEN 'execution.' || e.status ELSE tm.type END,"
            f" CASE WHEN tm.step > 0 THEN '{{\"step_id\":\"' || {sid} || '\",\"step_type\":\"tool_call\","
            "\"target\":\"tool-' || (tm.step * 7 % 50) || '\"}' ELSE '{\"agent_id\":\"' || e.agent_id || '\"}' END,"
            f" {_sqlite_ts('tm.pos', 'e.created_at', '+')} "
            "FROM executions e JOIN tmpl tm ON tm.k = (e.last_event_seq - 3) / 4 ORDER BY e.id, tm.pos")
        c.execute(
            "INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency, args,"
            " result, usage_input, usage_output, started_at, completed_at, outcome_seq) "
            f"SELECT {sid}, e.id, 'tool_call', 'tool-' || (tm.step * 7 % 50), printf('%064x', tm.step), 0,"
            " 'succeeded', 'safe_to_retry', '{\"q\":' || tm.step || '}', '{\"ok\":true}', 0, 0,"
            f" {_sqlite_ts('tm.pos', 'e.created_at', '+')}, {_sqlite_ts('tm.pos', 'e.created_at', '+')}, tm.pos "
            "FROM executions e JOIN tmpl tm ON tm.k = (e.last_event_seq - 3) / 4 AND tm.type = 'step.succeeded'")
        c.execute(
            "INSERT INTO decisions (id, agent_id, execution_id, step_id, kind, target, decision, rule_id, reason,"
            " policy_kind, policy_revision, policy_hash, decided_by, credential, event_seq, decided_at) "
            "SELECT lower(hex(randomblob(16))), e.agent_id, e.id, s.step_id, 'tool_call', s.target,"
            f" CASE WHEN {_DENIED.format(h='e.rowid')} THEN 'denied' ELSE 'allowed' END, 'rule-' || (length(s.target) % 7),"
            " NULL, 'yaml', 'r1', printf('%064x', 1), NULL, NULL, s.outcome_seq - 2, s.started_at "
            "FROM steps s JOIN executions e ON e.id = s.execution_id")
        c.execute(
            "INSERT INTO approvals (id, step_id, execution_id, status, approvers, timeout_at, decided_by, decided_at,"
            " created_at, agent_id, kind, target, rule_id, credential) "
            "SELECT lower(hex(randomblob(16))), s.step_id, e.id, 'granted', '[\"ops\"]', e.updated_at, 'ops',"
            " e.updated_at, e.created_at, e.agent_id, 'tool_call', s.target, 'rule-approve', 'key' "
            "FROM executions e JOIN steps s ON s.execution_id = e.id AND s.outcome_seq = 6 "
            "WHERE e.rowid % 100 = 7")
        c.execute(
            "INSERT INTO dispatches (id, execution_id, status, attempt, max_attempts, next_attempt_at, created_at,"
            " updated_at) SELECT lower(hex(randomblob(16))), id, 'exhausted', 1, 10, created_at, created_at,"
            " updated_at FROM executions")
        for stmt in ddl:
            c.execute(stmt)
        c.execute("COMMIT")  # no ANALYZE: the kernel never runs it, so a deployment's SQLite has no statistics
    finally:
        c.close()


# -- PostgreSQL --------------------------------------------------------------------------------------


def _build_postgres(url: str, n: int, expired: int) -> None:
    from kernel.store import open_store
    from kernel.store.migrations import migrate
    from kernel.store.postgres import driver_url

    store = open_store(url)
    try:
        migrate(store)
    finally:
        store.close()
    eng = create_engine(driver_url(url))
    try:
        with eng.begin() as c:
            tables = "('executions','steps','decisions','approvals','dispatches')"
            ddl = [r[0] for r in c.execute(text(
                f"SELECT indexdef FROM pg_indexes WHERE tablename IN {tables} AND indexname LIKE 'ix_%'"))]
            for stmt in ddl:
                c.execute(text("DROP INDEX " + stmt.split(" INDEX ", 1)[1].split(" ON ", 1)[0]))
            c.execute(text("SET LOCAL synchronous_commit = off"))
            for a in range(AGENTS):
                c.execute(text("INSERT INTO agents (id, webhook_url, secret, lease_timeout_seconds, registered_at) "
                               "VALUES (:a, 'http://127.0.0.1:9/webhook', 'yearold-secret', 3600, :now)"),
                          {"a": f"agent-{a}", "now": NOW})
            status = ("CASE WHEN i % 100 < 93 THEN 'completed' WHEN i % 100 < 98 THEN 'failed' ELSE 'cancelled' END")
            age = _age_sql(n, expired)

            def v7(i: str) -> str:  # execution i's id, from its creation time and md5 of i
                ms = (f"lpad(to_hex(((extract(epoch FROM CAST(:now AS timestamptz)) - ({_age_sql(n, expired, i)}))"
                      f" * 1000)::bigint), 12, '0')")
                return _uuid7(ms, f"md5('e' || {i})")

            c.execute(text(
                "INSERT INTO executions (id, agent_id, input, status, output, last_event_seq, usage_input, usage_output,"
                " created_at, updated_at, session, forked_from, fork_seq, suspended) "
                f"SELECT {v7('i')}, 'agent-' || (i % 20),"
                " '{\"n\":' || i || ',\"task\":\"summarise the quarterly report\"}',"
                f" {status}, '{{\"ok\"\\:true}}', 3 + 4 * (i % 3 + 1), 0, 0,"
                f" CAST(:now AS timestamptz) - ({age}) * interval '1 second',"
                f" CAST(:now AS timestamptz) - ({age} - 30) * interval '1 second',"
                " CASE WHEN i % 20 = 0 THEN 'session-' || (i / 100) END,"
                f" CASE WHEN i % 1000 = 999 THEN {v7('(i - 1)')} END,"
                " CASE WHEN i % 1000 = 999 THEN 3 ELSE 0 END, false "
                "FROM generate_series(1, CAST(:n AS bigint)) AS i"), {"n": n, "now": NOW})
            c.execute(text("CREATE TEMP TABLE tmpl (k int, pos int, step int, type text) ON COMMIT DROP"))
            for k in (1, 2, 3):
                rows = [(k, 1, 0, "execution.created"), (k, 2, 0, "execution.started")]
                for s in range(1, k + 1):
                    for j, typ in enumerate(("step.proposed", "step.allowed", "step.executing", "step.succeeded")):
                        rows.append((k, 2 + (s - 1) * 4 + j + 1, s, typ))
                rows.append((k, 3 + 4 * k, 0, "execution.end"))
                c.execute(text("INSERT INTO tmpl VALUES (:k, :pos, :step, :type)"),
                          [{"k": a, "pos": b, "step": s, "type": ty} for a, b, s, ty in rows])
            sid = "replace(e.id, '-', '') || lpad(to_hex(tm.step), 32, '0')"
            c.execute(text(
                "INSERT INTO events (execution_id, event_seq, type, payload, occurred_at) "
                "SELECT e.id, tm.pos, CASE tm.type WHEN 'execution.end' THEN 'execution.' || e.status ELSE tm.type END,"
                f" CASE WHEN tm.step > 0 THEN '{{\"step_id\":\"' || {sid} || '\",\"step_type\":\"tool_call\","
                "\"target\":\"tool-' || (tm.step * 7 % 50) || '\"}' ELSE '{\"agent_id\":\"' || e.agent_id || '\"}' END,"
                " e.created_at + tm.pos * interval '1 second' "
                "FROM executions e JOIN tmpl tm ON tm.k = (e.last_event_seq - 3) / 4 ORDER BY e.id, tm.pos"))
            c.execute(text(
                "INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency,"
                " args, result, usage_input, usage_output, started_at, completed_at, outcome_seq) "
                f"SELECT {sid}, e.id, 'tool_call', 'tool-' || (tm.step * 7 % 50), lpad(to_hex(tm.step), 64, '0'), 0,"
                " 'succeeded', 'safe_to_retry', '{\"q\":' || tm.step || '}', '{\"ok\"\\:true}', 0, 0,"
                " e.created_at + tm.pos * interval '1 second', e.created_at + tm.pos * interval '1 second', tm.pos "
                "FROM executions e JOIN tmpl tm ON tm.k = (e.last_event_seq - 3) / 4 AND tm.type = 'step.succeeded'"))
            c.execute(text(
                "INSERT INTO decisions (id, agent_id, execution_id, step_id, kind, target, decision, rule_id, reason,"
                " policy_kind, policy_revision, policy_hash, decided_by, credential, event_seq, decided_at) "
                "SELECT md5('d' || s.step_id), e.agent_id, e.id, s.step_id, 'tool_call', s.target,"
                f" CASE WHEN {_DENIED.format(h=_PG_RANDOM)} THEN 'denied' ELSE 'allowed' END,"
                " 'rule-' || (length(s.target) % 7), NULL, 'yaml', 'r1', lpad('1', 64, '0'), NULL, NULL,"
                " s.outcome_seq - 2, s.started_at FROM steps s JOIN executions e ON e.id = s.execution_id"))
            c.execute(text(
                "INSERT INTO approvals (id, step_id, execution_id, status, approvers, timeout_at, decided_by,"
                " decided_at, created_at, agent_id, kind, target, rule_id, credential) "
                "SELECT md5('a' || e.id), s.step_id, e.id, 'granted', '[\"ops\"]', e.updated_at, 'ops',"
                " e.updated_at, e.created_at, e.agent_id, 'tool_call', s.target, 'rule-approve', 'key' "
                "FROM executions e JOIN steps s ON s.execution_id = e.id AND s.outcome_seq = 6 "
                f"WHERE {_PG_RANDOM} % 100 = 7"))
            c.execute(text(
                "INSERT INTO dispatches (id, execution_id, status, attempt, max_attempts, next_attempt_at,"
                " created_at, updated_at) SELECT md5('q' || id)::uuid::text, id, 'exhausted', 1, 10, created_at,"
                " created_at, updated_at FROM executions"))
            for stmt in ddl:
                c.execute(text(stmt))
        with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE"))
    finally:
        eng.dispose()


# -- cached stores -----------------------------------------------------------------------------------


SHAPE = 3  # the builder's version: a cached store is rebuilt when the shape changes, and migrated
# (as an upgrade would) when only the schema moved on: the scenario opens every copy with migrate


def name(n: int, expired: int) -> str:
    return f"yearold_{n}_{expired}_s{SHAPE}"


def sqlite_store(n: int, expired: int, dest: Path, log: list[str]) -> str:
    """A copy of the cached SQLite store at `dest` (built first when missing); its URL."""
    cached = cache_dir() / f"{name(n, expired)}.db"
    if not cached.exists():
        t = time.monotonic()
        part = cached.with_suffix(".part")
        part.unlink(missing_ok=True)
        _build_sqlite(part, n, expired)
        part.rename(cached)
        log.append(f"SQLite store of {n:,} executions built in {time.monotonic() - t:.0f} s ({cached})")
    t = time.monotonic()
    shutil.copyfile(cached, dest)
    log.append(f"SQLite store of {n:,} executions copied in {time.monotonic() - t:.1f} s "
               f"({cached.stat().st_size / 1e9:.2f} GB)")
    return f"sqlite:///{dest}"


def postgres_template(admin_url: str, n: int, expired: int, log: list[str]) -> str:
    """The cached template database's name (built first when missing)."""
    from kernel.store.postgres import driver_url

    tpl = f"regent_{name(n, expired)}"
    admin = create_engine(driver_url(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            have = c.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": tpl}).first()
            if have is None:
                part = tpl + "_part"
                c.execute(text(f'DROP DATABASE IF EXISTS "{part}" WITH (FORCE)'))
                c.execute(text(f'CREATE DATABASE "{part}"'))
                t = time.monotonic()
                _build_postgres(admin_url.rsplit("/", 1)[0] + "/" + part, n, expired)
                c.execute(text(f'ALTER DATABASE "{part}" RENAME TO "{tpl}"'))
                log.append(f"PostgreSQL store of {n:,} executions built in {time.monotonic() - t:.0f} s ({tpl})")
    finally:
        admin.dispose()
    return tpl


def cutoff() -> datetime:
    return NOW - timedelta(days=RETENTION_DAYS)
