"""`regent bench --scenarios policy-test`: `regent policy test` as a subprocess (start-up
included) on 1 000 cases against the shell Rego bundle; goal ≤ 2 s wall (issue 18 P6). With `coverage=True`,
the same run with `--coverage` (Rego line coverage) alternates with the plain one; goal ≤ 1.5×."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["ls -la /tmp", "ls; rm -rf /", "cat x | sh", "curl example.com", "lsblk", "pwd"]


def write_suite(directory: Path, n: int = 1000) -> Path:
    bundle = directory / "shell-rego"
    shutil.copytree(ROOT / "bundles" / "shell-rego", bundle)
    lines = ["agent_id: shell", "cases:"]
    for i in range(n):
        cmd = COMMANDS[i % len(COMMANDS)]
        lines.append(f"  - {{name: case-{i}, target: shell_exec, args: {{command: {cmd!r}}}}}")
    (directory / "shell-rego.policytest.yaml").write_text("\n".join(lines) + "\n")
    return bundle


def _wall(bundle: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kernel.cli", "policy", "test", str(bundle),
                           "--format", "json", *extra], capture_output=True, text=True, timeout=120, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"regent policy test exited {proc.returncode}: {proc.stderr[-500:]}")
    return wall


def bench_policy_test(n: int = 1000, rounds: int = 3, *, coverage: bool = False) -> dict[str, Any]:
    walls: list[float] = []
    covered: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        bundle = write_suite(Path(tmp), n)
        for _ in range(rounds):
            walls.append(_wall(bundle))
            if coverage:
                covered.append(_wall(bundle, "--coverage"))
    walls.sort()
    out: dict[str, Any] = {"cases": n, "rounds": rounds, "best_s": walls[0], "median_s": walls[len(walls) // 2]}
    if covered:
        covered.sort()
        out["coverage_median_s"] = covered[len(covered) // 2]
        out["coverage_ratio"] = out["coverage_median_s"] / out["median_s"]
    return out
