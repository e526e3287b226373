"""One bad dispatch row never stops delivery: an out-of-range lease a store still holds is clamped
at the claim, and a claim that raises is skipped, counted and moved back in the queue (issue 18 §0)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from kernel.core.dispatch import claim_due
from kernel.core.kernel import MAX_LEASE_SECONDS, Kernel
from kernel.domain import DispatchStatus, ExecutionStatus
from tests.core.test_dispatch import Receiver, agent, deliver, dispatch_events, receiver, run, start  # noqa: F401


def _sql(k: Kernel, statement: str, **params: object) -> None:
    with k.store.engine.begin() as c:
        c.execute(text(statement), params)


def _dispatch_of(k: Kernel, eid: str) -> object:
    [queued] = dispatch_events(k, eid, "dispatch.queued")
    with k.store.read() as tx:
        return tx.get_dispatch(queued["dispatch_id"])


def test_an_out_of_range_lease_in_the_store_is_clamped_at_the_claim(
        kernel: Kernel, receiver: tuple[Receiver, str]) -> None:  # noqa: F811
    r, url = receiver
    agent(kernel, url, agent_id="greedy")
    # Written before the API bounded it (PostgreSQL's INTEGER holds at most 2^31 - 1).
    _sql(kernel, "UPDATE agents SET lease_timeout_seconds = 2147483647 WHERE id = 'greedy'")
    start(kernel, "greedy")
    assert run(kernel, deliver) == 1
    assert r.bodies()[0]["lease_timeout_seconds"] == MAX_LEASE_SECONDS


def test_a_claim_that_raises_is_skipped_and_the_next_row_is_delivered(
        kernel: Kernel, receiver: tuple[Receiver, str]) -> None:  # noqa: F811
    r, url = receiver
    agent(kernel, url, agent_id="bad")
    agent(kernel, url, agent_id="good")
    bad = start(kernel, "bad")  # first in the queue
    good = start(kernel, "good")
    # A value the codec cannot read: every claim of this row raises.
    _sql(kernel, "UPDATE executions SET status = 'bogus' WHERE id = :id", id=bad)

    async def twice(d: object) -> list[int]:
        return [await deliver(d), await deliver(d)]  # type: ignore[arg-type]

    # One worker: the first pass meets only the bad row; the second is not stuck behind it.
    assert run(kernel, twice, concurrency=1) == [0, 1]
    assert [b["execution_id"] for b in r.bodies()] == [good]
    assert kernel.dispatch_claims_skipped == 1
    d = _dispatch_of(kernel, bad)
    assert d.status == DispatchStatus.FAILED and d.attempt == 1  # type: ignore[attr-defined]
    assert d.next_attempt_at >= kernel.clock.now() + timedelta(seconds=kernel.dispatch_max_delay)  # type: ignore[attr-defined]
    [failed] = dispatch_events(kernel, bad, "dispatch.failed")
    assert failed["error"] == "claim failed: ValueError"


def test_a_row_whose_claim_keeps_raising_exhausts_its_execution(kernel: Kernel) -> None:
    agent(kernel, "http://127.0.0.1:9/webhook", agent_id="bad")
    bad = start(kernel, "bad")
    _sql(kernel, "UPDATE executions SET status = 'bogus' WHERE id = :id", id=bad)
    for _ in range(kernel.dispatch_max_attempts):
        assert claim_due(kernel, 10) == []
        kernel.clock.advance(kernel.dispatch_max_delay + 1)  # type: ignore[attr-defined]
    assert kernel.dispatch_claims_skipped == kernel.dispatch_max_attempts
    with kernel.store.read() as tx:
        e = tx.get_execution(bad)
    assert e is not None and e.status == ExecutionStatus.FAILED and e.failure_reason == "dispatch_exhausted"
    assert claim_due(kernel, 10) == []  # nothing left due
    assert _dispatch_of(kernel, bad).status == DispatchStatus.EXHAUSTED  # type: ignore[attr-defined]
