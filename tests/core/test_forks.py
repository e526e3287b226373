"""Forks in the core, on SQLite and PostgreSQL: the bulk copy, the replay of copied steps, the
fork-only bundle and the `__fork_effect` gate on live `at_most_once` steps."""

from __future__ import annotations

from kernel.core import executions, forks, steps
from kernel.core.dispatch import claim_due
from kernel.core.kernel import Kernel
from kernel.identity import args_hash
from tests.conftest import Running


def _req(target: str, idempotency: str = "safe_to_retry") -> steps.StepRequest:
    return steps.StepRequest(kind="tool_call", target=target, args={}, args_text="{}", args_hash=args_hash("{}"),
                             idempotency=idempotency)


def _run(k: Kernel, eid: str, targets: list[str], idempotency: str = "safe_to_retry") -> list[str]:
    c = next(c for c in claim_due(k, 100) if c.execution_id == eid)
    out = []
    for target in targets:
        ans = steps.submit_step(k, "shell", eid, c.dispatch_id, c.attempt, _req(target, idempotency))
        out.append(ans.decision)
        if ans.decision == "proceed":
            steps.record_outcome(k, "shell", eid, str(ans.step_id), c.dispatch_id, c.attempt, result=f"r-{target}")
    return out


def test_a_fork_copies_the_outcomes_up_to_at_seq_and_replays_them(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", {"q": 1})[0].id
    assert _run(k, src, [f"t{i}" for i in range(5)]) == ["proceed"] * 5
    points = forks.fork_points(k, src)
    assert len(points) == 6
    fork = forks.fork_execution(k, src, points[3]["event_seq"])
    assert (fork.forked_from, fork.input) == (src, {"q": 1})
    copied = steps.list_steps(k, fork.id, None, terminal_only=True)
    assert [s.target for s in sorted(copied, key=lambda s: s.target)] == ["t0", "t1", "t2"]
    assert _run(k, fork.id, [f"t{i}" for i in range(5)]) == ["replay"] * 3 + ["proceed"] * 2
    with k.store.read() as tx:
        seqs = [e.event_seq for e in tx.list_events(fork.id, 0, 1000)]
    assert seqs == list(range(1, len(seqs) + 1))  # gapless after the bulk copy


def test_a_fork_of_many_steps_copies_them_all_in_bulk(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", None)[0].id
    c = next(c for c in claim_due(k, 100) if c.execution_id == src)
    n = 300
    for i in range(n):
        ans = steps.submit_step(k, "shell", src, c.dispatch_id, c.attempt, _req(f"s{i}"))
        steps.record_outcome(k, "shell", src, str(ans.step_id), c.dispatch_id, c.attempt, result=i)
    with k.store.read() as tx:
        last = tx.last_event_seq(src)
    fork = forks.fork_execution(k, src, last)
    assert len(steps.list_steps(k, fork.id, None, terminal_only=True)) == n


def test_a_live_at_most_once_step_in_a_fork_needs_approval(running: Running) -> None:
    k = running.kernel
    src = executions.create_execution(k, "shell", None)[0].id
    assert _run(k, src, ["pay"], "at_most_once") == ["proceed"]
    fork = forks.fork_execution(k, src, 0)  # before the payment: the fork reaches it live
    c = next(c for c in claim_due(k, 100) if c.execution_id == fork.id)
    ans = steps.submit_step(k, "shell", fork.id, c.dispatch_id, c.attempt, _req("pay", "at_most_once"))
    assert ans.decision == "blocked" and ans.approval_id
    with k.store.read() as tx:
        [awaiting] = [e.payload for e in tx.list_events(fork.id, 0, 100) if e.type == "step.awaiting_approval"]
    assert awaiting["rule_id"] == "__fork_effect"
