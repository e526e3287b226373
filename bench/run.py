"""`regent bench` / `python -m bench.run`: the kernel against its own ceiling, in one run.

Targets, one server process at a time on loopback: the bare FastAPI ceiling, the kernel on SQLite
(a temp file, synchronous=FULL) and the kernel on PostgreSQL (a scratch database). Each scenario
runs against every target it applies to; the report shows percentiles, throughput, CPU per
operation and the ratios the performance goals are stated in. It never passes or fails on them:
the exit status is 1 only when a measurement could not be taken (an error), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import fixtures
from bench.audit import DECISIONS
from bench.client import Run, percentile
from bench.console import CONSOLE
from bench.dispatch import DISPATCH
from bench.judge import JUDGE
from bench.mcp import MCP
from bench.peer import PEER
from bench.scale import SCALE
from bench.scenarios import (
    FULL,
    LOCAL_SCENARIOS,
    QUICK,
    SCENARIOS,
    Profile,
    Result,
    Scenario,
    Target,
)
from bench.servers import (
    DEFAULT_PG_URL,
    fsync_reference,
    pg_scratch,
    pg_version,
    serve_bare,
    serve_kernel,
)
from bench.sessions import SESSIONS
from bench.shadow import NAME as SHADOW_NAME
from bench.shadow import SHADOW

SCENARIOS = [*SCENARIOS, SHADOW]  # bench/shadow.py builds on the scenario types

SCENARIOS = [*SCENARIOS, CONSOLE]
LOCAL_SCENARIOS = [*LOCAL_SCENARIOS, DECISIONS]

console = Console(soft_wrap=True)
if not console.is_terminal:
    console = Console(soft_wrap=True, width=160)  # piped to a file: do not squeeze the tables to 80
# `*-norecord`: the same kernel with REGENT_RECORD_DECISIONS=false, for the cost of the decisions
# record (round-trip scenarios only).
TARGETS = ("bare", "sqlite", "postgres", "sqlite-norecord", "postgres-norecord")
NORECORD = {"REGENT_RECORD_DECISIONS": "false"}
LOCAL = [*LOCAL_SCENARIOS, JUDGE, SESSIONS, DISPATCH]  # in-process, or with servers of their own, after the shared targets
LOCAL = [*LOCAL, MCP]  # bench/mcp.py: the MCP gateway's overhead, its own servers
LOCAL += [PEER, SCALE]  # bench/peer.py, bench/scale.py (issue 33)


# -- running -----------------------------------------------------------------------------------------


def _prepare_kernel(db_url: str, scenarios: list[Scenario], p: Profile) -> tuple[fixtures.AgentCreds, dict[str, Any]]:
    """Open the store, migrate, write every scenario's fixtures, close it (SQLite: one kernel per
    file, and the server must be the only writer)."""
    from kernel.core.kernel import Kernel
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    try:
        migrate(store)
        k = Kernel(store=store)
        agent = fixtures.new_agent(k)
        prepared = {s.name: s.prepare(k, agent, p) for s in scenarios}
    finally:
        store.close()
    return agent, prepared


def _measure(target: Target, s: Scenario, prepared: Any, p: Profile, round_index: int) -> list[Result]:
    try:
        return s.run(target, prepared, p, round_index)
    except Exception as exc:  # report and carry on: the other figures are still worth having
        console.print(f"  [red]{target.name}: {s.name} failed: {type(exc).__name__}: {exc}[/]\n"
                      f"{target.server.log_tail(10)}")
        return [Result(s.name, target.name, error=f"{type(exc).__name__}: {exc}")]


def run_scenarios(live: list[tuple[Target, dict[str, Any]]], scenarios: list[Scenario], p: Profile) -> list[Result]:
    """Each scenario on every target it applies to. Multi-round scenarios alternate the targets
    round by round (rotating who goes first), so a burst of background load on this machine
    lands on all of them rather than on whichever happened to run then."""
    out: list[Result] = []
    for s in scenarios:
        mine = [(t, prep) for t, prep in live if t.kind in s.kinds]
        if not mine:
            continue
        rounds = max(1, s.rounds(p))
        console.print(f"  [dim]{s.name}: {', '.join(t.name for t, _ in mine)}"
                      f"{f', {rounds} interleaved rounds' if rounds > 1 else ''} …[/]")
        collected: dict[tuple[str, str], list[Result]] = {}
        failed: set[str] = set()
        for i in range(rounds):
            order = mine[i % len(mine):] + mine[:i % len(mine)]
            for t, prep in order:
                if t.name in failed:
                    continue
                for r in _measure(t, s, prep[s.name], p, i):
                    if r.run is None:
                        failed.add(t.name)
                    collected.setdefault((r.scenario, r.target), []).append(r)
        for rs in collected.values():
            bad = [r for r in rs if r.run is None]
            if bad:
                out.append(bad[0])
            else:
                out.append(Result(rs[0].scenario, rs[0].target, Run.merge([r.run for r in rs if r.run]),
                                  op=rs[0].op, extra=rs[0].extra, figures=[f for r in rs for f in r.figures]))
    return out


def run_all(p: Profile, targets: Sequence[str], scenarios: list[Scenario], pg_url: str, tmp: Path,
            notes: list[str], env: dict[str, str]) -> list[Result]:
    """Prepare every target's fixtures, start every server (each its own process, idle while the
    others are measured), then run the scenarios; stop the servers and drop the scratch database."""
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        live: list[tuple[Target, dict[str, Any]]] = []
        for name in targets:
            kind = "bare" if name == "bare" else ("kernel-norecord" if name.endswith("-norecord") else "kernel")
            extra = NORECORD if kind == "kernel-norecord" else None
            chosen = [s for s in scenarios if kind in s.kinds]
            if not chosen:
                continue
            if name == "bare":
                agent = fixtures.AgentCreds(fixtures.AGENT_ID, "unused-by-the-bare-app")
                prepared = {s.name: s.prepare(None, agent, p) for s in chosen}
                srv = stack.enter_context(serve_bare(tmp))
            elif name.startswith("sqlite"):
                db = f"sqlite:///{tmp}/regent-bench-{name}.db"
                agent, prepared = _prepare_kernel(db, chosen, p)
                srv = stack.enter_context(serve_kernel(name, db, tmp, extra))
            else:
                try:
                    env["postgres"] = pg_version(pg_url)
                    url = stack.enter_context(pg_scratch(pg_url))
                except Exception as exc:
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    notes.append(f"PostgreSQL skipped: {pg_url} unreachable ({type(exc).__name__}: {first}); "
                                 "set REGENT_TEST_POSTGRES_URL or --pg-url")
                    console.print(f"  [yellow]{notes[-1]}[/]")
                    continue
                agent, prepared = _prepare_kernel(url, chosen, p)
                srv = stack.enter_context(serve_kernel(name, url, tmp, extra))
            console.print(f"  [dim]{name}: fixtures written, server started in {time.monotonic() - t0:.1f}s[/]")
            live.append((Target(name, kind, srv, agent), prepared))
        for t, _ in live:  # the servers boot in parallel with the next target's fixtures
            t.server.wait_ready(120.0)  # a loaded machine can take long to import and migrate
        try:
            return run_scenarios(live, scenarios, p)
        finally:
            for t, _ in live:  # stop them together rather than one graceful shutdown after another
                t.server.terminate()


# -- figures -----------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return "–" if x is None or math.isnan(x) else (f"{x * 1e3:.2f}" if x < 0.1 else f"{x * 1e3:.1f}")


def summary(r: Result) -> dict[str, Any]:
    if r.error is not None or (r.run is None and r.stats is None):
        return {"scenario": r.scenario, "target": r.target, "error": r.error or "no figures"}
    if r.run is None:
        nan = float("nan")
        base = dict.fromkeys(("p50", "p90", "p99", "mean", "max", "throughput", "wall", "server_cpu_per_op",
                              "client_cpu_per_op", "other_cpu_per_op", "machine_busy"), nan)
        return {"scenario": r.scenario, "target": r.target, "op": r.op, "workers": 1, "ops": 0, **base,
                **(r.stats or {}), **r.extra}
    lat = sorted(r.run.latencies)
    ops = len(lat)
    cpu = r.run.cpu

    def per(x: float) -> float:
        return x / ops if ops else float("nan")

    other = max(cpu.machine - cpu.server - cpu.client, 0.0)  # /proc ticks are 10 ms: tiny negatives happen
    return {
        "scenario": r.scenario, "target": r.target, "op": r.op, "workers": r.run.workers, "ops": ops,
        "p50": percentile(lat, 0.50), "p90": percentile(lat, 0.90), "p99": percentile(lat, 0.99),
        "mean": sum(lat) / ops if ops else float("nan"), "max": lat[-1] if lat else float("nan"),
        "throughput": r.run.throughput, "wall": r.run.wall,
        "server_cpu_per_op": per(cpu.server), "client_cpu_per_op": per(cpu.client),
        "other_cpu_per_op": per(other), "machine_busy": cpu.machine / r.run.wall if r.run.wall else float("nan"),
        **r.extra,
    }


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator of one metric; `goal` is printed beside it, never enforced."""

    label: str
    num: tuple[str, str]  # (scenario, target)
    den: tuple[str, str]
    metric: str
    goal: str
    as_percent: bool = True


def ratios(p: Profile) -> list[Ratio]:
    conc, seq = "round trip, concurrent", "round trip, sequential"
    small, big = f"replay @{p.replay_small_steps} steps", f"replay @{p.replay_big_steps} steps"
    return [
        Ratio(f"SQLite / bare ceiling, throughput at {p.concurrency} workers", (conc, "sqlite"), (conc, "bare"),
              "throughput", "≥ 75 %"),
        # Sequential ≥ 60 % and PostgreSQL / SQLite ≥ 85 % were goals until issue 33 §3 retired them: the
        # machine's two CPUs and the disk leave the kernel almost nothing under them (`headroom`).
        Ratio("SQLite / bare ceiling, throughput sequential", (seq, "sqlite"), (seq, "bare"), "throughput", ""),
        Ratio("bare / SQLite, server CPU per round trip (client-independent)", (conc, "bare"), (conc, "sqlite"),
              "server_cpu_per_op", "≥ 50 %"),
        Ratio(f"replay p50: {p.replay_big_steps} / {p.replay_small_steps} steps, SQLite", (big, "sqlite"),
              (small, "sqlite"), "p50", "≤ 1.2×", as_percent=False),
        Ratio(f"replay p99: {p.replay_big_steps} / {p.replay_small_steps} steps, SQLite", (big, "sqlite"),
              (small, "sqlite"), "p99", "", as_percent=False),
        Ratio(f"replay p50: {p.replay_big_steps} / {p.replay_small_steps} steps, PostgreSQL", (big, "postgres"),
              (small, "postgres"), "p50", "≤ 1.2×", as_percent=False),
        Ratio(f"replay p99: {p.replay_big_steps} / {p.replay_small_steps} steps, PostgreSQL", (big, "postgres"),
              (small, "postgres"), "p99", "", as_percent=False),
        Ratio(f"PostgreSQL / SQLite, throughput at {p.concurrency} workers", (conc, "postgres"), (conc, "sqlite"),
              "throughput", ""),
        Ratio("PostgreSQL / SQLite, throughput sequential", (seq, "postgres"), (seq, "sqlite"), "throughput", ""),
        Ratio(f"PostgreSQL / bare ceiling, throughput at {p.concurrency} workers", (conc, "postgres"),
              (conc, "bare"), "throughput", ""),
        *[Ratio(f"active p99 with a crashing shadow / without, {db}", (f"{SHADOW_NAME}, with a crashing shadow", t),
                (f"{SHADOW_NAME}, active only", t), "p99", "≤ 1.2×", as_percent=False)
          for t, db in (("sqlite", "SQLite"), ("postgres", "PostgreSQL"))],
        # The decisions record (docs/audit.md): the same kernel with and without it.
        Ratio("SQLite with / without the decisions record, round trip p50 sequential", (seq, "sqlite"),
              (seq, "sqlite-norecord"), "p50", "≤ 1.05×", as_percent=False),
        Ratio("SQLite with / without the decisions record, server CPU per round trip at "
              f"{p.concurrency} workers", (conc, "sqlite"), (conc, "sqlite-norecord"),
              "server_cpu_per_op", "≤ 1.05×", as_percent=False),
        Ratio("PostgreSQL with / without the decisions record, round trip p50 sequential", (seq, "postgres"),
              (seq, "postgres-norecord"), "p50", "≤ 1.05×", as_percent=False),
        Ratio("PostgreSQL with / without the decisions record, server CPU per round trip at "
              f"{p.concurrency} workers", (conc, "postgres"), (conc, "postgres-norecord"),
              "server_cpu_per_op", "≤ 1.05×", as_percent=False),
    ]


def compute_ratios(p: Profile, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["scenario"], r["target"]): r for r in rows if "error" not in r}
    out = []
    for q in ratios(p):
        a, b = by.get(q.num), by.get(q.den)
        if not any(r["scenario"] == q.num[0] and r["target"] == q.num[1] for r in rows) or not any(
                r["scenario"] == q.den[0] and r["target"] == q.den[1] for r in rows):
            continue  # not asked for in this run (an error still shows, as n/a)
        value = None
        if a is not None and b is not None and b[q.metric] and not math.isnan(b[q.metric]):
            value = a[q.metric] / b[q.metric]
        out.append({"label": q.label, "value": value, "goal": q.goal, "percent": q.as_percent,
                    "num": a[q.metric] if a else None, "den": b[q.metric] if b else None, "metric": q.metric})
    return out


# Issue 18 §3 goals that the machine itself bounds, retired by issue 33 §3 (bench/README.md, "What the
# goals leave"): still the yardsticks of the headroom rows, printed without a goal.
SEQUENTIAL_GOAL = 0.60  # SQLite / bare, throughput sequential
POSTGRES_GOAL = 0.85  # PostgreSQL / SQLite, throughput at the concurrent workers


def headroom(p: Profile, rows: list[dict[str, Any]], fsync_p50: float | None) -> list[tuple[str, str, str]]:
    """What two goals leave the kernel, from the same run's figures.

    Sequential: a round trip is the client's work, then the server's, one after the other, and the
    kernel's includes two durable commits (the submit's, before the agent may act, and the
    outcome's). Take away from the goal's round trip the bare app's whole round trip, two one-row
    commits on a bare sqlite3 file in the same directory (`fsync_reference`) and what the signing
    client spends beyond the bare app's client: what is left is the kernel's own time (signature,
    validation, policy, its rows beyond one each). Concurrent PostgreSQL: while the CPUs are the
    bound, throughput goes as the inverse of all processes' CPU per round trip (server, client,
    PostgreSQL's backends); the goal then leaves the kernel what the client and backends do not use.
    """
    conc, seq = "round trip, concurrent", "round trip, sequential"
    by = {(r["scenario"], r["target"]): r for r in rows if "error" not in r}

    def ok(*rs: dict[str, Any] | None) -> bool:
        return all(r is not None and r["throughput"] > 0 and not math.isnan(r["throughput"]) for r in rs)

    out: list[tuple[str, str, str]] = []
    bare, sqlite = by.get((seq, "bare")), by.get((seq, "sqlite"))
    if fsync_p50 and ok(bare, sqlite):
        assert bare is not None and sqlite is not None
        rt_bare, rt_kernel = 1 / bare["throughput"], 1 / sqlite["throughput"]
        client_extra = max(sqlite["client_cpu_per_op"] - bare["client_cpu_per_op"], 0.0)
        floor = rt_bare + 2 * fsync_p50 + client_extra
        out += [
            ("SQLite / bare sequential, were the kernel's own time nil (the bare round trip, two one-row "
             "durable commits, the signing client)", f"{rt_bare / floor * 100:.1f} %", ""),
            (f"sequential: the kernel's own time per round trip, what {SEQUENTIAL_GOAL * 100:.0f} % leaves · now",
             f"{_ms(rt_bare / SEQUENTIAL_GOAL - floor)} · {_ms(rt_kernel - floor)} ms", ""),
        ]
    pg, sq = by.get((conc, "postgres")), by.get((conc, "sqlite"))
    if ok(pg, sq):
        assert pg is not None and sq is not None

        def total(r: dict[str, Any]) -> float:
            return float(r["server_cpu_per_op"] + r["client_cpu_per_op"] + r["other_cpu_per_op"])

        left = total(sq) / POSTGRES_GOAL - pg["client_cpu_per_op"] - pg["other_cpu_per_op"]
        out += [
            (f"PostgreSQL / SQLite at {p.concurrency} workers, were both CPU-bound (all processes' CPU per "
             "round trip, SQLite / PostgreSQL)", f"{total(sq) / total(pg) * 100:.1f} %", ""),
            (f"PostgreSQL at {p.concurrency} workers: the kernel's server CPU per round trip, what "
             f"{POSTGRES_GOAL * 100:.0f} % leaves beside the client and the backends · now",
             f"{_ms(left)} · {_ms(pg['server_cpu_per_op'])} ms", ""),
        ]
    return out


def render(p: Profile, rows: list[dict[str, Any]], rats: list[dict[str, Any]], figures: list[tuple[str, str, str]],
           env: dict[str, str], notes: list[str], elapsed: float) -> None:
    t = Table(title=f"regent bench ({p.name}) — latency in ms, throughput in operations/s", title_justify="left")
    for col, just in (("scenario", "left"), ("target", "left"), ("workers", "right"), ("ops", "right"),
                      ("p50", "right"), ("p90", "right"), ("p99", "right"), ("ops/s", "right"),
                      ("server CPU ms/op", "right"), ("client CPU ms/op", "right"), ("other CPU ms/op", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    last = None
    for r in rows:
        if last is not None and r["scenario"] != last:
            t.add_section()
        last = r["scenario"]
        if "error" in r:
            t.add_row(r["scenario"], r["target"], *[""] * 8, f"[red]{r['error'][:80]}[/]")
            continue
        tput = "–" if math.isnan(r["throughput"]) else f"{r['throughput']:.0f}"
        t.add_row(r["scenario"], r["target"], str(r["workers"]), str(r["ops"]), _ms(r["p50"]), _ms(r["p90"]),
                  _ms(r["p99"]), tput, _ms(r["server_cpu_per_op"]),
                  _ms(r["client_cpu_per_op"]), _ms(r["other_cpu_per_op"]))
    console.print(t)
    rt = Table(title="ratios (goals from the issue, shown beside the figure, not enforced)", title_justify="left")
    rt.add_column("figure")
    rt.add_column("ratio", justify="right")
    rt.add_column("goal", justify="right")
    for q in rats:
        if q["value"] is None:
            shown = "[dim]n/a[/]"
        elif q["percent"]:
            shown = f"{q['value'] * 100:.1f} %"
        else:
            shown = f"{q['value']:.2f}×"
        rt.add_row(q["label"], shown, q["goal"])
    for label, shown, goal in figures:
        rt.add_row(label, shown, goal)
    if rt.row_count:
        console.print(rt)
    for k, v in env.items():
        console.print(f"[dim]{k:>9}: {v}[/]")
    for n in notes:
        console.print(f"[yellow]note:[/] {n}")
    console.print(f"[dim]elapsed {elapsed:.1f}s[/]")


def _fs_of(path: Path) -> str:
    best, fs = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                    best, fs = parts[1], parts[2]
    except OSError:
        pass
    return fs


def busy_notes(rows: list[dict[str, Any]], load_start: str) -> list[str]:
    """Say so when something besides the bench used the machine: the bench's own load (client +
    one server, about 2 runnable) is expected; CPU that neither used is not, except PostgreSQL's."""
    cpus = os.cpu_count() or 1
    shares = [r["other_cpu_per_op"] * r["throughput"] for r in rows
              if "error" not in r and r["target"] in ("bare", "sqlite") and not math.isnan(r["throughput"])]
    out = []
    try:
        before = float(load_start.split()[0])
    except (ValueError, IndexError):
        before = 0.0
    if before > cpus * 0.5:
        out.append(f"load average {before:.2f} on {cpus} CPUs when the bench started")
    if shares and max(shares) > 0.2:
        out.append(f"other processes used up to {max(shares):.2f} of {cpus} CPUs while bare/sqlite were measured")
    if out:
        return ["the machine was shared (" + "; ".join(out) + "): absolute figures are low and noisy; the "
                "interleaved ratios and the server CPU per operation hold up better"]
    return []


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def environment(tmp: Path) -> dict[str, str]:
    def has(mod: str) -> bool:
        try:
            __import__(mod)
            return True
        except ImportError:
            return False

    import uvicorn

    return {
        "python": f"{platform.python_implementation()} {platform.python_version()} on {platform.machine()}, "
                  f"{os.cpu_count()} CPUs",
        "uvicorn": f"{uvicorn.__version__}, loop={'uvloop' if has('uvloop') else 'asyncio'}, "
                   f"http={'httptools' if has('httptools') else 'h11'} (loop/http 'auto', as regent serve)",
        "sqlite": f"{sqlite3.sqlite_version}, WAL, synchronous=FULL, file in {tmp} ({_fs_of(tmp)})",
    }


# -- entry point -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="regent bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="about 30 s instead of about 2 minutes")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"comma-separated subset of {','.join(TARGETS)} (default: all)")
    p.add_argument("--scenarios", default=None,
                   help="comma-separated scenarios to run (default: all): "
                        + ", ".join([f"{s.key} ({s.description})" for s in SCENARIOS]
                                    + [f"{s.key} ({s.description})" for s in LOCAL]))
    p.add_argument("--concurrency", type=int, default=None, help="client threads for the concurrent round trips")
    p.add_argument("--pg-url", default=os.environ.get("REGENT_TEST_POSTGRES_URL", DEFAULT_PG_URL),
                   help="server for the scratch database (REGENT_TEST_POSTGRES_URL)")
    p.add_argument("--tmpdir", default=None, help="where the SQLite file and server logs go (default: system temp)")
    p.add_argument("--json", dest="json_path", default=None, help="also write every figure to this JSON file")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (database, server logs)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    p = QUICK if args.quick else FULL
    if args.concurrency:
        p = Profile(**{**p.__dict__, "concurrency": max(1, min(args.concurrency, 64))})
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        console.print(f"[red]unknown target(s): {', '.join(sorted(unknown))}[/]")
        return 2
    # `decisions` (bench/audit.py) and `scale` (bench/scale.py: stores of 10^6 executions) run only when asked for
    scenarios, local = SCENARIOS, [s for s in LOCAL if s.key not in ("decisions", "scale")]
    if args.scenarios:
        wanted = {s.strip() for s in args.scenarios.split(",") if s.strip()}
        scenarios = [s for s in SCENARIOS if s.key in wanted]
        local = [s for s in LOCAL if s.key in wanted]
        if len(scenarios) + len(local) != len(wanted):
            keys = [s.key for s in SCENARIOS] + [s.key for s in LOCAL]
            console.print(f"[red]unknown scenario in {args.scenarios!r}; choose from: {', '.join(keys)}[/]")
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="regent-bench-", dir=args.tmpdir))
    load_start = load_average()
    env = environment(tmp)
    env["load"] = f"load average (1, 5, 15 min) {load_start} at start"
    notes: list[str] = []
    started = time.monotonic()
    console.print(f"[bold]regent bench[/] ({p.name}): targets {', '.join(targets)}; temp {tmp}")
    fsync_p50: float | None = None
    try:
        env["fsync"], fsync_p50 = fsync_reference(tmp, 100 if args.quick else 300)
        results = run_all(p, targets, scenarios, args.pg_url, tmp, notes, env) if scenarios else []
        for ls in local:
            console.print(f"  [dim]{ls.name} (in-process) …[/]")
            try:
                results += ls.run(p)
            except Exception as exc:
                results.append(Result(ls.name, "in-process", error=f"{type(exc).__name__}: {exc}"))
                console.print(f"  [red]{ls.name} failed: {exc}[/]")
        env["load"] += f", {load_average()} at end"
    finally:
        if args.keep:
            notes.append(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = [summary(r) for r in results]
    rats = compute_ratios(p, rows)
    notes += busy_notes(rows, load_start)
    figures = [f for r in results for f in r.figures] + headroom(p, rows, fsync_p50)
    elapsed = time.monotonic() - started
    render(p, rows, rats, figures, env, notes, elapsed)
    if args.json_path:
        doc = {"profile": p.__dict__, "environment": env, "notes": notes, "results": rows, "ratios": rats,
               "figures": figures, "elapsed": elapsed}
        Path(args.json_path).write_text(json.dumps(_finite(doc), indent=2) + "\n")
    return 1 if any("error" in r for r in rows) else 0


def _finite(o: Any) -> Any:
    """NaN (a figure that could not be taken) → null, so the file is strict JSON."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

