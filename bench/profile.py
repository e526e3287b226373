"""Where a round trip's server CPU goes: one kernel server under the bench's round-trip load,
sampled by py-spy, plus the server CPU per round trip of the bare app and the kernel side by side.

    python -m bench.profile --target sqlite --seconds 20 --out bench/profiles/sqlite-roundtrip.txt
    python -m bench.profile --target sqlite --seconds 5 --no-profile    # CPU per round trip only
    python -m bench.profile --target postgres --rounds 5 \
        --variant 4t=REGENT_CORE_THREADS=4 --variant 2t=REGENT_CORE_THREADS=2   # kernels A/B, no bare app

With `--variant NAME=K=V[,K=V…]` (repeatable) it serves one kernel per variant, each on its own
database, and alternates rounds between them instead of bare/kernel: each one's server CPU per
round trip, throughput, and on PostgreSQL its database backends' CPU per round trip (the
processes serving that database, from /proc; warm-up round trips included).

py-spy (`pip install py-spy`) samples every thread of the server process from outside, so the
event loop and the lane thread both show; its `--format raw` output (collapsed stacks) is turned
into a top-down text table of self and total time per function. Not part of the product: the
`regent bench` figures are the ones quoted; this finds where they come from.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.client import _TICK, drive, proc_cpu, round_trip
from bench.run import _prepare_kernel
from bench.scenarios import QUICK, Target, _fake_leases, _rt_prepare
from bench.servers import DEFAULT_PG_URL, free_port, pg_scratch, serve, serve_bare, serve_kernel


def _cpu_per_op(target: Target, leases: list, seconds: float, base: int) -> tuple[float, float, int]:
    def op_for(lease):  # type: ignore[no-untyped-def]
        return lambda agent, i: round_trip(agent, lease, base + i)

    r = drive(target.make_agent, [op_for(le) for le in leases], duration=seconds, max_ops=10**9,
              warmup_ops=5, warmup_seconds=0.5, server_pid=target.server.pid)
    return r.cpu.server * 1000 / max(r.ops, 1), r.throughput, r.ops


def _pg_backends(url: str) -> list[int]:
    """The server processes of the connections open on `url`'s database."""
    from sqlalchemy import create_engine, text

    from kernel.store.postgres import driver_url

    db = url.rsplit("/", 1)[1]
    eng = create_engine(driver_url(url.rsplit("/", 1)[0] + "/postgres"), connect_args={"connect_timeout": 3})
    try:
        with eng.connect() as c:
            return [int(r[0]) for r in c.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :d"),
                                                 {"d": db})]
    finally:
        eng.dispose()


def _backends_cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        cpu = proc_cpu(pid)
        if cpu == cpu:  # not NaN: still there
            out[pid] = cpu
    return out


def _fixture_db(stack: contextlib.ExitStack, args: argparse.Namespace, tmp: Path, name: str,
                prep: Any) -> tuple[str, Any, Any]:
    """A fresh database for one kernel (a file on SQLite, a scratch database on PostgreSQL) with
    the round-trip fixture written into it: its URL, the agent and the round trips' leases."""
    if args.target == "sqlite":
        db = f"sqlite:///{tmp}/{name}.db"
    else:
        db = stack.enter_context(pg_scratch(args.pg_url))
    scen = [type("S", (), {"name": "rt", "prepare": staticmethod(prep)})()]
    agent, prepared = _prepare_kernel(db, scen, QUICK)  # type: ignore[arg-type]
    return db, agent, prepared["rt"]


def variants(args: argparse.Namespace) -> int:
    """Kernels with different settings, alternating rounds; server (and backend) CPU per round trip."""
    specs: list[tuple[str, dict[str, str]]] = []
    for spec in args.variant:
        name, _, kvs = spec.partition("=")
        specs.append((name, dict(kv.split("=", 1) for kv in kvs.split(",") if kv)))
    common = dict(kv.split("=", 1) for kv in args.env)
    tmp = Path(tempfile.mkdtemp(prefix="regent-profile-"))
    prep = _rt_prepare(lambda _p: args.workers, "profile")
    try:
        with contextlib.ExitStack() as stack:
            live = []
            for name, env in specs:
                db, agent, leases = _fixture_db(stack, args, tmp, name, prep)
                srv = stack.enter_context(serve_kernel(name, db, tmp, {**common, **env}))
                live.append((name, db, Target(args.target, "kernel", srv, agent), leases))
            for _, _, target, _ in live:
                target.server.wait_ready(120)
            figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in specs}
            for i in range(args.rounds):
                order = live[i % len(live):] + live[:i % len(live)]
                for name, db, target, leases in order:
                    pids = _pg_backends(db) if args.target == "postgres" else []
                    b0 = _backends_cpu(pids)
                    t0 = _threads(target.server.pid)
                    k = _cpu_per_op(target, leases, args.seconds_per_round, (i + 1) * 10_000_000)
                    t1 = _threads(target.server.pid)
                    b1 = _backends_cpu(_pg_backends(db) if args.target == "postgres" else [])
                    done = max(k[2] + 5 * args.workers, 1)  # the warm-up's round trips too
                    backend = sum(v - b0.get(pid, 0.0) for pid, v in b1.items()) * 1000 / done
                    # The event loop is the main thread (its id is the pid); the others by CPU.
                    by_name: collections.Counter[str] = collections.Counter()
                    in_system: dict[str, float] = {}  # of which in the OS kernel (futex, pipe, epoll, fsync)
                    for tid, (_tname, cpu, sys_cpu) in t1.items():
                        key = "loop" if tid == target.server.pid else f"t{tid}"
                        before = t0.get(tid, ("", 0.0, 0.0))
                        by_name[key] += (cpu - before[1]) * 1000 / done
                        in_system[key] = (sys_cpu - before[2]) * 1000 / done
                    system = sum(in_system.values())
                    figures[name].append((k[0], backend, k[1]))
                    print(f"round {i}: {name:>10} kernel {k[0]:.3f} ms/op · backends {backend:.3f} ms/op · "
                          f"{k[1]:.0f} op/s · system {system:.3f} · threads "
                          + ", ".join(f"{n} {v:.3f} (system {in_system[n]:.3f})" for n, v in by_name.most_common(3)),
                          flush=True)
            with open("/proc/loadavg") as f:
                load = " ".join(f.read().split()[:3])
            for name, rows in figures.items():
                med = [statistics.median(r[j] for r in rows) for j in range(3)]
                print(f"median {name:>10}: kernel {med[0]:.3f} ms/op · backends {med[1]:.3f} ms/op · "
                      f"sum {med[0] + med[1]:.3f} · {med[2]:.0f} op/s   (kernel min {min(r[0] for r in rows):.3f})")
            print(f"load average at the end: {load}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _threads(pid: int) -> dict[int, tuple[str, float, float]]:
    """Thread id → (name, user+system CPU seconds, system CPU seconds), from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK)
        except (OSError, ValueError, IndexError):
            continue
    return out


def _summarise(raw: Path, out: Path, header: str, top: int = 60) -> None:
    """Collapsed stacks (`a;b;c N`) → self and inclusive sample counts per frame."""
    self_n: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        frames = stack.split(";")
        if frames and frames[0].startswith("process"):
            frames = frames[1:]
        # Idle waits are not CPU: py-spy --idle is off, so what remains is on-CPU or holding the GIL.
        total += k
        self_n[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    lines = [header, f"samples: {total}", "", "self %  function (file:line)"]
    for frame, count in self_n.most_common(top):
        lines.append(f"{100 * count / total:6.2f}  {frame}")
    lines += ["", "total %  function (file:line)"]
    for frame, count in incl.most_common(top):
        lines.append(f"{100 * count / total:6.2f}  {frame}")
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--target", default="sqlite", choices=["sqlite", "postgres"])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3, help="bare/kernel CPU-per-op rounds, alternating")
    p.add_argument("--out", default=None, help="profile text file (default: no profile)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--keep-stacks", action="store_true", help="also keep py-spy's collapsed stacks (.collapsed)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL)
    p.add_argument("--yappi", default=None, help="run the kernel under yappi; its table goes to this file")
    p.add_argument("--env", action="append", default=[], help="K=V for the kernel server (repeatable)")
    p.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL (Python CPU)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=K=V[,K=V]",
                   help="kernels with these settings, alternating (no bare app, no profile); repeatable")
    p.add_argument("--seconds-per-round", type=float, default=2.0, help="--variant: seconds per round")
    args = p.parse_args(argv)
    if args.variant:
        return variants(args)
    tmp = Path(tempfile.mkdtemp(prefix="regent-profile-"))
    prep = _rt_prepare(lambda _p: args.workers, "profile")
    try:
        with contextlib.ExitStack() as stack:
            db, agent, rt_leases = _fixture_db(stack, args, tmp, "profile", prep)
            if args.yappi:
                port = free_port()
                argv = [sys.executable, "-m", "bench.yappi_serve", str(Path(args.yappi).resolve()), "serve",
                        "--db-url", db, "--host", "127.0.0.1", "--port", str(port)]
                env = {"REGENT_BEARER_TOKEN": "bench-x", "REGENT_SQLITE_SYNCHRONOUS": "full"}
                ksrv = stack.enter_context(serve(args.target, argv, port, env, tmp))
            else:
                extra = dict(kv.split("=", 1) for kv in args.env)
                ksrv = stack.enter_context(serve_kernel(args.target, db, tmp, extra))
            bsrv = stack.enter_context(serve_bare(tmp))
            ksrv.wait_ready(120)
            bsrv.wait_ready(120)
            kt = Target(args.target, "kernel", ksrv, agent)
            bt = Target("bare", "bare", bsrv, fixtures.AgentCreds(fixtures.AGENT_ID, "x"))
            bare_leases = _fake_leases(args.workers)
            rows = []
            for i in range(args.rounds):
                b = _cpu_per_op(bt, bare_leases, 2.0, 0)
                k = _cpu_per_op(kt, rt_leases, 2.0, (i + 1) * 10_000_000)
                rows.append((b, k))
                print(f"round {i}: bare {b[0]:.3f} ms/op {b[1]:.0f} op/s · {args.target} {k[0]:.3f} ms/op "
                      f"{k[1]:.0f} op/s · cpu ratio {k[0] / b[0]:.2f}× · throughput {100 * k[1] / b[1]:.1f} %",
                      flush=True)
            bm = sorted(r[0][0] for r in rows)[len(rows) // 2]
            km = sorted(r[1][0] for r in rows)[len(rows) // 2]
            print(f"median: bare {bm:.3f} ms/op, {args.target} {km:.3f} ms/op, ratio {km / bm:.2f}×")
            if args.out and not args.no_profile:
                spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                raw = tmp / "raw.txt"
                rec = subprocess.Popen([spy, "record", "--pid", str(ksrv.pid), "--format", "raw", "--rate", "250",
                                        "--output", str(raw), "--duration", str(int(args.seconds) + 2), "--nonblocking",
                                        *(["--gil"] if args.gil else [])],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
                before = _threads(ksrv.pid)
                k = _cpu_per_op(kt, rt_leases, args.seconds, 90_000_000)
                after = _threads(ksrv.pid)
                rec.wait(timeout=args.seconds + 60)
                with open("/proc/loadavg") as f:
                    load = " ".join(f.read().split()[:3])
                per_thread = sorted(((after[t][1] - before.get(t, (None, 0.0))[1]) * 1000 / max(k[2], 1), after[t][0])
                                    for t in after)
                threads = ", ".join(f"{name} {ms:.3f}" for ms, name in reversed(per_thread) if ms > 0.005)
                _summarise(raw, Path(args.out), f"{args.target} round trip, {args.workers} workers, {args.seconds:g} s, "
                           f"{k[2]} round trips, server CPU {k[0]:.3f} ms/op (under py-spy{', --gil' if args.gil else ''}), "
                           f"load {load}\nCPU ms per round trip by thread: {threads}")
                if args.keep_stacks:
                    shutil.copy(raw, Path(args.out).with_suffix(".collapsed"))
                print(f"profile: {args.out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
