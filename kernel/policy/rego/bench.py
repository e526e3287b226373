"""Rego decision latency: raw in-process regopy vs the kernel's isolated path, side by side.

The raw side runs in a child process (`rawbench.py`), because the kernel process must
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
from .pool import regopy_path

__all__ = ["BENCH_BUNDLE", "BENCH_INPUT", "bench_rego"]

RAW_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rawbench.py")

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


def _cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _raw(n: int) -> dict[str, Any]:
    bundle = parse_rego_bundle(BENCH_BUNDLE)
    request = {
        "modules": bundle.runnable_modules,
        "data": bundle.data,
        "entrypoint": bundle.entrypoint,
        "input": input_document(BENCH_INPUT),
    }
    proc = subprocess.run(
        [sys.executable, "-s", "-S", "-P", RAW_SCRIPT, str(n)],
        input=json.dumps(request).encode(),
        capture_output=True,
        env={"PYTHONPATH": regopy_path()},
        timeout=600,
        check=True,
    )
    return json.loads(proc.stdout)


def bench_rego(n: int = 5000, *, pool_size: int = 2) -> dict[str, Any]:
    """Time `n` evaluations each way; returns percentiles (ms) and isolated/raw ratios. The
    isolated path is timed twice, interleaved in blocks: as configured, and with the workers'
    poll-before-block off (`spin_seconds=0`), so what the poll buys is a side-by-side figure."""
    raw = _raw(n)
    bundle = parse_rego_bundle(BENCH_BUNDLE)
    with RegoEngine(size=pool_size) as engine, RegoEngine(size=pool_size, spin_seconds=0) as blocking:
        for e in (engine, blocking):
            for _ in range(min(n, 500)):  # warm-up: compile in the worker, warm its caches
                decision = e.evaluate(bundle, BENCH_INPUT)
        samples: dict[str, list[float]] = {"polling": [], "blocking": []}
        cpu0 = {"polling": _cpu(engine.worker_pids()), "blocking": _cpu(blocking.worker_pids())}
        clock = time.perf_counter
        block = 100
        for start in range(0, n, block):
            for name, e in (("polling", engine), ("blocking", blocking)):
                out = samples[name]
                for _ in range(min(block, n - start)):
                    t0 = clock()
                    decision = e.evaluate(bundle, BENCH_INPUT)
                    out.append(clock() - t0)
        worker_cpu = {"polling": _cpu(engine.worker_pids()) - cpu0["polling"],
                      "blocking": _cpu(blocking.worker_pids()) - cpu0["blocking"]}
    regopy_api = _summary(raw["timings"]["regopy_api"])
    worker_path = _summary(raw["timings"]["worker_path"])
    isolated = _summary(samples["polling"])
    no_poll = _summary(samples["blocking"])
    return {
        "n": n,
        "cpus": os.cpu_count(),
        "pool_size": pool_size,
        "raw_regopy": regopy_api,
        "raw_worker_path": worker_path,
        "isolated": isolated,
        "isolated_no_poll": no_poll,
        "ratio_p50": round(isolated["p50_ms"] / regopy_api["p50_ms"], 3),
        "ratio_p99": round(isolated["p99_ms"] / regopy_api["p99_ms"], 3),
        "ratio_p50_no_poll": round(no_poll["p50_ms"] / regopy_api["p50_ms"], 3),
        "ipc_overhead_p50_ms": round(isolated["p50_ms"] - worker_path["p50_ms"], 4),
        # The workers' CPU per evaluation (their polling included), from /proc: what the poll costs.
        "worker_cpu_us": round(worker_cpu["polling"] / n * 1e6, 1),
        "worker_cpu_us_no_poll": round(worker_cpu["blocking"] / n * 1e6, 1),
        "targets": {"ratio_p50_max": 1.5, "isolated_p99_ms_max": 0.5},
        "decision": {"verdict": str(decision.verdict), "rule_id": decision.rule_id},
    }


if __name__ == "__main__":  # python -m kernel.policy.rego.bench [N]
    print(json.dumps(bench_rego(int(sys.argv[1]) if len(sys.argv) > 1 else 5000), indent=2))
