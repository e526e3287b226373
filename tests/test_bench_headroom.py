"""bench/run.py `headroom`: what two issue-18 goals leave the kernel, read from one run's rows."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.run import FULL, headroom

SEQ, CONC = "round trip, sequential", "round trip, concurrent"


def row(scenario: str, target: str, throughput: float, server: float, client: float, other: float = 0.0) -> dict[str, Any]:
    return {"scenario": scenario, "target": target, "throughput": throughput, "server_cpu_per_op": server,
            "client_cpu_per_op": client, "other_cpu_per_op": other}


def figures(rows: list[dict[str, Any]], fsync: float | None = 0.0002) -> dict[str, str]:
    return {label: shown for label, shown, _ in headroom(FULL, rows, fsync)}


def test_the_sequential_budget_is_the_goals_round_trip_less_the_bare_one_two_commits_and_the_client() -> None:
    # bare 1 000 op/s (1 ms), kernel 400 op/s (2.5 ms); the kernel's client spends 0.1 ms more.
    got = figures([row(SEQ, "bare", 1000, 0.3e-3, 0.7e-3), row(SEQ, "sqlite", 400, 1.2e-3, 0.8e-3)])
    nil = next(v for k, v in got.items() if k.startswith("SQLite / bare sequential, were"))
    budget = next(v for k, v in got.items() if k.startswith("sequential: the kernel's own time"))
    # floor = 1 + 2 × 0.2 + 0.1 = 1.5 ms: nil-kernel ratio 1 / 1.5; 60 % leaves 1 / 0.6 − 1.5 = 0.17 ms.
    assert nil == "66.7 %"
    assert budget == "0.17 · 1.00 ms"


def test_the_postgres_ceiling_is_the_ratio_of_all_processes_cpu() -> None:
    got = figures([row(CONC, "sqlite", 800, 0.9e-3, 0.8e-3, 0.2e-3), row(CONC, "postgres", 480, 1.3e-3, 1.0e-3, 0.9e-3)])
    ceiling = next(v for k, v in got.items() if "were both CPU-bound" in k)
    left = next(v for k, v in got.items() if "what 85 % leaves" in k)
    assert ceiling == "59.4 %"  # 1.9 / 3.2 ms
    # 1.9 / 0.85 − 1.0 − 0.9 = 0.34 ms left for the kernel, against 1.3 now.
    assert left == "0.34 · 1.30 ms"


@pytest.mark.parametrize("rows", [
    [],
    [row(SEQ, "bare", 1000, 0.3e-3, 0.7e-3)],  # the kernel's row missing
    [row(SEQ, "bare", 1000, 0.3e-3, 0.7e-3), row(SEQ, "sqlite", math.nan, 1e-3, 1e-3)],
    [row(CONC, "sqlite", 800, 1e-3, 1e-3), {"scenario": CONC, "target": "postgres", "error": "down"}],
])
def test_nothing_is_claimed_from_missing_or_failed_rows(rows: list[dict[str, Any]]) -> None:
    assert figures(rows) == {}


def test_no_sequential_budget_without_the_disk_reference() -> None:
    assert figures([row(SEQ, "bare", 1000, 0.3e-3, 0.7e-3), row(SEQ, "sqlite", 400, 1e-3, 1e-3)], fsync=None) == {}
