"""The peer: DBOS durable workflows in a process of their own (`python -m bench.peer_dbos URL`).

The `peer` scenario (bench/peer.py) starts this once per store and sends it one command a line on
stdin, `run WORKERS SECONDS MAX_STEPS`, interleaved with the kernel's rounds. Each worker thread
runs workflows of `STEPS_PER_WORKFLOW` steps back to back (the step returns a small dict, as the
kernel's bench step does), after one untimed warm-up workflow, until SECONDS have passed or it has
done MAX_STEPS; the answer is one JSON line: each step's latency as the workflow saw it, the
window's wall time and this process's CPU over it. DBOS runs with its defaults (on SQLite:
journal_mode=delete, synchronous=FULL; on PostgreSQL: the server's), as a user would get it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Any

STEPS_PER_WORKFLOW = 50  # a workflow's start and end rows are 2 commits; over 50 steps, ~4 % of them

_lat = threading.local()


def main(url: str) -> None:
    from dbos import DBOS

    DBOS(config={"name": "regent-bench-peer", "system_database_url": url, "log_level": "WARNING",
                 "sys_db_pool_size": 20})

    @DBOS.step()
    def step(i: int) -> dict[str, Any]:
        return {"ok": True, "echo": f"{i:010d}"}

    @DBOS.workflow()
    def workflow(n: int) -> int:
        out: list[float] = _lat.out
        now = time.perf_counter()
        for i in range(n):
            step(i)
            t = time.perf_counter()
            out.append(t - now)
            now = t
        return n

    DBOS.launch()
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            parts = line.split()
            if not parts or parts[0] != "run":
                break
            workers, seconds, max_steps = int(parts[1]), float(parts[2]), int(parts[3])
            print(json.dumps(_run(workflow, workers, seconds, max_steps)), flush=True)
    finally:
        DBOS.destroy()


def _run(workflow: Any, workers: int, seconds: float, max_steps: int) -> dict[str, Any]:
    barrier = threading.Barrier(workers + 1, timeout=120)
    lats: list[list[float]] = [[] for _ in range(workers)]
    ends = [0.0] * workers
    errors: list[str] = []

    def worker(k: int) -> None:
        try:
            _lat.out = []
            workflow(5)  # warm-up: connections open, statements cached
            _lat.out = lats[k]
            barrier.wait()
            stop = time.perf_counter() + seconds
            while len(lats[k]) < max_steps and time.perf_counter() < stop:
                workflow(min(STEPS_PER_WORKFLOW, max_steps - len(lats[k])))
            ends[k] = time.perf_counter()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # reported in the answer; the parent turns it into an error row
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(workers)]
    for th in threads:
        th.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for th in threads:
        th.join(timeout=seconds + 120)
    cpu = time.process_time() - cpu0
    wall = max(ends) - t0 if any(ends) else 0.0
    return {"latencies": [x for lat in lats for x in lat], "wall": wall, "cpu": cpu, "errors": errors}


if __name__ == "__main__":
    main(sys.argv[1])
