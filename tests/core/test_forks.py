"""Forks in the core, on SQLite and PostgreSQL: the lineage (nothing copied at creation, the
source's steps up to the fork point replayed and recorded into the fork as its rerun reaches
them), the fork-only bundle and the `__fork_effect` gate on live `at_most_once` steps."""

from __future__ import annotations

import pytest

from kernel.core import executions, forks, steps
from kernel.core.dispatch import claim_due
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.errors import ValidationError
from kernel.identity import args_hash
from tests.conftest import Running


def _req(target: str, idempotency: str = "safe_to_retry") -> steps.StepRequest:
    return steps.StepRequest(kind="tool_call", target=target, args={}, args_text="{}", args_hash=args_hash("{}"),
                             idempotency=idempotency)


def _run(k: Kernel, eid: str, targets: list[str], idempotency: str = "safe_to_retry") -> list[str]:
    c = next(c for c in claim_due(k, 100) if c.execution_id == eid)
    out = []
    for target in targets:
        ans = steps.submit_step(k, Lease("shell", eid, c.dispatch_id, c.attempt), _req(target, idempotency))
        out.append(ans.decision)
        if ans.decision == "proceed":
            steps.record_outcome(k, Lease("shell", eid, c.dispatch_id, c.attempt), str(ans.step_id), result=f"r-{target}")
    return out


def test_a_fork_replays_the_outcomes_up_to_at_seq_and_records_them_as_it_reaches_them(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", {"q": 1})[0].id
    assert _run(k, src, [f"t{i}" for i in range(5)]) == ["proceed"] * 5
    points = forks.fork_points(k, src)
    assert len(points) == 6
    fork = forks.fork_execution(k, src, points[3]["event_seq"])
    assert (fork.forked_from, fork.input) == (src, {"q": 1})
    assert steps.list_steps(k, fork.id, None, terminal_only=False) == []  # nothing copied at creation
    with k.store.read() as tx:
        head = [e.type for e in tx.list_events(fork.id, 0, 1000)]
    assert head == ["execution.created", "execution.forked", "execution.started", "dispatch.queued"]
    assert _run(k, fork.id, [f"t{i}" for i in range(5)]) == ["replay"] * 3 + ["proceed"] * 2
    recorded = {s.target: s for s in steps.list_steps(k, fork.id, None, terminal_only=True)}
    assert sorted(recorded) == [f"t{i}" for i in range(5)]
    assert [recorded[f"t{i}"].result for i in range(5)] == [f"r-t{i}" for i in range(5)]
    with k.store.read() as tx:
        log = tx.list_events(fork.id, 0, 1000)
    assert [e.event_seq for e in log] == list(range(1, len(log) + 1))  # gapless
    replayed = [e.payload for e in log if e.type == "step.succeeded" and "replayed_from" in e.payload]
    assert [p["target"] for p in replayed] == ["t0", "t1", "t2"]
    source_ids = {s.target: s.step_id for s in steps.list_steps(k, src, None, terminal_only=True)}
    assert [p["replayed_from"] for p in replayed] == [source_ids[f"t{i}"] for i in range(3)]
    # The fork's own log now has the replayed outcomes: a fork of the fork replays them as well.
    again = forks.fork_execution(k, fork.id, log[-1].event_seq)
    assert _run(k, again.id, [f"t{i}" for i in range(5)]) == ["replay"] * 5


def test_an_outcome_recorded_after_the_fork_point_is_not_replayed(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", None)[0].id
    c = next(c for c in claim_due(k, 100) if c.execution_id == src)
    a = steps.submit_step(k, Lease("shell", src, c.dispatch_id, c.attempt), _req("slow"))
    b = steps.submit_step(k, Lease("shell", src, c.dispatch_id, c.attempt), _req("fast"))
    steps.record_outcome(k, Lease("shell", src, c.dispatch_id, c.attempt), str(b.step_id), result="fast")
    with k.store.read() as tx:
        at = tx.last_event_seq(src)  # "fast" has its outcome, "slow" is still executing
    steps.record_outcome(k, Lease("shell", src, c.dispatch_id, c.attempt), str(a.step_id), result="slow")
    fork = forks.fork_execution(k, src, at)
    assert _run(k, fork.id, ["slow", "fast"]) == ["proceed", "replay"]


def test_a_fork_of_many_steps_costs_the_same_to_create_and_replays_them_all(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", None)[0].id
    c = next(c for c in claim_due(k, 100) if c.execution_id == src)
    n = 300
    for i in range(n):
        ans = steps.submit_step(k, Lease("shell", src, c.dispatch_id, c.attempt), _req(f"s{i}"))
        steps.record_outcome(k, Lease("shell", src, c.dispatch_id, c.attempt), str(ans.step_id), result=i)
    with k.store.read() as tx:
        last = tx.last_event_seq(src)
    fork = forks.fork_execution(k, src, last)
    with k.store.read() as tx:
        assert tx.last_event_seq(fork.id) == 4  # created, forked, started, queued: no copy
    assert _run(k, fork.id, [f"s{i}" for i in range(n)]) == ["replay"] * n
    assert len(steps.list_steps(k, fork.id, None, terminal_only=True)) == n


def test_a_live_at_most_once_step_in_a_fork_needs_approval(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", None)[0].id
    assert _run(k, src, ["pay"], "at_most_once") == ["proceed"]
    fork = forks.fork_execution(k, src, 0)  # before the payment: the fork reaches it live
    c = next(c for c in claim_due(k, 100) if c.execution_id == fork.id)
    ans = steps.submit_step(k, Lease("shell", fork.id, c.dispatch_id, c.attempt), _req("pay", "at_most_once"))
    assert ans.decision == "blocked" and ans.approval_id
    with k.store.read() as tx:
        [awaiting] = [e.payload for e in tx.list_events(fork.id, 0, 100) if e.type == "step.awaiting_approval"]
    assert awaiting["rule_id"] == "__fork_effect"


def test_a_fork_can_run_under_a_rego_bundle_of_its_own(running: Running) -> None:
    import hashlib

    from kernel.core.policies import rego_content
    from kernel.policy.resolver import BundleResolver

    k = running.kernel
    resolver = BundleResolver(k.store)
    k.policy = resolver
    try:
        src = executions.create_execution(k, "shell", None)[0].id
        assert _run(k, src, ["t0", "t1"]) == ["proceed", "proceed"]  # no bundle of the agent's: permissive
        module = ('package forkpol\nimport rego.v1\n'
                  'decision := {"decision": "deny", "rule_id": "no-t1", "reason": "not in the fork"} '
                  'if input.target == "t1"\n')
        content = rego_content({"modules": {"fork.rego": module}, "data": {}, "manifest": {
            "revision": "fork-1", "roots": ["forkpol"],
            "metadata": {"regent": {"entrypoint": "forkpol/decision", "default_action": "allow"}}}})
        fork = forks.fork_execution(k, src, 0, bundle=forks.ForkBundle("rego", content))
        assert _run(k, fork.id, ["t0", "t1"]) == ["proceed", "denied"]
        with k.store.read() as tx:
            [denied] = [e.payload for e in tx.list_events(fork.id, 0, 100) if e.type == "step.denied"]
            [forked] = [e.payload for e in tx.list_events(fork.id, 0, 100) if e.type == "execution.forked"]
        assert (denied["rule_id"], denied["policy_kind"], denied["policy_revision"]) == ("no-t1", "rego", "fork-1")
        assert denied["policy_hash"] == hashlib.sha256(content.encode()).hexdigest()
        assert forked["policy_revision"] == "fork-1"
        with pytest.raises(ValidationError):  # the load gate: a module that does not compile
            forks.fork_execution(k, src, 0, bundle=forks.ForkBundle("rego", rego_content(
                {"modules": {"bad.rego": "package x\nthis is not rego"}})))
    finally:
        resolver.close()
