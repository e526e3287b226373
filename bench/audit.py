"""The audit figures (docs/audit.md): `GET /v0/decisions` p99 with 100 000 and 1 000 000 rows in
the decisions table, side by side in one run, on SQLite and PostgreSQL.

Each size gets its own database, filled by one bulk INSERT … SELECT (a generated series; seconds
for 1M rows), and its own `regent serve`; the queries alternate between the two servers so drift
on this (shared) machine lands on both. The round trip with the decisions record against the same
kernel without it is the `sqlite-norecord` / `postgres-norecord` targets of the round-trip
scenarios (bench/run.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from bench.client import BenchError, CpuSample, Run, percentile
from bench.scenarios import LocalScenario, Profile, Result
from bench.servers import DEFAULT_PG_URL, free_port, pg_scratch, serve
from kernel.clock import rfc3339

SIZES = (100_000, 1_000_000)
# The rows end now, one a second (1M rows: the last 11.6 days), so all of them are inside the
# decisions' 90-day retention: rows dated earlier would be deleted by the server's first cleanup
# sweep, which is what left the first runs of this scenario reading empty pages.
NOW = datetime.now(UTC).replace(microsecond=0)
# The queries an auditor or the console runs: the newest page, by decision, by agent and time,
# by rule, by target, and the fifth page of a filter (keyset cursor).
QUERIES = (
    ("newest 50", {"limit": "50"}),
    ("denied", {"decision": "denied", "limit": "50"}),
    ("agent + since", {"agent_id": "agent-3", "since": rfc3339(NOW - timedelta(hours=24)), "limit": "50"}),
    ("rule", {"rule_id": "rule-7", "limit": "50"}),
    ("target", {"target": "target-42", "limit": "50"}),
)
_COLS = ("id, agent_id, execution_id, step_id, kind, target, decision, rule_id, reason, policy_kind,"
         " policy_revision, policy_hash, decided_by, credential, event_seq, decided_at")


def _fill(db_url: str, n: int) -> None:
    """Migrate, then `n` decision rows in one statement: 20 agents, 500 targets, 50 rules, four
    outcomes, one row a second up to NOW."""
    from sqlalchemy import text

    from kernel.store import open_store
    from kernel.store.migrations import migrate

    t0 = NOW - timedelta(seconds=n)
    store = open_store(db_url)
    try:
        migrate(store)
        with store.engine.begin() as c:
            # The secondary indexes are dropped for the load and built after it: one sorted build
            # each instead of a million B-tree inserts into seven of them (minutes on a busy host).
            if store.dialect == "postgresql":
                ddl = [r[0] for r in c.execute(text(
                    "SELECT indexdef FROM pg_indexes WHERE tablename = 'decisions' AND indexname LIKE 'ix_%'"))]
            else:
                ddl = [r[0] for r in c.execute(text(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = 'decisions' AND type = 'index' AND name LIKE 'ix_%'"))]
            for stmt in ddl:
                c.execute(text("DROP INDEX " + stmt.split(" INDEX ", 1)[1].split(" ON ", 1)[0]))
            if store.dialect == "postgresql":
                c.execute(text(
                    f"INSERT INTO decisions ({_COLS}) SELECT lpad(to_hex(i), 36, '0'), 'agent-' || (i % 20),"
                    " lpad(to_hex(i / 10), 36, '0'), NULL, 'tool_call', 'target-' || (i % 500),"
                    " (ARRAY['allowed','denied','awaiting_approval','rate_limited'])[1 + i % 4],"
                    " 'rule-' || (i % 50), NULL, 'yaml', 'bench', repeat('0', 64), NULL, NULL, i % 10,"
                    " :t0 + i * interval '1 second' FROM generate_series(1, :n) AS i"), {"t0": t0, "n": n})
            else:  # UTCDateTime is 'YYYY-MM-DD HH:MM:SS.ffffff' text on SQLite
                c.execute(text(
                    "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)"
                    f" INSERT INTO decisions ({_COLS}) SELECT printf('%036x', i), 'agent-' || (i % 20),"
                    " printf('%036x', i / 10), NULL, 'tool_call', 'target-' || (i % 500),"
                    " CASE i % 4 WHEN 0 THEN 'allowed' WHEN 1 THEN 'denied' WHEN 2 THEN 'awaiting_approval'"
                    " ELSE 'rate_limited' END, 'rule-' || (i % 50), NULL, 'yaml', 'bench',"
                    " '0000000000000000000000000000000000000000000000000000000000000000', NULL, NULL, i % 10,"
                    " strftime('%Y-%m-%d %H:%M:%S', :t0, '+' || i || ' seconds') || '.000000'"
                    " FROM s"), {"n": n, "t0": t0.strftime("%Y-%m-%d %H:%M:%S")})
            for stmt in ddl:
                c.execute(text(stmt))
            c.execute(text("ANALYZE decisions" if store.dialect == "postgresql" else "ANALYZE"))
    finally:
        store.close()


@contextlib.contextmanager
def _server(name: str, db_url: str, tmp: Path, token: str) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "kernel", "serve", "--db-url", db_url, "--host", "127.0.0.1", "--port", str(port)]
    with serve(name, argv, port, {"REGENT_BEARER_TOKEN": token}, tmp) as srv:
        srv.wait_ready(120.0)
        yield srv.url


def _measure(urls: dict[int, str], token: str, samples: int, budget: float) -> dict[int, list[float]]:
    """GET /v0/decisions for every query shape, the sizes alternating; the fifth page of `rule`
    follows its cursor. Every answer is checked (200, a full page)."""
    clients = {n: httpx.Client(base_url=u, timeout=30.0, headers={"Authorization": f"Bearer {token}"})
               for n, u in urls.items()}
    cursors: dict[int, str] = {}
    try:
        for n, c in clients.items():  # warm up, and find the cursor of page 5 of `rule`
            params = dict(QUERIES[3][1])
            for _ in range(4):
                r = c.get("/v0/decisions", params=params)
                if r.status_code != 200 or "next_cursor" not in r.json():
                    raise BenchError(f"GET /v0/decisions {params} gave no next page ({r.status_code}): {r.text[:200]!r}")
                params["cursor"] = r.json()["next_cursor"]
            cursors[n] = params["cursor"]
        lat: dict[int, list[float]] = {n: [] for n in clients}
        t0 = time.perf_counter()
        for _ in range(samples):
            if time.perf_counter() - t0 > budget:
                break
            for _label, params in (*QUERIES, ("rule, page 5", {"rule_id": "rule-7", "limit": "50", "cursor": ""})):
                for n, c in clients.items():
                    q = dict(params)
                    if "cursor" in q:
                        q["cursor"] = cursors[n]
                    t = time.perf_counter()
                    r = c.get("/v0/decisions", params=q)
                    dt = time.perf_counter() - t
                    if r.status_code != 200 or len(r.json()["decisions"]) != 50:
                        raise BenchError(f"GET /v0/decisions {q} answered {r.status_code}: {r.text[:200]!r}")
                    lat[n].append(dt)
        return lat
    finally:
        for c in clients.values():
            c.close()


def _backend(kind: str, p: Profile, tmp: Path, pg_url: str) -> list[Result]:
    token = "bench-" + uuid.uuid4().hex
    samples = 150 if p.name == "quick" else 500  # rounds of the six queries; p99 needs several hundred
    budget = 30.0 if p.name == "quick" else 120.0
    with contextlib.ExitStack() as stack:
        urls: dict[int, str] = {}
        for n in SIZES:
            if kind == "sqlite":
                db = f"sqlite:///{tmp}/decisions-{n}.db"
            else:
                db = stack.enter_context(pg_scratch(pg_url))
            t = time.monotonic()
            _fill(db, n)
            filled = time.monotonic() - t
            urls[n] = stack.enter_context(_server(f"decisions-{kind}-{n}", db, tmp, token))
            print(f"    {kind}: {n:,} decisions written in {filled:.1f}s", file=sys.stderr)
        cpu0 = CpuSample.take(None)
        t0 = time.perf_counter()
        lat = _measure(urls, token, samples, budget)
        wall = time.perf_counter() - t0
        cpu = CpuSample.take(None) - cpu0
    out = []
    p99 = {}
    for n, xs in lat.items():
        xs.sort()
        p99[n] = percentile(xs, 0.99)
        out.append(Result(f"GET /v0/decisions @{n // 1000}k rows", kind, Run(xs, wall / len(SIZES), 1, cpu), op="GET"))
    big, small = SIZES[1], SIZES[0]
    out[-1].figures.append((f"GET /v0/decisions p99, {big // 1000}k / {small // 1000}k rows, {kind}",
                            f"{p99[big] / p99[small]:.2f}× ({p99[big] * 1e3:.1f} / {p99[small] * 1e3:.1f} ms)",
                            "≤ 1.5×"))
    return out


def _run(p: Profile) -> list[Result]:
    pg_url = os.environ.get("REGENT_TEST_POSTGRES_URL", DEFAULT_PG_URL)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="regent-bench-decisions-") as d:
        for kind in ("sqlite", "postgres"):
            try:
                out += _backend(kind, p, Path(d), pg_url)
            except Exception as exc:  # PostgreSQL unreachable, a server that would not start
                out.append(Result("GET /v0/decisions", kind, error=f"{type(exc).__name__}: {exc}"))
    return out


DECISIONS = LocalScenario(
    "decisions",
    "GET /v0/decisions at 100k and 1M rows",
    _run,
    "GET /v0/decisions p50/p99 with 100 000 and 1 000 000 decisions (a database and a server each, "
    "queries alternating), SQLite and PostgreSQL",
)
