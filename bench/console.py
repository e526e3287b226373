"""The console page scenario: the timeline of an execution with 1 000 steps and the decisions
audit search over 100 000 decisions, beside the API's own list and events routes, on the same
server and data. Each sample is one GET on a keep-alive connection; the console's own time comes
from its `Server-Timing` header, the API's is the round trip (loopback, so close to it)."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx

from bench import fixtures
from bench.client import BenchError, CpuSample, Run, percentile
from bench.scenarios import Profile, Result, Scenario, Target
from kernel.core.kernel import Kernel

TIMELINE_STEPS = 1000
DECISIONS = 100_000
# Older decisions, over the 30 days before those: the month-long chart's 1.1M, and what the 24 h
# chart and the search must not slow down with.
OLDER_DECISIONS = 1_000_000
OLDER_DAYS = 30
SCOPES = ["executions:read", "approvals:read", "policies:write", "decisions:read"]


@dataclass
class ConsoleFixture:
    execution_id: str
    token: str  # an API key with read scopes: the API calls' bearer and the console's sign-in
    decisions: int  # written for the audit search (0 when this kernel has no decisions table)
    older: int = 0  # written before those, for the month-long chart (0 without a rollup to read)


def _api_key(k: Kernel) -> str:
    key_id = str(uuid.uuid4())
    token = f"rbk_{key_id}.{secrets.token_urlsafe(32)[:43]}"
    with k.store.transaction() as tx:
        tx.insert_api_key({"id": key_id, "name": "bench-console", "scopes": json.dumps(SCOPES),
                           "secret_hash": hashlib.sha256(token.encode()).digest(), "created_at": datetime.now(UTC)})
    return token


def _decisions(k: Kernel, agent_id: str, execution_id: str, n: int) -> int:
    """`n` decision rows over the last 24 hours: 10 targets, 4 outcomes, a few rules."""
    try:
        from kernel.store import tables as t

        table = t.decisions  # type: ignore[attr-defined]
    except AttributeError:
        return 0
    outcomes = ["allowed"] * 7 + ["denied"] * 2 + ["awaiting_approval"]
    now = datetime.now(UTC)
    rows = []
    for i in range(n):
        outcome = outcomes[i % len(outcomes)]
        rule = {"allowed": "allow-read-only", "denied": "default", "awaiting_approval": "approve-other"}[outcome]
        rows.append({
            "id": str(uuid.uuid4()), "agent_id": agent_id, "execution_id": execution_id, "step_id": f"{i:064x}",
            "kind": "tool_call", "target": f"bench.tool{i % 10}", "decision": outcome, "rule_id": rule,
            "reason": None, "policy_kind": "yaml", "policy_revision": "bench", "policy_hash": "0" * 64,
            "decided_by": None, "credential": None, "event_seq": None,
            "decided_at": now - timedelta(seconds=86_400 * (n - i) / n),
        })
    with fixtures.sql_store(k).transaction() as tx:
        for lo in range(0, n, 5000):
            tx.w.execute(table.insert(), rows[lo:lo + 5000])
    return n


def _older_decisions(k: Kernel, agent_id: str, execution_id: str, n: int) -> int:
    """`n` decision rows spread over the OLDER_DAYS days before the last 24 hours, in one
    INSERT … SELECT (seconds, where 1M rows through the driver would take minutes); the same
    outcomes, rules and targets as `_decisions`."""
    try:
        from kernel.store import tables as t

        t.decision_rollup  # type: ignore[attr-defined]  # noqa: B018 - a kernel without the rollup
    except AttributeError:
        return 0
    from sqlalchemy import text

    start = datetime.now(UTC) - timedelta(days=OLDER_DAYS + 1)
    step = OLDER_DAYS * 86_400 / n
    cols = ("id, agent_id, execution_id, step_id, kind, target, decision, rule_id, reason, policy_kind,"
            " policy_revision, policy_hash, decided_by, credential, event_seq, decided_at")
    outcome = ("CASE WHEN i % 10 < 7 THEN 'allowed' WHEN i % 10 < 9 THEN 'denied' ELSE 'awaiting_approval' END")
    rule = ("CASE WHEN i % 10 < 7 THEN 'allow-read-only' WHEN i % 10 < 9 THEN 'default' ELSE 'approve-other' END")
    params = {"agent": agent_id, "eid": execution_id, "t0": start, "step": step, "n": n, "hash": "0" * 64}
    with fixtures.sql_store(k).engine.begin() as c:
        if k.store.dialect == "postgresql":
            c.execute(text(
                f"INSERT INTO decisions ({cols}) SELECT 'old-' || lpad(to_hex(i), 32, '0'), :agent, :eid, NULL,"
                f" 'tool_call', 'bench.tool' || (i % 10), {outcome}, {rule}, NULL, 'yaml', 'bench', :hash, NULL,"
                " NULL, NULL, :t0 + i * :step * interval '1 second' FROM generate_series(1, :n) AS i"), params)
            c.execute(text("ANALYZE decisions"))
        else:  # UTCDateTime is 'YYYY-MM-DD HH:MM:SS.ffffff' text on SQLite
            params["t0"] = start.strftime("%Y-%m-%d %H:%M:%S")
            c.execute(text(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)"
                f" INSERT INTO decisions ({cols}) SELECT printf('old-%032x', i), :agent, :eid, NULL, 'tool_call',"
                f" 'bench.tool' || (i % 10), {outcome}, {rule}, NULL, 'yaml', 'bench', :hash, NULL, NULL, NULL,"
                " strftime('%Y-%m-%d %H:%M:%f', :t0, '+' || (i * :step) || ' seconds') || '000' FROM s"), params)
            c.execute(text("ANALYZE"))
    return n


def _prepare(k: Kernel | None, agent: fixtures.AgentCreds, p: Profile) -> ConsoleFixture:
    assert k is not None
    (lease,) = fixtures.start_executions(k, agent, 1, "console-timeline")
    fixtures.record_history(fixtures.sql_store(k), lease, TIMELINE_STEPS)
    eid = lease.execution_id
    recent = _decisions(k, agent.agent_id, eid, DECISIONS)
    older = _older_decisions(k, agent.agent_id, eid, OLDER_DECISIONS) if recent else 0
    return ConsoleFixture(eid, _api_key(k), recent, older)


def _sample(http: httpx.Client, path: str, want: str) -> tuple[float, float | None]:
    t = time.perf_counter()
    r = http.get(path)
    dt = time.perf_counter() - t
    if r.status_code != 200 or want not in r.text:
        raise BenchError(f"GET {path} answered {r.status_code}: {r.text[:200]!r}")
    timing = r.headers.get("server-timing", "")
    server = float(timing.split("dur=")[1]) / 1e3 if "dur=" in timing else None
    return dt, server


def _run(target: Target, fx: ConsoleFixture, p: Profile, round_index: int) -> list[Result]:
    samples = 50 if p.name == "quick" else 200
    budget = 20.0 if p.name == "quick" else 60.0
    base = target.server.url
    console = httpx.Client(base_url=base, timeout=30.0, follow_redirects=False)
    api = httpx.Client(base_url=base, timeout=30.0, headers={"Authorization": f"Bearer {fx.token}"})
    eid = fx.execution_id
    since = (datetime.now(UTC) - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    pages: list[tuple[str, str, str, httpx.Client, str]] = [
        ("console: timeline, 1 000 steps", "page", f"/console/executions/{eid}", console, "bench.tool9"),
        ("API: events, one page of 1 000", "GET", f"/v0/executions/{eid}/events?limit=1000", api, "step.allowed"),
        ("console: executions list", "page", "/console/executions", console, eid),
        ("API: executions list", "GET", "/v0/executions?limit=50", api, eid),
    ]
    if fx.decisions:
        pages += [
            (f"console: decisions audit, {fx.decisions // 1000}k", "page",
             f"/console/audit?decision=denied&from={since}", console, "bench.tool"),
            (f"console: decisions audit by target, {fx.decisions // 1000}k", "page",
             f"/console/audit?target=bench.tool3&from={since}", console, "bench.tool3"),
            (f"API: decisions, {fx.decisions // 1000}k", "GET", "/v0/decisions?decision=denied&limit=50", api,
             "bench.tool"),
            (f"console: decisions chart (24 h, all {fx.decisions // 1000}k)", "svg", "/console/audit/chart.svg",
             console, "<rect"),
            (f"console: decisions chart (24 h, denied of {fx.decisions // 1000}k)", "svg",
             "/console/audit/chart.svg?decision=denied", console, "<rect"),
        ]
    month = ""
    if fx.older:
        month = f"console: decisions chart ({OLDER_DAYS + 1} days, all {(fx.decisions + fx.older) / 1e6:.1f}M)"
        start = (datetime.now(UTC) - timedelta(days=OLDER_DAYS + 1)).strftime("%Y-%m-%dT%H:%M")
        pages.append((month, "svg", f"/console/audit/chart.svg?from={start}", console, "<rect"))
    try:
        r = console.post("/console/sign-in", data={"token": fx.token, "next": "/console/executions"})
        if r.status_code != 303:
            raise BenchError(f"console sign-in answered {r.status_code}")
        first: dict[str, float] = {}
        for name, _op, path, http, want in pages:  # warm the caches and connections
            dt, srv = _sample(http, path, want)
            first[name] = srv if srv is not None else dt
        lat: dict[str, list[float]] = {name: [] for name, *_ in pages}
        server: dict[str, list[float]] = {name: [] for name, *_ in pages}
        cpu0 = CpuSample.take(target.server.pid)
        t0 = time.perf_counter()
        for _ in range(samples):  # interleaved, so drift lands on every page alike
            if time.perf_counter() - t0 > budget:
                break
            for name, _op, path, http, want in pages:
                dt, srv = _sample(http, path, want)
                lat[name].append(dt)
                if srv is not None:
                    server[name].append(srv)
        wall = time.perf_counter() - t0
        cpu = CpuSample.take(target.server.pid) - cpu0
    finally:
        console.close()
        api.close()
    total = sum(len(v) for v in lat.values()) or 1
    out = []
    for name, op, *_ in pages:
        f = len(lat[name]) / total
        run = Run(server[name] or lat[name], wall * f, 1, CpuSample(cpu.server * f, cpu.client * f, cpu.machine * f))
        extra = {"timing": "server (Server-Timing)" if server[name] else "round trip"}
        figures = []
        if name.startswith("console:") and server[name] and "list" not in name:
            ordered = sorted(server[name])
            figures.append((f"{name}, {target.name}: p50 / p99 server time",
                            f"{percentile(ordered, 0.5) * 1e3:.1f} / {percentile(ordered, 0.99) * 1e3:.1f} ms",
                            "p99 < 100 ms"))
        out.append(Result(name, target.name, run, op=op, extra=extra, figures=figures))
    if month:
        # The month's first view filled the hourly rollup of its closed hours (the sweep had done
        # only the last 48): paid once, by the first visitor of a range not held yet.
        once = Run([first[month]], first[month], 1, CpuSample(0.0, 0.0, 0.0))
        out.append(Result(f"{month}: first view, fills the hourly rollup", target.name, once, op="svg",
                          extra={"timing": "server (Server-Timing)", "note": "one sample"}))
    return out


CONSOLE = Scenario(
    "console",
    "console pages",
    frozenset({"kernel"}),
    _prepare,
    _run,
    "GETs of the console's timeline (1 000 steps), executions list and decisions audit (100 000 "
    "decisions) beside the API's events, executions and decisions routes; the console's server time",
)
