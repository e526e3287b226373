"""The official SDK against the replay guard (docs/api.md, Replayed requests), on SQLite and
PostgreSQL: its legitimate byte-identical repeats (two identical local steps back to back, two
identical tool calls at once, a tool call retried after its body raised) all run, and a request it
sent, captured and sent again, is refused 401 without an effect."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import DevKernel, dev_kernel_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def kernel(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DevKernel]:
    if request.param == "sqlite":
        with dev_kernel_for(("twins",), tmp_path) as k:
            yield k
    else:
        with scratch_pg_database("regent_replay") as url, dev_kernel_for(("twins",), tmp_path, db_url=url) as k:
            yield k


def test_sdk_repeats_run_and_a_captured_request_replayed_is_refused(kernel: DevKernel) -> None:
    agent = kernel.agent("twins", MODE="twins", CAPTURE="1")
    eid = kernel.api.create("twins")
    e = kernel.api.wait_status(eid, "completed", "failed", "cancelled", timeout=60)
    assert e["status"] == "completed", (e, agent.output())
    out = e["output"]
    assert len(set(out["tokens"])) == 2 and out["twins"] == ["did twin", "did twin"]
    assert out["retried"] == "did retry"
    steps = kernel.api.steps(eid)
    by = collections.Counter((s["kind"], s["target"], s["occurrence"], s["status"]) for s in steps)
    assert by == {("local", "token", 0, "succeeded"): 1, ("local", "token", 1, "succeeded"): 1,
                  ("tool_call", "effect", 0, "succeeded"): 1, ("tool_call", "effect", 1, "succeeded"): 1,
                  ("tool_call", "flaky", 0, "failed"): 1, ("tool_call", "flaky", 1, "succeeded"): 1}

    sent: list[dict[str, Any]] = [r for r in agent.log_lines("sent") if r["path"].endswith("/steps")]
    # Each pair went out as the same bytes when it fell within one second (it nearly always does):
    # the guard must have let byte-identical submits through.
    signatures = collections.Counter(r["headers"]["rebuno-signature"] for r in sent)
    assert max(signatures.values()) >= 2, sent

    completes = [r for r in agent.log_lines("sent") if r["path"].endswith("/complete") and "/steps/" in r["path"]]
    assert completes
    events = kernel.api.events(eid)
    with httpx.Client(base_url=kernel.url, timeout=10) as http:
        for r in (completes[0], next(r for r in agent.log_lines("sent") if r["path"] == f"/v0/executions/{eid}/complete")):
            again = http.request(r["method"], r["path"], content=r["body"].encode(), headers=r["headers"])
            assert again.status_code == 401, again.text
            assert again.json()["code"] == "unauthorized" and "already seen" in again.json()["message"]
    assert kernel.api.events(eid) == events
