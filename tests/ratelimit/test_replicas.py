"""Two kernel replicas (separate processes sharing one PostgreSQL database and one Redis) hold a
global limit exactly.

PostgreSQL rather than a SQLite file per process: that is the supported replica deployment, and a
SQLite store cannot take 50 concurrent transactions on distinct executions (its pool runs out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_sharing_redis_admit_exactly_the_global_limit(
    redis_url: str, redis_namespace: str, pg_database: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.ratelimit.replica", pg_database, redis_url, redis_namespace, f"replica-{i}", "50", "20"],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            assert line == "ready", f"replica did not start: {line!r} {p.stderr.read() if p.stderr else ''}"
        for p in procs:  # release both bursts together
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            results.append(Counter(json.loads(out.strip().splitlines()[-1])))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    total = results[0] + results[1]
    assert total == Counter({"proceed": 20, "rate_limited": 80}), results
