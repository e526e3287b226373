"""Step submission: the replay table, occurrence counting, lease fencing, outcomes (rebuno-v0 §2)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from kernel.core import approvals, executions, steps
from kernel.core.approvals import Principal
from kernel.core.dispatch import claim_due, reap_expired_leases
from kernel.core.kernel import Kernel
from kernel.domain import ApprovalConfig, Decision, Lease, PolicyInput, StepStatus, Verdict
from kernel.errors import Conflict, ExecutionTerminal, Forbidden, LeaseSuperseded, NotFound
from kernel.identity import args_hash, canonical_json, step_id
from tests.conftest import Running


def req(target: str = "send_email", args: Any = None, kind: str = "tool_call",
        idempotency: str = "safe_to_retry") -> steps.StepRequest:
    text = canonical_json(json.dumps(args)) if args is not None else "null"
    return steps.StepRequest(kind=kind, target=target, args=json.loads(text), args_text=text,
                             args_hash=args_hash(text), idempotency=idempotency)


def events(k: Kernel, eid: str) -> list[str]:
    with k.store.read() as tx:
        return [e.type for e in tx.list_events(eid, 0, 1000)]


class FixedPolicy:
    def __init__(self, decision: Decision):
        self.decision = decision
        self.calls = 0

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: PolicyInput, tx: Any = None, bundle_id: Any = None) -> Decision:
        self.calls += 1
        return self.decision


def test_submit_new_step_proceeds_with_content_derived_id(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req(args={"to": "ops@example.com"}))
    assert a.decision == "proceed"
    assert a.step_id == step_id(eid, "tool_call", "send_email", args_hash('{"to":"ops@example.com"}'), 0)
    assert events(kernel, eid)[-3:] == ["step.proposed", "step.allowed", "step.executing"]


def test_submit_step_replays_recorded_result(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result={"ok": 1})
    # a new attempt replays from occurrence 0 and gets the recorded result
    [claim] = _reclaim(kernel, eid)
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.step_id, again.result) == ("replay", a.step_id, {"ok": 1})


def test_replay_of_failed_step_returns_its_error(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, error={"m": "boom"}, failed=True)
    [claim] = _reclaim(kernel, eid)
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.error) == ("replay", {"m": "boom"})


def _reclaim(k: Kernel, eid: str) -> list[Any]:
    """Expire the lease and claim the dispatch again (attempt + 1)."""
    k.clock.advance(k.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
    reap_expired_leases(k)
    return [c for c in claim_due(k, 10) if c.execution_id == eid]


def test_orphaned_executing_step_proceeds_again_when_safe_to_retry(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    [claim] = _reclaim(kernel, eid)
    n = len(events(kernel, eid))
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.step_id) == ("proceed", a.step_id)
    assert len(events(kernel, eid)) == n  # no new event, no row change


def test_orphaned_at_most_once_step_fails_indeterminate_and_is_never_retried(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    r = req(idempotency="at_most_once")
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), r)
    [claim] = _reclaim(kernel, eid)
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), r)
    assert again.decision == "replay" and again.error["reason"] == "indeterminate"
    assert events(kernel, eid)[-1] == "step.failed"
    # The next identical call in the same attempt is a new occurrence: the guard refuses it.
    third = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), r)
    assert third.decision == "denied" and third.rule_id == "__indeterminate_retry"
    assert third.step_id != a.step_id


def test_denied_step_replays_as_denied_without_consulting_policy(kernel: Kernel, running: Running) -> None:
    policy = FixedPolicy(Decision(Verdict.DENY, "no-email", "email is off"))
    kernel.policy = policy
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    assert (a.decision, a.reason, a.rule_id) == ("denied", "email is off", "no-email")
    [claim] = _reclaim(kernel, eid)
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.reason, again.step_id) == ("denied", "email is off", a.step_id)
    assert policy.calls == 1


def test_deny_without_reason_reports_policy_denied(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "r1"))
    eid, did, att = running.start()
    assert steps.submit_step(kernel, Lease("shell", eid, did, att), req()).reason == "policy_denied"


def test_identical_calls_in_one_attempt_get_distinct_occurrences(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    ids = [steps.submit_step(kernel, Lease("shell", eid, did, att), req()).step_id for _ in range(3)]
    h = args_hash("null")
    assert ids == [step_id(eid, "tool_call", "send_email", h, n) for n in range(3)]


def test_twenty_concurrent_identical_submits_get_twenty_occurrences(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    out: list[str] = []
    lock = threading.Lock()

    def go() -> None:
        a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
        with lock:
            out.append(a.step_id or "")

    threads = [threading.Thread(target=go) for _ in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    h = args_hash("null")
    assert sorted(out) == sorted(step_id(eid, "tool_call", "send_email", h, n) for n in range(20))
    with kernel.store.read() as tx:
        assert len(tx.list_steps(eid)) == 20


def test_submit_with_stale_attempt_is_lease_superseded(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    [claim] = _reclaim(kernel, eid)
    assert claim.attempt == att + 1
    with pytest.raises(LeaseSuperseded):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req())


def test_submit_with_foreign_dispatch_is_lease_superseded(kernel: Kernel, running: Running) -> None:
    eid, _did, att = running.start()
    _other, other_did, _ = running.start()
    with pytest.raises(LeaseSuperseded):
        steps.submit_step(kernel, Lease("shell", eid, other_did, att), req())


def test_submit_by_another_agent_is_forbidden(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    Running(kernel, "intruder", "x")
    with pytest.raises(Forbidden):
        steps.submit_step(kernel, Lease("intruder", eid, did, att), req())


def test_submit_to_terminal_execution_answers_execution_terminal(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    executions.cancel_execution(kernel, eid)
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    assert a.decision == "execution_terminal" and a.step_id is None


def test_refused_submission_does_not_advance_the_occurrence(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    executions.cancel_execution(kernel, eid)
    steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    with kernel.store.read() as tx:
        assert tx.get_counter(did, "tool_call", "send_email", args_hash("null")) == 0


def test_completing_a_terminal_step_replays_the_stored_value(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=1)
    again = steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=2)
    assert (again.decision, again.result) == ("replay", 1)
    assert steps.get_step(kernel, eid, a.step_id, None).result == 1


def test_outcome_for_unknown_step_is_not_found(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    with pytest.raises(NotFound):
        steps.record_outcome(kernel, Lease("shell", eid, did, att), "0" * 64, result=1)


def test_outcome_from_superseded_attempt_is_refused(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    _reclaim(kernel, eid)
    with pytest.raises(LeaseSuperseded):
        steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=1)


def test_cancel_during_a_step_cancels_it_and_refuses_its_outcome(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    executions.cancel_execution(kernel, eid)
    assert steps.get_step(kernel, eid, a.step_id, None).status == StepStatus.CANCELLED
    assert steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=1).decision == "execution_terminal"
    assert events(kernel, eid)[-2:] == ["execution.cancelled", "step.cancelled"]
    with pytest.raises(ExecutionTerminal):
        executions.cancel_execution(kernel, eid)


def test_approval_blocks_execution_and_grant_resumes_it(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask", approval=ApprovalConfig(("alice",))))
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    assert a.decision == "blocked" and a.approval_id
    assert executions.get_execution(kernel, eid).status == "blocked"
    with pytest.raises(LeaseSuperseded):  # the block released the lease
        steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    with pytest.raises(Forbidden):
        approvals.decide_approval(kernel, a.approval_id, grant=True, principal=Principal(admin=True),
                                  decided_by="mallory", rationale=None)
    approvals.decide_approval(kernel, a.approval_id, grant=True, principal=Principal(admin=True),
                              decided_by="alice", rationale="ok")
    with pytest.raises(Conflict):
        approvals.decide_approval(kernel, a.approval_id, grant=False, principal=Principal(admin=True),
                                  decided_by="alice", rationale=None)
    [claim] = [c for c in claim_due(kernel, 10) if c.execution_id == eid]
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.step_id) == ("proceed", a.step_id)


def test_denied_approval_denies_the_reproposed_step_with_the_rationale(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask"))
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    approvals.decide_approval(kernel, a.approval_id, grant=False, principal=Principal(name="ops-key"),
                              decided_by="bob", rationale="not today")
    got = approvals.get_approval(kernel, a.approval_id)
    assert (got.decided_by, got.asserted_by) == ("ops-key", "bob")
    [claim] = [c for c in claim_due(kernel, 10) if c.execution_id == eid]
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.reason, again.rule_id) == ("denied", "not today", "ask")


def test_expired_approval_denies_with_approval_timeout(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask", approval=ApprovalConfig(timeout_seconds=60)))
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    kernel.clock.advance(61)  # type: ignore[attr-defined]
    assert approvals.expire_approvals(kernel) == 1
    [claim] = [c for c in claim_due(kernel, 10) if c.execution_id == eid]
    again = steps.submit_step(kernel, Lease("shell", eid, claim.dispatch_id, claim.attempt), req())
    assert (again.decision, again.reason, again.step_id) == ("denied", "approval_timeout", a.step_id)
    assert again.to_json()["rule_id"] == "ask"  # every denied answer names a rule: the one that asked


def test_expired_approvals_resume_their_executions_many_to_a_transaction(
        kernel: Kernel, running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """The expiry sweep resumed one parked execution per transaction, a durable commit each (about
    80 a second with 10^5 released at once, bench/parked.py): now `EXPIRE_PER_TX` share one. Fails
    before that change: 45 approvals took 45 commits."""
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask", approval=ApprovalConfig(timeout_seconds=60)))
    parked = {}
    for _ in range(45):
        eid, did, att = running.start()
        parked[eid] = steps.submit_step(kernel, Lease("shell", eid, did, att), req()).step_id
    kernel.clock.advance(61)  # type: ignore[attr-defined]
    transactions = []
    begin = kernel.store.transaction

    def counted(*args: Any, **kwargs: Any) -> Any:
        transactions.append(kwargs.get("lock"))
        return begin(*args, **kwargs)

    monkeypatch.setattr(kernel.store, "transaction", counted)
    assert approvals.expire_approvals(kernel, limit=100) == 45
    assert len(transactions) == -(-45 // approvals.EXPIRE_PER_TX) < 45, transactions
    monkeypatch.undo()
    # Every one resumed: running, with a new dispatch its agent is delivered, its step denied.
    claims = {c.execution_id: c for c in claim_due(kernel, 100)}
    assert set(parked) <= set(claims)
    for eid, sid in parked.items():
        assert executions.get_execution(kernel, eid).status.value == "running"
        again = steps.submit_step(kernel, Lease("shell", eid, claims[eid].dispatch_id, claims[eid].attempt), req())
        assert (again.decision, again.reason, again.step_id) == ("denied", "approval_timeout", sid)


def test_event_seqs_are_gapless_and_start_at_one(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    for _ in range(3):
        a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
        steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=None)
    executions.finish_execution(kernel, Lease("shell", eid, did, att), output={"done": True})
    with kernel.store.read() as tx:
        seqs = [e.event_seq for e in tx.list_events(eid, 0, 1000)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert executions.get_execution(kernel, eid).output == {"done": True}
