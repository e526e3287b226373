"""Rego decision latency: raw in-process regopy vs the kernel's isolated path, side by side.

The raw side runs in a child process (`worker.py --bench`), because the kernel process must
never import regopy; it times the public regopy API and the worker's own in-process path on the
same compiled bundle and input. The isolated side times `RegoEngine.evaluate` end to end
(input document → socket → worker → Decision). Ratios and percentiles only, never pass/fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from kernel.domain.decision import PolicyInput

from .bundle import parse_rego_bundle
from .document import input_document
from .engine import RegoEngine
from .pool import WORKER_SCRIPT, regopy_path

__all__ = ["BENCH_BUNDLE", "BENCH_INPUT", "bench_rego"]

BENCH_POLICY = """package shell
import rego.v1

default decision := {"decision": "deny", "rule_id": "default-deny", "reason": "not allowed"}

decision := {"decision": "allow", "rule_id": "read-only"} if {
    input.target == "shell_exec"
    some prefix in data.shell.read_only
    startswith(input.args.command, prefix)
}

decision := {
    "decision": "require_approval",
    "rule_id": "destructive",
    "approval_config": {"approvers": ["ops"], "timeout": "15m"},
} if {
    input.target == "shell_exec"
    regex.match(`^(rm|dd|mkfs)\\b`, input.args.command)
}
"""
BENCH_BUNDLE = {
    "modules": {"shell/policy.rego": BENCH_POLICY},
    "data": {"shell": {"read_only": ["ls", "cat", "pwd", "git status"]}},
    "manifest": {"revision": "bench-1", "roots": ["shell"]},
}
BENCH_INPUT = PolicyInput(
    agent_id="shell",
    kind="tool_call",
    target="shell_exec",
    args={"command": "ls -la"},
    execution={
        "id": "01928a7e-0000-7000-8000-000000000001",
        "agent_id": "shell",
        "input": {"task": "list the files"},
        "created_at": "2026-12-02T18:59:00Z",
    },
    usage={"input_tokens": 812, "output_tokens": 96},
    now="2026-12-02T19:00:00Z",
)


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    n = len(ordered)
    return {
        "p50_ms": round(ordered[n // 2] * 1000, 4),
        "p99_ms": round(ordered[min(n - 1, int(n * 0.99))] * 1000, 4),
        "mean_ms": round(sum(ordered) / n * 1000, 4),
    }


def _raw(n: int) -> dict[str, Any]:
    bundle = parse_rego_bundle(BENCH_BUNDLE)
    request = {
        "modules": dict(bundle.modules),
        "data": bundle.data,
        "entrypoint": bundle.entrypoint,
        "input": input_document(BENCH_INPUT),
    }
    proc = subprocess.run(
        [sys.executable, "-s", "-S", "-P", WORKER_SCRIPT, "--bench", str(n)],
        input=json.dumps(request).encode(),
        capture_output=True,
        env={"PYTHONPATH": regopy_path()},
        timeout=600,
        check=True,
    )
    return json.loads(proc.stdout)


def bench_rego(n: int = 5000, *, pool_size: int = 2) -> dict[str, Any]:
    """Time `n` evaluations each way; returns percentiles (ms) and isolated/raw ratios."""
    raw = _raw(n)
    bundle = parse_rego_bundle(BENCH_BUNDLE)
    with RegoEngine(size=pool_size) as engine:
        for _ in range(min(n, 500)):  # warm-up: compile in the worker, warm its caches
            engine.evaluate(bundle, BENCH_INPUT)
        samples = []
        clock = time.perf_counter
        for _ in range(n):
            t0 = clock()
            decision = engine.evaluate(bundle, BENCH_INPUT)
            samples.append(clock() - t0)
    regopy_api = _summary(raw["timings"]["regopy_api"])
    worker_path = _summary(raw["timings"]["worker_path"])
    isolated = _summary(samples)
    return {
        "n": n,
        "cpus": os.cpu_count(),
        "pool_size": pool_size,
        "raw_regopy": regopy_api,
        "raw_worker_path": worker_path,
        "isolated": isolated,
        "ratio_p50": round(isolated["p50_ms"] / regopy_api["p50_ms"], 3),
        "ratio_p99": round(isolated["p99_ms"] / regopy_api["p99_ms"], 3),
        "ipc_overhead_p50_ms": round(isolated["p50_ms"] - worker_path["p50_ms"], 4),
        "targets": {"ratio_p50_max": 1.5, "isolated_p99_ms_max": 0.5},
        "decision": {"verdict": str(decision.verdict), "rule_id": decision.rule_id},
    }


if __name__ == "__main__":  # python -m kernel.policy.rego.bench [N]
    print(json.dumps(bench_rego(int(sys.argv[1]) if len(sys.argv) > 1 else 5000), indent=2))
