"""The decisions audit over a day of history in a real Chromium: a kernel whose decisions table was
filled (24 hours of records, seven outcomes) before it started, so its chart draws a bar per hour
from the hourly rollup and the open hour's records, and each bar says what was decided."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import ConsoleKernel, console_kernel, shot

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

OUTCOMES = ["allowed"] * 12 + ["denied"] * 4 + ["awaiting_approval"] * 2 + ["rate_limited", "approval_granted",
                                                                          "approval_denied", "approval_expired"]
RULES = {"allowed": "allow-read-only", "denied": "default", "rate_limited": "throttle-shell"}
Expected = Counter[tuple[str, str]]  # (bar start "YYYY-MM-DD HH:MM", outcome) → count


def _fill(db_url: str, now: datetime) -> Expected:
    from kernel.store import open_store
    from kernel.store import tables as t
    from kernel.store.migrations import migrate

    top = now.replace(minute=0, second=0, microsecond=0)
    rows, expected = [], Expected()
    for h in range(24):
        start = top - timedelta(hours=23 - h)
        span = (now - start) if h == 23 else timedelta(hours=1)
        n = 10 + (h * 7) % 25
        for i in range(n):
            outcome = OUTCOMES[(i * 5 + h) % len(OUTCOMES)]
            rows.append({
                "id": str(uuid.uuid4()), "agent_id": "ops", "execution_id": str(uuid.uuid4()), "step_id": None,
                "kind": "tool_call", "target": f"tool_{i % 4}", "decision": outcome,
                "rule_id": RULES.get(outcome, "approve-other-commands"), "reason": None, "policy_kind": "yaml",
                "policy_revision": "history", "policy_hash": "0" * 64, "decided_by": None, "credential": None,
                "event_seq": None, "decided_at": start + span * (i / n),
            })
            expected[(f"{start:%Y-%m-%d %H:%M}", outcome)] += 1
    store = open_store(db_url)
    try:
        migrate(store)
        with store.transaction() as tx:
            tx.w.execute(t.decisions.insert(), rows)
    finally:
        store.close()
    return expected


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsoleKernel, Expected]]:
    tmp: Path = tmp_path_factory.mktemp("console-history")
    expected = _fill(f"sqlite:///{tmp}/regent.db", datetime.now(UTC))
    with console_kernel(tmp) as (k, _):
        yield k, expected


def _bars(svg: str) -> Expected:
    found = Expected()
    for start, count, outcome in re.findall(r"<title>(\d{4}-\d\d-\d\d \d\d:\d\d) – [^<]* UTC: (\d+) (\w+)</title>", svg):
        found[(start, outcome)] += int(count)
    return found


def test_the_chart_draws_a_bar_per_hour_with_each_outcomes_count(history: tuple[ConsoleKernel, Expected], page: Any) -> None:
    k, expected = history
    fetch = """async (href) => { const r = await fetch(href); return [r.status, await r.text()]; }"""
    page.goto(f"{k.url}/console/audit")
    page.wait_for_function("document.getElementById('chart-image').complete")
    status, svg = page.evaluate(fetch, "/console/audit/chart.svg")
    assert status == 200 and "one bar per hour" in svg
    assert _bars(svg) == expected  # every hour, every outcome, closed hours summed from the rollup
    assert page.evaluate(fetch, "/console/audit/chart.svg")[1] == svg  # again, now that the rollup holds them
    denied = _bars(page.evaluate(fetch, "/console/audit/chart.svg?decision=denied")[1])
    assert denied == Expected({key: n for key, n in expected.items() if key[1] == "denied"})
    by_target = _bars(page.evaluate(fetch, "/console/audit/chart.svg?target=tool_1")[1])  # counted from the records
    assert 0 < sum(by_target.values()) < sum(expected.values())
    page.screenshot(path=str(shot(page, "audit-day")), clip={"x": 0, "y": 0, "width": 1280, "height": 800})
