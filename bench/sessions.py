"""`regent bench --scenarios sessions`: session admission latency and fork creation time, in the
bench process on a SQLite file (the kernel's use cases, no HTTP).

- Admission: one session with queued executions; each sample is the time from the running one's
  `complete` (which admits the next) to the next one's dispatch being claimed, p50/p99.
- Forks: `fork_execution` on sources of 10 and 10 000 recorded steps (written in bulk, as a
  recorded log would be), median of a few interleaved rounds each, and their ratio (goal ≤ 1.5×).
  A fork references its source's steps (lineage) instead of copying them, so the ratio is ~1.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench import fixtures
from bench.client import percentile
from bench.scenarios import LocalScenario, Profile, Result
from kernel.core import executions, forks
from kernel.core.agents import register_agent
from kernel.core.dispatch import claim_due
from kernel.core.executions import Lineage
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.identity import args_hash, step_id
from kernel.store import open_store
from kernel.store import tables as t
from kernel.store.migrations import migrate


def _admission(k: Kernel, n: int) -> list[float]:
    lin = Lineage(session="bench-session")
    ids = [executions.create_execution(k, "bench", i, lineage=lin)[0].id for i in range(n + 1)]
    claim = next(c for c in claim_due(k, 10) if c.execution_id == ids[0])
    samples = []
    for nxt in ids[1:]:
        t0 = time.perf_counter()
        executions.finish_execution(k, Lease("bench", claim.execution_id, claim.dispatch_id, claim.attempt), output=1)
        claim = next(c for c in claim_due(k, 10) if c.execution_id == nxt)
        samples.append(time.perf_counter() - t0)
    return samples


def _source(k: Kernel, n_steps: int) -> tuple[str, int]:
    """A completed execution with `n_steps` recorded tool steps and their four events each."""
    e, _ = executions.create_execution(k, "bench", None)
    now = k.clock.now()
    h = args_hash("{}")
    steps: list[dict[str, object]] = []
    events: list[tuple[str, str, object]] = []
    with k.store.read() as tx:
        base = tx.last_event_seq(e.id)
    for i in range(n_steps):
        sid = step_id(e.id, "tool_call", f"t{i}", h, 0)
        at = now + timedelta(microseconds=i)
        steps.append({"step_id": sid, "execution_id": e.id, "kind": "tool_call", "target": f"t{i}", "args_hash": h,
                      "occurrence": 0, "status": "succeeded", "idempotency": "safe_to_retry", "args": "{}",
                      "result": f'"r{i}"', "error": None, "usage_input": 0, "usage_output": 0,
                      "started_at": at, "completed_at": at,
                      "outcome_seq": base + len(events) + 4})
        for typ in ("step.proposed", "step.allowed", "step.executing", "step.succeeded"):
            events.append((typ, f'{{"step_id":"{sid}","step_type":"tool_call","target":"t{i}"}}', at))
    with fixtures.sql_store(k).transaction(lock=e.id) as tx:
        tx.insert_many(t.steps, steps)
        tx.insert_many(t.events, [{"execution_id": e.id, "event_seq": base + j + 1, "type": typ, "payload": p,
                                   "occurred_at": at} for j, (typ, p, at) in enumerate(events)])
        tx.set_last_event_seq(e.id, base + len(events))
    return e.id, base + len(events)


def _fork_seconds(k: Kernel, sources: list[tuple[str, int]], rounds: int) -> list[tuple[float, float]]:
    """Median fork creation (wall, CPU) time of each source, the sources' rounds interleaved (one
    warm-up round first), so load on a shared machine falls on both alike. The wall time holds
    the commit's fsync, noisy under load; the CPU time is what the history length could change."""
    walls: list[list[float]] = [[] for _ in sources]
    cpus: list[list[float]] = [[] for _ in sources]
    for r in range(rounds + 1):
        for i, (src, at) in enumerate(sources):
            t0, c0 = time.perf_counter(), time.process_time()
            forks.fork_execution(k, src, at)
            if r:
                walls[i].append(time.perf_counter() - t0)
                cpus[i].append(time.process_time() - c0)
    return [(sorted(w)[len(w) // 2], sorted(c)[len(c) // 2]) for w, c in zip(walls, cpus, strict=True)]


def _run(p: Profile) -> list[Result]:
    quick = p.name == "quick"
    tmp = Path(tempfile.mkdtemp(prefix="regent-bench-sessions-"))
    try:
        store = open_store(f"sqlite:///{tmp}/bench.db")
        migrate(store)
        k = Kernel(store=store)
        register_agent(k, "bench", "http://127.0.0.1:9/webhook", "s3cret", None, keep_policy=True)
        adm = sorted(_admission(k, 100 if quick else 500))
        rounds = 21 if quick else 61
        (t_small, c_small), (t_big, c_big) = _fork_seconds(k, [_source(k, 10), _source(k, 10_000)], rounds)
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ms = 1000.0
    return [
        Result("sessions: admission (end → next dispatch claimed)", "in-process sqlite", op="admission",
               stats={"p50": percentile(adm, 0.5), "p90": percentile(adm, 0.9), "p99": percentile(adm, 0.99),
                      "max": adm[-1], "ops": len(adm)},
               figures=[("sessions: admission latency p50 / p99",
                         f"{percentile(adm, 0.5) * ms:.2f} / {percentile(adm, 0.99) * ms:.2f} ms", "—")]),
        Result("forks: fork creation", "in-process sqlite", op="fork",
               stats={"p50": t_small, "ops": rounds}, extra={"steps": 10}),
        Result("forks: fork creation", "in-process sqlite, 10 000 steps", op="fork",
               stats={"p50": t_big, "ops": rounds}, extra={"steps": 10_000},
               figures=[("forks: creation at 10 000 / 10 recorded steps",
                         f"{t_big / t_small:.1f}× ({t_big * ms:.1f} / {t_small * ms:.1f} ms)", "≤ 1.5×"),
                        ("forks: creation CPU at 10 000 / 10 recorded steps",
                         f"{c_big / c_small:.2f}× ({c_big * ms:.2f} / {c_small * ms:.2f} ms)", "≤ 1.5×")]),
    ]


SESSIONS = LocalScenario("sessions", "sessions and forks", _run,
                         "session admission latency; fork creation at 10 and 10 000 steps (in-process, SQLite)")
