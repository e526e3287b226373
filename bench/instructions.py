"""Instructions and server CPU per step round trip, for decisions a busy machine cannot blur.

    python -m bench.instructions --target sqlite                       # callgrind, 100 and 300 round trips
    python -m bench.instructions --target bare
    python -m bench.instructions --target postgres                     # a scratch database per run
    python -m bench.instructions --cpu --target postgres --yappi /tmp/y.txt   # + yappi's function table
    python -m bench.instructions --cpu --tree before=/tmp/base --tree after=. --rounds 6

Callgrind mode runs the server (`regent serve` on SQLite with `synchronous=FULL`, on a scratch
PostgreSQL database made for the run, or the bare app) under `valgrind --tool=callgrind`, drives it from this process with sequential signed round
trips (submit → proceed → complete → recorded, the bench's own request shapes), stops it with
SIGTERM and reads the instruction total; the difference of two runs of different lengths,
divided by the difference of their round trips, leaves the cost of one round trip with start-up
and shutdown cancelled. The client is another process, so none of its instructions count (on PostgreSQL neither do
the server backends': only the kernel process runs under valgrind).
Instruction counts barely move with the host's load (the same binary counts the same
instructions), which CPU time on a shared 2-CPU machine does not.

CPU mode starts one server per `--tree` (a source tree to serve from: this checkout, or an
exported older commit) and alternates rounds of sequential round trips between them, reading
each server's CPU from /proc, so a burst of load lands on every tree alike.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.client import Agent, Lease, proc_cpu, round_trip
from bench.fixtures import AgentCreds
from bench.servers import DEFAULT_PG_URL, ROOT, free_port, pg_scratch

# Periodic work goes with the wall time, and under valgrind a round trip takes ~50× longer: the
# dispatcher's 0.25 s idle poll would add its cost per round trip many times over, and the decision
# journal's move (1 s) would land in batches of varying size. Here the journal moves once, on stop
# (its whole per-step cost, in one batch), and the idle polls all but stop.
QUIET_ENV = {"REGENT_DISPATCH_POLL_INTERVAL": "30", "REGENT_DECISION_FLUSH_INTERVAL": "3600",
             "REGENT_SHADOW_FLUSH_INTERVAL": "3600", "REGENT_DEADLINE_CHECK_INTERVAL": "3600"}


def _prepare(db_url: str) -> tuple[AgentCreds, Lease]:
    from bench import fixtures
    from kernel.core.kernel import Kernel
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    try:
        migrate(store)
        k = Kernel(store=store)
        agent = fixtures.new_agent(k)
        (lease,) = fixtures.start_executions(k, agent, 1, "instructions")
    finally:
        store.close()
    return agent, lease


# The scratch databases' server (--pg-url); each PostgreSQL server run gets a database of its own.
PG_URL = DEFAULT_PG_URL


@contextlib.contextmanager
def _server(target: str, tree: Path, workdir: Path, env: dict[str, str], prefix: list[str],
            log_name: str, yappi: Path | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str, AgentCreds, Lease]]:
    with contextlib.ExitStack() as stack:
        if target == "bare":
            url = ""
        elif target == "postgres":
            url = stack.enter_context(pg_scratch(PG_URL))
        else:
            db = workdir / f"{log_name}.db"
            for suffix in ("", "-wal", "-shm", ".lock"):
                Path(str(db) + suffix).unlink(missing_ok=True)
            url = f"sqlite:///{db}"
        yield stack.enter_context(_process(target, url, tree, workdir, env, prefix, log_name, yappi))


@contextlib.contextmanager
def _process(target: str, url: str, tree: Path, workdir: Path, env: dict[str, str], prefix: list[str],
             log_name: str, yappi: Path | None) -> Iterator[tuple[subprocess.Popen[bytes], str, AgentCreds, Lease]]:
    port = free_port()
    if target == "bare":
        argv = [sys.executable, "-m", "bench.bare", "--port", str(port), "--log-level", "warning"]
        agent, lease = AgentCreds("bench-agent", "bare"), Lease(
            "0190a1b2-0000-7000-8000-000000000001", "0190a1b2-0000-7000-8000-000000000002", 1)
    else:
        agent, lease = _prepare(url)
        serve = ["-m", "kernel"] if yappi is None else ["-m", "bench.yappi_serve", str(yappi)]
        argv = [sys.executable, *serve, "serve", "--db-url", url, "--host", "127.0.0.1", "--port", str(port)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("REGENT_")}
    full_env.update({"PYTHONPATH": str(tree), "REGENT_BEARER_TOKEN": "bench-token",
                     "REGENT_SQLITE_SYNCHRONOUS": "full", "REGENT_LOG_LEVEL": "warning", **env})
    with open(workdir / f"{log_name}.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(prefix + argv, cwd=tree, env=full_env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
    http = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{log_name} exited: {(workdir / f'{log_name}.log').read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(http + "/v0/health", timeout=5.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{log_name} did not start")
            time.sleep(0.2)
        yield proc, http, agent, lease
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.M)


def _instructions(out_prefix: Path) -> dict[str, int]:
    """Ir per callgrind output file (one per thread with --separate-threads)."""
    found = {}
    for path in sorted(out_prefix.parent.glob(out_prefix.name + "*")):
        m = _TOTALS.search(path.read_text(errors="replace"))
        if m:
            found[path.name] = int(m.group(1))
    return found


def callgrind(target: str, tree: Path, counts: tuple[int, int], env: dict[str, str], keep: Path | None) -> None:
    """Per round trip: the event loop's thread (the main one), the lane's (the busiest other ones, as
    many as the lane has threads: 1 on SQLite, `REGENT_CORE_THREADS` or 4 on PostgreSQL) and the
    rest (background threads, whose work goes with the wall time, ~50× longer under valgrind)."""
    lanes = int(env.get("REGENT_CORE_THREADS") or (4 if target == "postgres" else 1))
    with tempfile.TemporaryDirectory(prefix="regent-ir-") as tmp:
        work = Path(tmp)
        runs = []
        for n in counts:
            out = (keep or work) / f"callgrind.{target}.{n}"
            for old in out.parent.glob(out.name + "*"):
                old.unlink()
            prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--separate-threads=yes",
                      "--dump-instr=no"]
            with _server(target, tree, work, env, prefix, f"{target}-{n}") as (_proc, url, agent, lease):
                a = Agent(url, agent.agent_id, agent.secret)
                try:
                    for i in range(n):
                        round_trip(a, lease, i)
                finally:
                    a.close()
            # Thread numbers follow the order threads start in, the same in both runs.
            per_thread = {k.rsplit("-", 1)[-1]: v for k, v in _instructions(out).items()}
            runs.append(per_thread)
            print(f"{target} {n} round trips: {sum(per_thread.values()):,} Ir  "
                  + "  ".join(f"{k}={v / 1e6:.1f}M" for k, v in per_thread.items()))
        span = (counts[1] - counts[0]) * 1e6
        delta = {k: (runs[1].get(k, 0) - runs[0].get(k, 0)) / span for k in runs[0].keys() | runs[1].keys()}
        main = delta.pop("01", 0.0)
        lane = sorted(delta.values(), reverse=True)[:lanes]
        rest = sum(delta.values()) - sum(lane)
        print(f"{target}: M instructions per round trip: event loop {main:.3f}, lane {sum(lane):.3f}"
              + (f" ({' + '.join(f'{x:.3f}' for x in lane)})" if lanes > 1 else "")
              + f", request path {main + sum(lane):.3f}; other threads {rest:.3f}; all {main + sum(delta.values()):.3f}"
              f"  ({tree})")


def cpu(trees: dict[str, Path], rounds: int, ops: int, env: dict[str, str], yappi: Path | None = None,
        kernel_target: str = "sqlite") -> None:
    with tempfile.TemporaryDirectory(prefix="regent-cpu-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        live = {}
        for name, tree in trees.items():
            target = "bare" if name == "bare" else kernel_target
            proc, url, agent, lease = stack.enter_context(_server(target, tree, work, env, [], name, yappi))
            a = Agent(url, agent.agent_id, agent.secret)
            stack.callback(a.close)
            for i in range(50):  # warm-up: imports, compiled statements, caches
                round_trip(a, lease, 10**9 + i)
            live[name] = (proc, a, lease)
        figures: dict[str, list[float]] = {name: [] for name in trees}
        for r in range(rounds):
            order = list(live)
            order = order[r % len(order):] + order[:r % len(order)]
            for name in order:
                proc, a, lease = live[name]
                c0 = proc_cpu(proc.pid)
                for i in range(ops):
                    round_trip(a, lease, r * 1_000_000 + i)
                figures[name].append((proc_cpu(proc.pid) - c0) * 1000 / ops)
        load = os.getloadavg()[0]
        for name, xs in figures.items():
            print(f"{name:>10}: server CPU per round trip, ms: median {statistics.median(xs):.3f}  "
                  f"min {min(xs):.3f}  rounds {' '.join(f'{x:.3f}' for x in xs)}")
        print(f"load average at the end: {load:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions")
    p.add_argument("--target", choices=["sqlite", "postgres", "bare"], default="sqlite",
                   help="callgrind: the server; --cpu: the kernel's store (a tree named 'bare' is the bare app)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server for the scratch databases (postgres)")
    p.add_argument("--counts", default="100,300", help="round trips of the two callgrind runs")
    p.add_argument("--tree", action="append", default=[], metavar="[NAME=]PATH",
                   help="source tree to serve from (default: this checkout); in --cpu mode, several")
    p.add_argument("--cpu", action="store_true", help="server CPU per round trip, trees alternating")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ops", type=int, default=300, help="round trips per CPU round")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    p.add_argument("--yappi", type=Path, help="--cpu: serve the kernel under yappi, its table to this file "
                   "(one kernel tree: each would write the same file)")
    args = p.parse_args(argv)
    global PG_URL
    PG_URL = args.pg_url
    env = dict(QUIET_ENV)
    env.update(dict(e.split("=", 1) for e in args.env))
    trees: dict[str, Path] = {}
    for spec in args.tree or [str(ROOT)]:
        name, _, path = spec.rpartition("=")
        trees[name or Path(path).name] = Path(path).resolve()
    if args.cpu:
        cpu(trees, args.rounds, args.ops, env, args.yappi.resolve() if args.yappi else None, args.target)
        return 0
    a, b = (int(x) for x in args.counts.split(","))
    callgrind(args.target, next(iter(trees.values())), (a, b), env, args.keep)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
