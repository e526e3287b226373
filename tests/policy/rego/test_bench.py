"""bench_rego runs and reports both sides (its numbers are for `regent bench`, not asserted)."""

from __future__ import annotations

from kernel.policy.rego.bench import bench_rego


def test_bench_reports_raw_and_isolated_percentiles() -> None:
    result = bench_rego(200, pool_size=1)
    for side in ("raw_regopy", "raw_worker_path", "isolated"):
        assert result[side]["p50_ms"] > 0
        assert result[side]["p99_ms"] >= result[side]["p50_ms"]
    assert result["ratio_p50"] > 0
    assert result["decision"] == {"verdict": "allow", "rule_id": "read-only"}
