"""Parked executions at scale (part of `--scenarios scale`): the cleanup sweep's CPU per pass with
n and 100 n executions parked on a pending approval, and every one resumed when released.

In process, per backend: a store with `n` executions blocked on a pending approval (their step
awaiting approval, the dispatch retired, as `submit_step` leaves them), written by INSERT … SELECT.
The figure is the median CPU (this process: statements and Python; the database's own work on
PostgreSQL runs in its backend, timed by wall) of `cleanup_sweep` passes that find nothing to do,
at n and at 100 n parked; then every approval's timeout is moved to the past (the release) and
the expiry sweep runs until none is pending: each execution must be running again with a new
dispatch queued, counted in SQL.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from bench import fixtures
from kernel.core import sweeps
from kernel.core.kernel import Kernel
from kernel.store import SqlStore, open_store
from kernel.store.migrations import migrate

AGENT = "agent-parked"
T0 = datetime.now(UTC).replace(microsecond=0)


def park(store: SqlStore, n: int) -> None:
    """n blocked executions, each with its step awaiting approval and the approval pending."""
    with store.engine.begin() as c:
        if store.dialect == "postgresql":  # a fixture's bulk insert, not a request: no statement timeout
            c.execute(text("SET LOCAL statement_timeout = 0"))
        c.execute(text("INSERT INTO agents (id, webhook_url, secret, lease_timeout_seconds, registered_at) "
                       "VALUES (:a, 'http://127.0.0.1:9/webhook', 's', 3600, :t)"), {"a": AGENT, "t": T0})
        if store.dialect == "postgresql":
            series, eid = "generate_series(1, :n) AS s(i)", "md5('p' || i)::uuid::text"
            sid, aid, did = "md5('s' || i) || md5('t' || i)", "md5('a' || i)::uuid::text", "md5('d' || i)::uuid::text"
            far = "CAST(:t AS timestamptz) + interval '30 days'"
            t0 = "CAST(:t AS timestamptz)"
        else:
            series = "(WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < :n) SELECT i FROM r)"
            eid = "printf('%08x-0000-4000-8000-%012x', i, i)"
            sid, aid, did = "printf('%064x', i)", "printf('%08x-0000-4000-a000-%012x', i, i)", \
                "printf('%08x-0000-4000-d000-%012x', i, i)"
            far = "strftime('%Y-%m-%d %H:%M:%S', :t, '+30 days') || '.000000'"
            t0 = ":t"
        p = {"n": n, "t": T0 if store.dialect == "postgresql" else T0.strftime("%Y-%m-%d %H:%M:%S.000000")}
        c.execute(text(
            "INSERT INTO executions (id, agent_id, status, last_event_seq, usage_input, usage_output, created_at,"
            f" updated_at, fork_seq, suspended) SELECT {eid}, '{AGENT}', 'blocked', 4, 0, 0, {t0}, {t0}, 0, false"
            f" FROM {series}"), p)
        c.execute(text(
            "INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency,"
            f" args, usage_input, usage_output, started_at) SELECT {sid}, {eid}, 'tool_call', 'payments.refund',"
            f" {sid}, 0, 'awaiting_approval', 'at_most_once', '{{}}', 0, 0, {t0} FROM {series}"), p)
        c.execute(text(
            "INSERT INTO approvals (id, step_id, execution_id, status, timeout_at, created_at, agent_id, kind,"
            f" target, rule_id) SELECT {aid}, {sid}, {eid}, 'pending', {far}, {t0}, '{AGENT}', 'tool_call',"
            f" 'payments.refund', 'approve-refunds' FROM {series}"), p)
        c.execute(text(
            "INSERT INTO dispatches (id, execution_id, status, attempt, max_attempts, next_attempt_at, created_at,"
            f" updated_at) SELECT {did}, {eid}, 'exhausted', 1, 10, {t0}, {t0}, {t0} FROM {series}"), p)
    if store.dialect == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("ANALYZE"))


def rss() -> float:
    """This process's resident memory in MB (/proc/self/status VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def sweep_pass(k: Kernel, passes: int) -> tuple[float, float]:
    """Median (CPU, wall) seconds of a cleanup pass over `passes` passes."""
    cpu, wall = [], []
    for _ in range(passes):
        c0, t0 = time.process_time(), time.perf_counter()
        sweeps.cleanup_sweep(k, "bench-parked")
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return sorted(cpu)[passes // 2], sorted(wall)[passes // 2]


def release(k: Kernel, n: int, budget: float) -> tuple[int, float]:
    """Move every approval's timeout to the past, then expire them in sweep batches until none is
    pending or `budget` seconds pass; the count of executions running again with a dispatch queued."""
    past = datetime.now(UTC) - timedelta(seconds=1)
    with fixtures.sql_store(k).engine.begin() as c:
        if k.store.dialect == "postgresql":
            c.execute(text("SET LOCAL statement_timeout = 0"))
        c.execute(text("UPDATE approvals SET timeout_at = :p WHERE status = 'pending'").bindparams(p=past)
                  if k.store.dialect == "postgresql" else
                  text("UPDATE approvals SET timeout_at = :p WHERE status = 'pending'"),
                  {"p": past if k.store.dialect == "postgresql" else past.strftime("%Y-%m-%d %H:%M:%S.%f")})
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < budget:
        if sweeps.expire_due_approvals(k) == 0:
            break
    took = time.perf_counter() - t0
    with fixtures.sql_store(k).engine.begin() as c:
        if k.store.dialect == "postgresql":  # the bench's count, not a request: no statement timeout
            c.execute(text("SET LOCAL statement_timeout = 0"))
            # Statistics first: before autovacuum's ANALYZE the planner put one row on each side and
            # walked every pending dispatch for each execution (10^5 × 10^5; over 3 minutes).
            c.execute(text("ANALYZE executions, dispatches"))
        resumed = c.execute(text(
            "SELECT count(*) FROM executions e WHERE e.agent_id = :a AND e.status = 'running' AND EXISTS"
            " (SELECT 1 FROM dispatches d WHERE d.execution_id = e.id AND d.status = 'pending')"), {"a": AGENT}).scalar()
    return int(resumed or 0), took


def measure(url_for: Any, small: int, big: int, release_budget: float) -> dict[str, Any]:
    """`url_for(label)` gives a fresh database per size."""
    out: dict[str, Any] = {}
    for label, n in (("small", small), ("big", big)):
        store = open_store(url_for(label))
        try:
            migrate(store)
            t = time.perf_counter()
            park(store, n)
            out[f"{label}_written"] = time.perf_counter() - t
            k = Kernel(store=store)
            k.retention = 400 * 86400.0
            sweeps.cleanup_sweep(k, "bench-parked")  # warm: statements prepared, caches filled
            out[f"{label}_cpu"], out[f"{label}_wall"] = sweep_pass(k, 5)
            out[f"{label}_rss"] = rss()
            if label == "big":
                out["resumed"], out["release_s"] = release(k, n, release_budget)
        finally:
            store.close()
    return out
