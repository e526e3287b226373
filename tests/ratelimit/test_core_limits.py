"""Rate limits through the core (rebuno-v0 §2.1 step 14.1, §3.7) with the real Redis limiter:
refusal, parking, the one-park rule, limiter faults."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kernel.core import steps
from kernel.core.dispatch import claim_due, reap_expired_leases
from kernel.core.kernel import Kernel
from kernel.domain import Decision, DispatchStatus, ExecutionStatus, Lease, RateLimitSpec, Verdict
from kernel.errors import LeaseSuperseded
from kernel.identity import args_hash, step_id
from kernel.ratelimit import LimitsLimiter
from tests.conftest import Running
from tests.ratelimit.support import FixedPolicy, req
from tests.support import free_port


def limited(max_calls: int = 1, window: float = 60, **kw: Any) -> FixedPolicy:
    spec = RateLimitSpec(max_calls=max_calls, window_seconds=window, **kw)
    return FixedPolicy(Decision(Verdict.ALLOW, "search-cap", rate_limit=spec))


def event_log(k: Kernel, eid: str) -> list[Any]:
    with k.store.read() as tx:
        return tx.list_events(eid, 0, 1000)


@pytest.fixture
def rl_kernel(kernel: Kernel, redis_limiter: LimitsLimiter) -> Kernel:
    kernel.limiter = redis_limiter
    kernel.rng = random.Random(7)
    return kernel


@pytest.mark.redis
def test_empty_bucket_without_max_wait_refuses_and_writes_no_step(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1)
    eid, did, att = running.start()
    first = steps.submit_step(k, Lease("shell", eid, did, att), req(args={"q": "a"}))
    refused = steps.submit_step(k, Lease("shell", eid, did, att), req(args={"q": "b"}))
    assert first.decision == "proceed"
    assert refused.to_json() == {"decision": "rate_limited", "reason": "rate_limit_exceeded"}
    last = event_log(k, eid)[-1]
    assert last.type == "step.rate_limited"
    assert last.payload["error"] == {"reason": "rate_limit_exceeded", "rule_id": "search-cap"}
    assert last.payload["rule_id"] == "search-cap" and last.payload["target"] == "search"
    with k.store.read() as tx:
        assert [s.step_id for s in tx.list_steps(eid)] == [first.step_id]


@pytest.mark.redis
def test_refusal_does_not_advance_the_occurrence(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1)
    eid, did, att = running.start()
    steps.submit_step(k, Lease("shell", eid, did, att), req(target="other"))
    assert steps.submit_step(k, Lease("shell", eid, did, att), req()).decision == "rate_limited"
    k.policy = FixedPolicy(Decision(Verdict.ALLOW, "open"))
    again = steps.submit_step(k, Lease("shell", eid, did, att), req())
    assert (again.decision, again.step_id) == ("proceed", step_id(eid, "tool_call", "search", args_hash("null"), 0))


@pytest.mark.redis
def test_a_deny_rule_with_a_rate_limit_also_consumes_the_bucket(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    spec = RateLimitSpec(max_calls=1, window_seconds=60)
    k.policy = FixedPolicy(Decision(Verdict.DENY, "no-search", "off", rate_limit=spec))
    eid, did, att = running.start()
    assert steps.submit_step(k, Lease("shell", eid, did, att), req()).decision == "denied"
    assert steps.submit_step(k, Lease("shell", eid, did, att), req()).decision == "rate_limited"


@pytest.mark.redis
def test_replays_never_touch_the_bucket(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    policy = limited(max_calls=1)
    k.policy = policy
    eid, did, att = running.start()
    a = steps.submit_step(k, Lease("shell", eid, did, att), req())
    steps.record_outcome(k, Lease("shell", eid, did, att), a.step_id, result={"hits": 3})
    k.clock.advance(k.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
    reap_expired_leases(k)
    [claim] = [c for c in claim_due(k, 10) if c.execution_id == eid]
    again = steps.submit_step(k, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.result) == ("replay", {"hits": 3})
    assert len(policy.inputs) == 1


def _park(k: Kernel, running: Running) -> tuple[str, str, int, steps.StepAnswer]:
    eid, did, att = running.start()
    assert steps.submit_step(k, Lease("shell", eid, did, att), req(target="warm")).decision == "proceed"
    return eid, did, att, steps.submit_step(k, Lease("shell", eid, did, att), req())


@pytest.mark.redis
def test_empty_bucket_with_max_wait_parks_the_execution(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1, window=20, max_wait_seconds=60)
    now = k.clock.now()
    eid, did, att, parked = _park(k, running)
    assert parked.to_json() == {"decision": "blocked", "reason": "rate_limit_exceeded"}
    log = event_log(k, eid)
    assert [e.type for e in log[-2:]] == ["step.rate_limited", "dispatch.queued"]
    new_id = log[-1].payload["dispatch_id"]
    with k.store.read() as tx:
        assert tx.get_execution(eid).status == ExecutionStatus.RUNNING
        assert tx.get_dispatch(did).status == DispatchStatus.EXHAUSTED  # retired
        queued = tx.get_dispatch(new_id)
        assert len(tx.list_steps(eid)) == 1  # only the warm-up step
    assert queued.status == DispatchStatus.PENDING
    # wait ≈ 20 s (the warm-up call leaves the window), plus up to 50 % jitter, capped by max_wait.
    delay = (queued.next_attempt_at - now).total_seconds()
    assert 19 <= delay <= 30
    with pytest.raises(LeaseSuperseded):
        steps.submit_step(k, Lease("shell", eid, did, att), req(target="late"))


@pytest.mark.redis
def test_park_is_capped_by_max_wait(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1, window=20, max_wait_seconds=20.5)
    now = k.clock.now()
    eid, _, _, parked = _park(k, running)
    assert parked.decision == "blocked"
    new_id = event_log(k, eid)[-1].payload["dispatch_id"]
    with k.store.read() as tx:
        due = tx.get_dispatch(new_id).next_attempt_at
    assert 19 <= (due - now).total_seconds() <= 20.5


@pytest.mark.redis
def test_a_second_limit_in_the_same_execution_refuses(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1, window=20, max_wait_seconds=60)
    eid, _, _, parked = _park(k, running)
    assert parked.decision == "blocked"
    k.clock.advance(31)  # type: ignore[attr-defined]  # the parked dispatch is due (Redis' window is still full)
    [claim] = [c for c in claim_due(k, 10) if c.execution_id == eid]
    again = steps.submit_step(k, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert again.to_json() == {"decision": "rate_limited", "reason": "rate_limit_exceeded"}
    with k.store.read() as tx:
        assert tx.count_events(eid, "step.rate_limited") == 2
        assert tx.get_dispatch(claim.dispatch_id).status == DispatchStatus.IN_FLIGHT  # not parked again


@pytest.mark.redis
def test_a_wait_longer_than_max_wait_refuses(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1, window=60, max_wait_seconds=5)
    _, did, _, refused = _park(k, running)
    assert refused.to_json() == {"decision": "rate_limited", "reason": "rate_limit_exceeded"}
    with k.store.read() as tx:
        assert tx.get_dispatch(did).status == DispatchStatus.IN_FLIGHT


@pytest.fixture
def dead_limiter() -> Any:
    with LimitsLimiter(f"redis://127.0.0.1:{free_port()}/0", timeout_seconds=0.5) as lim:
        yield lim


def test_unreachable_limiter_with_deny_refuses_as_unavailable(
    kernel: Kernel, running: Running, dead_limiter: LimitsLimiter
) -> None:
    kernel.limiter = dead_limiter
    kernel.policy = limited(max_calls=5, on_limiter_error="deny")
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    assert a.to_json() == {"decision": "rate_limited", "reason": "rate_limiter_unavailable"}
    last = event_log(kernel, eid)[-1]
    assert last.type == "step.rate_limited"
    assert last.payload["error"] == {"reason": "rate_limiter_unavailable", "rule_id": "search-cap"}


def test_unreachable_limiter_with_allow_fails_open(
    kernel: Kernel, running: Running, dead_limiter: LimitsLimiter
) -> None:
    kernel.limiter = dead_limiter
    kernel.policy = limited(max_calls=1, on_limiter_error="allow")
    eid, did, att = running.start()
    answers = [steps.submit_step(kernel, Lease("shell", eid, did, att), req()).decision for _ in range(3)]
    assert answers == ["proceed"] * 3


@pytest.mark.redis
def test_parked_dispatch_is_due_only_after_the_wait(rl_kernel: Kernel, running: Running) -> None:
    k = rl_kernel
    k.policy = limited(max_calls=1, window=20, max_wait_seconds=60)
    eid, _, _, _ = _park(k, running)
    assert not [c for c in claim_due(k, 10) if c.execution_id == eid]
    k.clock.advance(31)  # type: ignore[attr-defined]
    assert [c for c in claim_due(k, 10) if c.execution_id == eid]


@pytest.mark.redis
def test_a_parked_step_reads_on_the_timeline_as_parked_then_decided(rl_kernel: Kernel, running: Running) -> None:
    from kernel.core import timeline

    k = rl_kernel
    k.policy = limited(max_calls=1, window=20, max_wait_seconds=60)
    eid, _, _, _ = _park(k, running)
    k.clock.advance(31)  # type: ignore[attr-defined]
    [claim] = [c for c in claim_due(k, 10) if c.execution_id == eid]
    # the bucket has room again (Redis keeps real time, not the test's clock: the rule without its cap)
    k.policy = FixedPolicy(Decision(Verdict.ALLOW, "search-cap"))
    assert steps.submit_step(k, Lease("shell", eid, claim.dispatch_id, claim.attempt), req()).decision == "proceed"
    rows = [r for r in timeline.timeline(k, eid).rows if isinstance(r, timeline.StepRow)]
    parked = next(r for r in rows if r.target == "search")
    assert (parked.decision, parked.rule_id, parked.reason) == ("rate_limited", "search-cap", "rate_limit_exceeded")
    assert parked.then == [("allow", "search-cap")]  # decided again once delivered back, and ran
