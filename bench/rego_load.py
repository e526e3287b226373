"""The Rego scenario's background load: N concurrent round trips against the bare app, in a process
of their own, while the isolated Rego path is timed again (issue 18 P3: the figures quiet and under
the 8-worker load). The load shares the CPUs with the measurement, not its GIL.

`python -m bench.rego_load URL N` runs until its stdin closes; it prints `ready` once every client
has done a round trip and, at the end, how many it did.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.client import Agent, Lease, round_trip
from bench.fixtures import AGENT_ID
from bench.servers import ROOT, serve_bare


@contextlib.contextmanager
def concurrent_round_trips(workers: int = 8) -> Iterator[dict[str, int]]:
    """Round trips from ``workers`` clients against a bare app for as long as the block runs;
    the dict gets ``round_trips`` (how many were done) when it ends."""
    stats: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="regent-bench-rego-load-") as tmp, serve_bare(Path(tmp)) as srv:
        srv.wait_ready(120.0)
        proc = subprocess.Popen([sys.executable, "-m", "bench.rego_load", srv.url, str(workers)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the round-trip load did not start")
            yield stats
        finally:
            try:
                out, _ = proc.communicate("", timeout=60)  # closes its stdin: the load stops
                stats["round_trips"] = int(out.strip() or 0)
            except (subprocess.TimeoutExpired, ValueError):
                proc.kill()
                proc.wait()


def _run(url: str, workers: int) -> None:
    stop = threading.Event()
    counts = [0] * workers
    started = threading.Barrier(workers + 1, timeout=120)

    def client(i: int) -> None:
        agent = Agent(url, AGENT_ID, "unused-by-the-bare-app")
        lease = Lease(str(uuid.uuid4()), str(uuid.uuid4()), 1)
        try:
            round_trip(agent, lease, 0)
            started.wait()
            n = 1
            while not stop.is_set():
                round_trip(agent, lease, n)
                n += 1
            counts[i] = n
        finally:
            agent.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    started.wait()
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    stop.set()
    for t in threads:
        t.join(timeout=30)
    print(sum(counts), flush=True)


if __name__ == "__main__":
    _run(sys.argv[1], int(sys.argv[2]))
