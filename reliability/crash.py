"""R1 crash: real SDK agents run five-step executions while the kernel is SIGKILLed at random
moments and restarted on the same database.

Afterwards every execution whose create got a 2xx is terminal and completed, its event seqs are
gapless with no duplicate, every step has exactly one terminal event, and no `at_most_once` effect
ran twice (the agent counts its effects in a side file)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx

from reliability.audit import audit, effect_counts, first
from reliability.procs import (
    FAST_DISPATCH,
    TOKEN,
    Agent,
    Kernel,
    effect_lines,
    free_port,
    write_manifest,
)
from reliability.report import Outcome


def create_paced(url: str, agent_id: str, n: int, pace: float, deadline: list[float], key: str,
                 acked: dict[int, str], stats: dict[str, int], stop: threading.Event, offset: int = 0) -> None:
    """Create executions `offset`, `offset + step`, … one every `pace` s, each retried (same
    idempotency key) until a 2xx or the deadline (`deadline[0]`, which the killer moves on by the
    time the kernel spent down); remember only what was acknowledged."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
        for i in range(offset, n, 2):
            while time.monotonic() < deadline[0] and not stop.is_set():
                try:
                    r = http.post("/v0/executions", json={"agent_id": agent_id, "input": {"i": i},
                                                          "idempotency_key": f"{key}-{i}"})
                    if r.status_code in (200, 201):
                        acked[i] = r.json()["id"]
                        break
                    stats[f"create {r.status_code}"] = stats.get(f"create {r.status_code}", 0) + 1
                except httpx.HTTPError:
                    stats["create retried"] = stats.get("create retried", 0) + 1
                time.sleep(0.1)
            time.sleep(pace)


def wait_terminal(url: str, ids: list[str], timeout: float) -> list[str]:
    """Poll until every id is terminal (bounded); returns those that are not."""
    pending = set(ids)
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
        while pending and time.monotonic() < deadline:
            for eid in list(pending):
                try:
                    r = http.get(f"/v0/executions/{eid}")
                    if r.status_code == 200 and r.json()["status"] in ("completed", "failed", "cancelled"):
                        pending.discard(eid)
                except httpx.HTTPError:
                    pass
            if pending:
                time.sleep(0.5)
    return sorted(pending)


def run(tmp: Path, *, db_url: str, label: str, executions: int, kills: int, seed: int) -> Outcome:
    out = Outcome("R1", f"crash ({label})",
                  tried=f"{executions} five-step executions by an SDK agent; kernel SIGKILLed {kills}× "
                        f"at random moments, restarted on the same {label} database")
    rnd = random.Random(seed)
    agent_port = free_port()
    manifest = write_manifest(tmp / "regent.yaml", {"crash": agent_port})
    kernel = Kernel(db_url, tmp / "kernel.log", manifest=manifest, **FAST_DISPATCH).start()
    agent = Agent(kernel.url, "crash", agent_port, tmp)
    acked: dict[int, str] = {}
    stats: dict[str, int] = {}
    stop = threading.Event()
    started = time.monotonic()
    gaps = [rnd.uniform(0.3, 1.5) for _ in range(kills)]
    window = sum(gaps) + 1.0
    # The creators' time runs while the kernel is up: each restart moves their deadline on by its
    # own length (a slow start-up on a loaded machine must not read as lost executions).
    deadline = [started + window + 120]
    creators = [threading.Thread(target=create_paced, daemon=True,
                                 args=(kernel.url, "crash", executions, 2 * window / executions, deadline, "r1",
                                       acked, stats, stop, off)) for off in (0, 1)]
    restart_s: list[float] = []
    try:
        for t in creators:
            t.start()
        for gap in gaps:
            time.sleep(gap)
            kernel.kill()
            t0 = time.monotonic()
            kernel.start()
            restart_s.append(time.monotonic() - t0)
            deadline[0] += restart_s[-1]
        for t in creators:
            t.join(timeout=max(1.0, deadline[0] - time.monotonic()))
        stop.set()
        ids = [acked[i] for i in sorted(acked)]
        stuck = wait_terminal(kernel.url, ids, timeout=180)
        a = audit(kernel.url, TOKEN, ids)
        counts = effect_counts(effect_lines(agent.effects))
        twice = [f"{eid}:{n}" for (eid, step), n in counts.items() if step == "s3" and n > 1]
        missing = [eid for eid in ids if a.statuses and any(counts.get((eid, s), 0) == 0
                                                           for s in ("s1", "s2", "s4", "s5"))]
        out.check(f"every acknowledged create ({len(ids)}/{executions}) terminal", not stuck and len(ids) == executions,
                  first(stuck) if stuck else "")
        out.check("every one completed", a.not_completed() == 0 and not a.errors,
                  f"{dict(a.statuses)} {first(a.errors, 1)}")
        out.check("event seqs gapless, no duplicate", not a.seq_gaps and not a.seq_duplicates,
                  first(a.seq_gaps + a.seq_duplicates))
        out.check(f"exactly one terminal event per step ({a.steps} steps)",
                  not a.steps_without_one_terminal and not a.terminal_events_duplicated,
                  first(a.steps_without_one_terminal + a.terminal_events_duplicated))
        out.check("no at_most_once effect ran twice", not twice, first(twice))
        out.check("every safe effect ran", not missing, first(missing))
        out.figures = {
            "kills": kills, "acknowledged": len(ids), "redelivered": a.redelivered,
            "s3 indeterminate": sum(1 for eid in ids if counts.get((eid, "s3"), 0) == 0),
            "effects run": sum(counts.values()), "restart s (max)": f"{max(restart_s, default=0):.1f}",
            **stats,
        }
    finally:
        stop.set()
        agent.stop()
        kernel.stop()
        out.seconds = time.monotonic() - started
    return out
