"""Leak canary: worker resident memory stays flat over 100 000 evaluations.

regopy leaks ~1 KB per evaluation when greenlet is imported before it (regopy-notes hazard 3);
the worker imports regopy first and nothing else, and this catches a regression of that or any
other per-evaluation leak (input building, outputs not freed).
"""

from __future__ import annotations

import threading

from kernel.domain.decision import Verdict
from kernel.policy.rego import RegoEngine
from kernel.policy.rego.pool import rss_bytes

from .conftest import bundle_of, step

EVALUATIONS = 100_000
WARM_UP = 5_000
MAX_GROWTH_BYTES = 5 * 1024 * 1024

POLICY = bundle_of(
    'decision contains {"decision": "allow", "rule_id": "read-only"} if {\n'
    "    some prefix in data.shell.read_only\n"
    "    startswith(input.args.command, prefix)\n"
    "}\n"
    'decision contains {"decision": "deny", "rule_id": "rm", "reason": sprintf("no: %s", [input.args.command])} if {\n'
    "    regex.match(`^rm\\b`, input.args.command)\n"
    "}\n",
    data={"shell": {"read_only": ["ls", "cat", "pwd"]}},
)


def test_worker_memory_stays_flat_over_100k_evaluations() -> None:
    with RegoEngine(size=2, timeout=2.0) as engine:
        threads = 2

        def run(n: int, offset: int) -> None:
            for i in range(n):
                command = f"ls -la /tmp/{offset + i}" if i % 2 else f"rm -rf /{offset + i}"
                d = engine.evaluate(POLICY, step(command=command))
                assert d.verdict == (Verdict.ALLOW if i % 2 else Verdict.DENY), d

        def run_all(total: int) -> None:
            workers = [
                threading.Thread(target=run, args=(total // threads, t * total))
                for t in range(threads)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()

        run_all(WARM_UP)
        pids = engine.worker_pids()
        before = {pid: rss_bytes(pid) for pid in pids}
        run_all(EVALUATIONS)
        after = {pid: rss_bytes(pid) for pid in pids}
        stats = engine.stats()

    assert stats["evaluations"] == WARM_UP + EVALUATIONS
    assert stats["workers_replaced"] == 0, (
        "a worker was replaced mid-run: the canary proves nothing"
    )
    growth = {pid: after[pid] - before[pid] for pid in pids}
    assert all(before[pid] > 0 and after[pid] > 0 for pid in pids)
    assert max(growth.values()) <= MAX_GROWTH_BYTES, {
        p: f"{g / 1e6:.2f} MB" for p, g in growth.items()
    }
