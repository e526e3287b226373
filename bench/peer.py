"""The `peer` scenario: the kernel's step round trip beside DBOS durable workflow steps, one run.

Per store (SQLite in one temp directory; PostgreSQL on one server, a scratch database each), its
own processes: `regent serve` with an agent and 9 claimed executions, the bare ceiling app (for
the sequential floor) and a DBOS process (bench/peer_dbos.py). Rounds alternate the sides and
rotate who goes first: Regent's round trip (submit → proceed → complete over HTTP, signed,
policy-checked, two durable commits) and DBOS steps back to back in workflows of 50, each once
sequentially (1 worker) and once at `concurrency` workers (threads). A step is one operation on
both sides. Beside each throughput ratio: CPU per step of the kernel process, the bench client,
the DBOS process and the PostgreSQL backends of each side's database (pg_stat_activity's pids,
read from /proc), since the client shares the two CPUs and DBOS has none.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.client import (
    Agent,
    BenchError,
    CpuSample,
    Lease,
    Run,
    drive,
    percentile,
    proc_cpu,
    round_trip,
)
from bench.scenarios import LocalScenario, Profile, Result
from bench.servers import DEFAULT_PG_URL, ROOT, Server, pg_scratch, serve_bare, serve_kernel

SQLITE_GOAL, POSTGRES_GOAL = 1.0, 0.8  # Regent / DBOS steps per second at `concurrency` (issue 33 §1)


# -- PostgreSQL backends' CPU -------------------------------------------------------------------------


class Backends:
    """CPU of the server processes serving one database (its pids in pg_stat_activity, from /proc);
    a backend born inside a window counts whole. A query on an admin connection of another database,
    so the sampling's own backend is not counted."""

    def __init__(self, admin_url: str | None, db_url: str | None):
        self.conn = None
        self.db = db_url.rsplit("/", 1)[1] if db_url else None
        if admin_url and db_url:
            import psycopg

            self.conn = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)

    def sample(self) -> dict[int, float]:
        if self.conn is None:
            return {}
        pids = [r[0] for r in self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                                 (self.db,)).fetchall()]
        return {p: c for p in pids if not math.isnan(c := proc_cpu(p))}

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        return sum(c - before.get(p, 0.0) for p, c in after.items())

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# -- the DBOS side --------------------------------------------------------------------------------------


class Dbos:
    def __init__(self, url: str, log: Path):
        self.log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.peer_dbos", url], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self._read(120)

    def _read(self, timeout: float) -> dict[str, Any]:
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise BenchError(f"DBOS answered nothing in {timeout:g} s")
        finally:
            sel.close()
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"DBOS exited with {self.proc.wait(5)} (see its log)")
        out: dict[str, Any] = json.loads(line)
        return out

    def run(self, workers: int, seconds: float, max_steps: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {workers} {seconds} {max_steps}\n")
        self.proc.stdin.flush()
        ans = self._read(seconds + 180)
        if ans.get("errors"):
            raise BenchError(f"DBOS workflow failed: {ans['errors'][0]}")
        return ans

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.log.close()


# -- one store --------------------------------------------------------------------------------------


@dataclass
class Side:
    """What one side measured over all rounds: the latencies, wall, and CPU by process."""

    lat: list[float]
    wall: float = 0.0
    kernel: float = 0.0  # the kernel's server process (Regent) or the DBOS process
    client: float = 0.0  # the bench process (Regent only)
    backends: float = 0.0  # PostgreSQL backends of this side's database

    @property
    def ops(self) -> int:
        return len(self.lat)

    @property
    def throughput(self) -> float:
        return self.ops / self.wall if self.wall else float("nan")

    def per(self, x: float) -> float:
        return x / self.ops if self.ops else float("nan")


def _prepare(db_url: str, n: int) -> tuple[fixtures.AgentCreds, list[Lease]]:
    from kernel.core.kernel import Kernel
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    try:
        migrate(store)
        k = Kernel(store=store)
        agent = fixtures.new_agent(k)
        return agent, fixtures.start_executions(k, agent, n, "peer")
    finally:
        store.close()


def _regent_round(srv: Server, agent: fixtures.AgentCreds, leases: list[Lease], seconds: float, max_ops: int,
                  base: int, pg: Backends, p: Profile) -> tuple[Run, float]:
    def op_for(lease: Lease) -> Any:
        return lambda a, i: round_trip(a, lease, base + i)

    b0 = pg.sample()
    r = drive(lambda: Agent(srv.url, agent.agent_id, agent.secret), [op_for(lease) for lease in leases],
              duration=seconds, max_ops=max_ops, warmup_ops=p.warmup_ops, warmup_seconds=p.warmup_seconds,
              server_pid=srv.pid)
    return r, Backends.used(b0, pg.sample())


@contextlib.contextmanager
def _stores(store: str, tmp: Path, pg_url: str) -> Iterator[tuple[str, str]]:
    if store == "sqlite":
        yield f"sqlite:///{tmp}/regent-peer.db", f"sqlite:///{tmp}/dbos-peer.sqlite"
        return
    with pg_scratch(pg_url) as regent_db, pg_scratch(pg_url) as dbos_db:
        yield regent_db, dbos_db


def measure_store(store: str, p: Profile, pg_url: str, tmp: Path) -> dict[str, Side]:
    """Interleaved rounds on one store: Regent and DBOS, sequential and concurrent, and the bare
    app's sequential round trip (for the floor)."""
    conc = p.concurrency
    rounds = max(2, p.rounds)
    seq_s, conc_s = p.seq_seconds / rounds, p.conc_seconds / rounds
    sides = {k: Side([]) for k in ("regent seq", "regent conc", "dbos seq", "dbos conc", "bare seq")}
    with _stores(store, tmp, pg_url) as (regent_db, dbos_db), contextlib.ExitStack() as stack:
        agent, leases = _prepare(regent_db, conc + 1)
        srv = stack.enter_context(serve_kernel(f"peer-{store}", regent_db, tmp))
        bare = stack.enter_context(serve_bare(tmp))
        dbos = Dbos(dbos_db, tmp / f"dbos-{store}.log")
        stack.callback(dbos.close)
        is_pg = store == "postgres"
        pg_regent = Backends(pg_url if is_pg else None, regent_db if is_pg else None)
        pg_dbos = Backends(pg_url if is_pg else None, dbos_db if is_pg else None)
        stack.callback(pg_regent.close)
        stack.callback(pg_dbos.close)
        srv.wait_ready(120.0)
        bare.wait_ready(120.0)
        fake = fixtures.AgentCreds(fixtures.AGENT_ID, "unused-by-the-bare-app")
        bare_lease = [Lease(str(uuid.uuid4()), str(uuid.uuid4()), 1)]

        def regent(key: str, ls: list[Lease], seconds: float, max_ops: int, i: int) -> None:
            r, be = _regent_round(srv, agent, ls, seconds, max_ops, (i + 1) * 10_000_000, pg_regent, p)
            s = sides[key]
            s.lat += r.latencies
            s.wall += r.wall
            s.kernel += r.cpu.server
            s.client += r.cpu.client
            s.backends += be

        def peer(key: str, workers: int, seconds: float, max_ops: int) -> None:
            b0 = pg_dbos.sample()
            ans = dbos.run(workers, seconds, max_ops)
            s = sides[key]
            s.lat += ans["latencies"]
            s.wall += ans["wall"]
            s.kernel += ans["cpu"]
            s.backends += Backends.used(b0, pg_dbos.sample())

        def bare_seq(i: int) -> None:
            r = drive(lambda: Agent(bare.url, fake.agent_id, fake.secret),
                      [lambda a, n: round_trip(a, bare_lease[0], n)], duration=seq_s / 2,
                      max_ops=p.seq_max_ops, warmup_ops=p.warmup_ops, warmup_seconds=p.warmup_seconds,
                      server_pid=bare.pid)
            s = sides["bare seq"]
            s.lat += r.latencies
            s.wall += r.wall
            s.kernel += r.cpu.server
            s.client += r.cpu.client

        for i in range(rounds):
            seq: list[Callable[[], None]] = [partial(regent, "regent seq", leases[:1], seq_s, p.seq_max_ops, i),
                                             partial(peer, "dbos seq", 1, seq_s, p.seq_max_ops)]
            cc: list[Callable[[], None]] = [partial(regent, "regent conc", leases[1:], conc_s, p.conc_max_ops, i),
                                            partial(peer, "dbos conc", conc, conc_s, p.conc_max_ops)]
            if i % 2:
                seq.reverse()
                cc.reverse()
            for f in [*seq, *cc]:
                f()
            bare_seq(i)
    return sides


# -- reference commits (the floor) ------------------------------------------------------------------


def pg_commit_p50(pg_url: str, n: int = 200) -> float:
    """One-row autocommit INSERT on the PostgreSQL server: the floor of one durable commit there."""
    import psycopg

    with pg_scratch(pg_url) as url, psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
        lat = []
        stop = time.perf_counter() + 5.0
        for _ in range(n):
            t = time.perf_counter()
            c.execute("INSERT INTO t (v) VALUES (%s)", ("x" * 200,))
            lat.append(time.perf_counter() - t)
            if t > stop:
                break
    lat.sort()
    return percentile(lat, 0.5)


def floor_throughput(sides: dict[str, Side], commit: float) -> float:
    """Steps per second a kernel with no time of its own would reach sequentially: the bare app's
    round trip, two one-row durable commits, and what the signing client spends beyond the bare
    app's client (the same floor `headroom` in bench/run.py computes for SQLite)."""
    bare, reg = sides["bare seq"], sides["regent seq"]
    if not bare.ops or not reg.ops:
        return float("nan")
    extra = max(reg.per(reg.client) - bare.per(bare.client), 0.0)
    return 1.0 / (1.0 / bare.throughput + 2 * commit + extra)


# -- the scenario --------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 1e3:.2f}"


def results_for(store: str, sides: dict[str, Side], commit: float, concurrency: int) -> list[Result]:
    label = {"sqlite": "SQLite", "postgres": "PostgreSQL"}[store]
    out = []
    for key, s in sides.items():
        if key == "bare seq":
            continue
        who, mode = key.split()
        workers = 1 if mode == "seq" else concurrency
        run = Run(s.lat, s.wall, workers, CpuSample(s.kernel, s.client, float("nan")))
        out.append(Result(f"peer: steps, {'sequential' if mode == 'seq' else f'{concurrency} concurrent'}",
                          f"{'regent' if who == 'regent' else 'dbos'} {store}", run, op="step",
                          extra={"backends_cpu_per_op": s.per(s.backends)}))
    figs = out[-1].figures
    rc, dc = sides["regent conc"], sides["dbos conc"]
    rs, ds = sides["regent seq"], sides["dbos seq"]
    goal = SQLITE_GOAL if store == "sqlite" else POSTGRES_GOAL
    cpu = (f"CPU ms/step: Regent kernel {_ms(rc.per(rc.kernel))} + client {_ms(rc.per(rc.client))} + backends "
           f"{_ms(rc.per(rc.backends))}; DBOS {_ms(dc.per(dc.kernel))} + backends {_ms(dc.per(dc.backends))}")
    figs.append((f"peer: Regent / DBOS steps/s, {label}, {concurrency} concurrent",
                  f"{rc.throughput / dc.throughput:.2f}× ({rc.throughput:.0f} / {dc.throughput:.0f}); {cpu}",
                  f"≥ {goal:.1f}×"))
    floor = floor_throughput(sides, commit)
    figs.append((f"peer: Regent / DBOS steps/s, {label}, sequential (floor: a kernel of no cost of its own)",
                 f"{rs.throughput / ds.throughput:.2f}× ({rs.throughput:.0f} / {ds.throughput:.0f}); floor "
                 f"{floor / ds.throughput:.2f}× ({floor:.0f}/s: bare {sides['bare seq'].throughput:.0f}/s, "
                 f"2 × {commit * 1e3:.2f} ms commits)", ""))
    return out


def _run(p: Profile) -> list[Result]:
    import os

    from bench.servers import fsync_reference

    pg_url = os.environ.get("REGENT_TEST_POSTGRES_URL", DEFAULT_PG_URL)
    out: list[Result] = []
    tmp = Path(tempfile.mkdtemp(prefix="regent-bench-peer-"))
    try:
        for store in [k for k in os.environ.get("REGENT_BENCH_PEER_STORES", "sqlite,postgres").split(",") if k]:
            try:
                commit = fsync_reference(tmp, 300)[1] if store == "sqlite" else pg_commit_p50(pg_url)
                out += results_for(store, measure_store(store, p, pg_url, tmp), commit, p.concurrency)
            except Exception as exc:
                out.append(Result("peer", store, error=f"{type(exc).__name__}: {exc}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


PEER = LocalScenario("peer", "peer: Regent beside DBOS", _run,
                     "DBOS workflow steps beside the kernel's round trip, 1 and 8 workers, SQLite and PostgreSQL")
