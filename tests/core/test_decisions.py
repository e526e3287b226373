"""The durable decision record: one row per decision event, written with it, read with filters and
keyset paging, kept after the execution's retention and pruned by its own (docs/audit.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from kernel.core import approvals, audit, steps, sweeps
from kernel.core.approvals import Principal
from kernel.core.audit import DecisionQuery
from kernel.core.executions import cancel_execution
from kernel.core.kernel import Kernel
from kernel.domain import ApprovalConfig, Credential, Decision, DecisionOutcome, Lease, Verdict
from kernel.domain.decision import PolicyKind
from kernel.errors import ValidationError
from kernel.store import tables as t
from tests.conftest import Running
from tests.core.test_steps import FixedPolicy, req


def _all(k: Kernel, **filters: object) -> list[audit.DecisionRecord]:
    return audit.list_decisions(k, DecisionQuery(limit=500, **filters)).decisions  # type: ignore[arg-type]


def test_an_allowed_step_writes_one_decision_row_naming_its_event(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.ALLOW, "ok-rule", "fine", policy_kind=PolicyKind.YAML,
                                         policy_revision="r1", policy_hash="ab" * 32))
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="send_email"))
    [r] = _all(kernel)
    assert (r.agent_id, r.execution_id, r.step_id, r.kind, r.target) == ("shell", eid, a.step_id, "tool_call",
                                                                        "send_email")
    assert (r.decision, r.rule_id, r.reason, r.policy_revision, r.policy_hash) == (
        DecisionOutcome.ALLOWED, "ok-rule", "fine", "r1", "ab" * 32)
    with kernel.store.read() as tx:
        [event] = [e for e in tx.list_events(eid, 0, 100) if e.event_seq == r.event_seq]
    assert event.type == "step.allowed"
    assert event.payload["policy_hash"] == "ab" * 32


def test_a_replay_writes_no_decision(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=1)
    steps.submit_step(kernel, Lease("shell", eid, did, att), req())  # the next occurrence: a new decision
    assert len(_all(kernel)) == 2
    assert all(r.decision == DecisionOutcome.ALLOWED for r in _all(kernel))


def test_denial_and_approval_answers_are_recorded_with_the_decider(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask", "big payment",
                                         approval=ApprovalConfig(approvers=("alice",)), policy_hash="cd" * 32))
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="pay"))
    approvals.decide_approval(kernel, a.approval_id, grant=True, principal=Principal(name="alice"),
                              decided_by="", rationale="checked")
    got = [(r.decision, r.rule_id, r.decided_by, r.credential, r.policy_hash) for r in reversed(_all(kernel))]
    assert got == [
        (DecisionOutcome.AWAITING_APPROVAL, "ask", None, None, "cd" * 32),
        (DecisionOutcome.APPROVAL_GRANTED, "ask", "alice", Credential.KEY.value, "cd" * 32),
    ]


def test_filters_combine_and_each_matches_its_column(kernel: Kernel, running: Running) -> None:
    deny = FixedPolicy(Decision(Verdict.DENY, "no-shell", "never", policy_hash="ee" * 32))
    allow = FixedPolicy(Decision(Verdict.ALLOW, "yes", policy_hash="ff" * 32))
    eid, did, att = running.start()
    kernel.policy = deny
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="rm"))
    kernel.policy = allow
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="ls"))
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="cat"))
    assert [r.target for r in _all(kernel, decision="denied")] == ["rm"]
    assert [r.target for r in _all(kernel, rule_id="yes")] == ["cat", "ls"]
    assert [r.target for r in _all(kernel, target="ls", policy_hash="ff" * 32)] == ["ls"]
    assert _all(kernel, target="ls", decision="denied") == []
    assert len(_all(kernel, agent_id="shell", execution_id=eid)) == 3
    assert _all(kernel, agent_id="other") == []


def test_time_range_is_since_inclusive_until_exclusive(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    t0 = kernel.clock.now()
    for i in range(3):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=f"t{i}"))
        kernel.clock.advance(10)  # type: ignore[attr-defined]
    assert [r.target for r in _all(kernel, since=t0 + timedelta(seconds=10))] == ["t2", "t1"]
    assert [r.target for r in _all(kernel, until=t0 + timedelta(seconds=10))] == ["t0"]


def test_keyset_paging_walks_every_row_once_newest_first(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    for i in range(7):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=f"t{i}"))
        if i % 2:
            kernel.clock.advance(1)  # type: ignore[attr-defined]  # some share a timestamp
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = audit.list_decisions(kernel, DecisionQuery(cursor=cursor, limit=3))
        seen += [r.target for r in page.decisions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [f"t{i}" for i in reversed(range(7))]


def test_a_malformed_cursor_or_decision_is_a_validation_error(kernel: Kernel) -> None:
    with pytest.raises(ValidationError):
        audit.list_decisions(kernel, DecisionQuery(cursor="not-a-cursor"))
    with pytest.raises(ValidationError):
        audit.list_decisions(kernel, DecisionQuery(decision="maybe"))
    with pytest.raises(ValidationError):
        audit.list_decisions(kernel, DecisionQuery(limit=0))


def test_decisions_outlive_the_executions_retention(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "no", "denied by rule"))
    eid, did, att = running.start()
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="rm"))
    cancel_execution(kernel, eid)
    kernel.clock.advance(kernel.retention + 1)  # type: ignore[attr-defined]
    assert sweeps.delete_expired_executions(kernel) == 1
    with kernel.store.read() as tx:
        assert tx.get_execution(eid) is None
    [r] = _all(kernel, execution_id=eid)
    assert (r.decision, r.rule_id, r.target) == (DecisionOutcome.DENIED, "no", "rm")


def test_decision_retention_deletes_only_records_past_it(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="old"))
    kernel.clock.advance(kernel.decision_retention - 5)  # type: ignore[attr-defined]
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="new"))
    kernel.clock.advance(10)  # type: ignore[attr-defined]
    assert audit.delete_expired_decisions(kernel) == 1
    assert [r.target for r in _all(kernel)] == ["new"]


def test_no_decisions_row_when_the_record_is_switched_off(kernel: Kernel, running: Running) -> None:
    kernel.record_decisions = False
    eid, did, att = running.start()
    steps.submit_step(kernel, Lease("shell", eid, did, att), req())
    assert _all(kernel) == []


def _journal_and_table(k: Kernel) -> tuple[int, int]:
    with k.store.read() as tx:
        return tuple(  # type: ignore[return-value]
            int(tx.conn.execute(select(func.count()).select_from(table)).scalar_one())
            for table in (t.decision_journal, t.decisions)
        )


def test_a_record_is_read_from_the_journal_before_its_flush_and_from_the_table_after(
    kernel: Kernel, running: Running
) -> None:
    eid, did, att = running.start()
    for target in ("a", "b", "c"):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=target))
    assert _journal_and_table(kernel) == (3, 0)
    before = [(r.id, r.target, r.event_seq) for r in _all(kernel)]
    assert [target for _, target, _ in before] == ["c", "b", "a"]
    assert audit.flush_decision_journal(kernel) == 3
    assert _journal_and_table(kernel) == (0, 3)
    assert [(r.id, r.target, r.event_seq) for r in _all(kernel)] == before
    assert audit.flush_decision_journal(kernel) == 0


def test_pages_and_counts_span_the_journal_and_the_table(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    for i in range(5):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=f"old-{i}"))
        kernel.clock.advance(1)  # type: ignore[attr-defined]
    audit.flush_decision_journal(kernel)
    for i in range(4):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=f"new-{i}"))
        kernel.clock.advance(1)  # type: ignore[attr-defined]
    assert _journal_and_table(kernel) == (4, 5)
    seen: list[str] = []
    page = audit.list_decisions(kernel, DecisionQuery(agent_id="shell", limit=3))
    seen += [r.target for r in page.decisions]
    while page.next_cursor is not None:
        page = audit.list_decisions(kernel, DecisionQuery(agent_id="shell", limit=3, cursor=page.next_cursor))
        seen += [r.target for r in page.decisions]
    assert seen == [f"new-{i}" for i in reversed(range(4))] + [f"old-{i}" for i in reversed(range(5))]
    now = kernel.clock.now()
    counts = audit.count_decisions(kernel, DecisionQuery(), now - timedelta(seconds=60), now)
    assert sum(b.get("allowed", 0) for b in counts.buckets) == 9 and all(set(b) <= {"allowed"} for b in counts.buckets)


def test_retention_deletes_old_records_from_the_journal_too(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="flushed"))
    audit.flush_decision_journal(kernel)
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="journal"))
    kernel.clock.advance(kernel.decision_retention + 10)  # type: ignore[attr-defined]
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="kept"))
    assert audit.delete_expired_decisions(kernel) == 2
    assert [r.target for r in _all(kernel)] == ["kept"]


def test_the_journal_flush_moves_in_bounded_batches(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    for i in range(7):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=f"t{i}"))
    assert audit.flush_decision_journal(kernel, batch=3) == 7
    assert _journal_and_table(kernel) == (0, 7)
    assert sorted(r.target for r in _all(kernel)) == [f"t{i}" for i in range(7)]


def test_flushing_while_steps_append_loses_and_doubles_nothing(kernel: Kernel, running: Running) -> None:
    import threading

    starts = [running.start() for _ in range(3)]
    done = threading.Event()
    errors: list[BaseException] = []

    def submit(eid: str, did: str, att: int) -> None:
        try:
            for i in range(40):
                steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=f"t{i}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def flush() -> None:
        while not done.is_set():
            audit.flush_decision_journal(kernel, batch=7)

    flusher = threading.Thread(target=flush)
    flusher.start()
    workers = [threading.Thread(target=submit, args=s) for s in starts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    flusher.join()
    assert not errors
    audit.flush_decision_journal(kernel)
    ids = [r.id for r in _all(kernel)]
    assert _journal_and_table(kernel) == (0, 120)
    assert len(set(ids)) == len(ids) == 120


def test_the_judged_filter_finds_the_records_of_judge_rules_with_their_judge_record(
    kernel: Kernel, running: Running
) -> None:
    eid, did, att = running.start()
    judge = {"outcome": "deny", "probabilities": {"deny": 0.9}, "latency_ms": 12.0}
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "ask-model", "judge: deny 0.90", judge_record=judge))
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="send_email"))
    kernel.policy = FixedPolicy(Decision(Verdict.ALLOW, "plain"))
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="ls"))
    for flushed in (False, True):  # from the journal, then from the table
        [r] = _all(kernel, judged=True)
        assert (r.target, r.rule_id, r.judge) == ("send_email", "ask-model", judge)
        assert audit.decision_json(r)["judge"] == judge
        assert [x.target for x in _all(kernel, judged=False)] == ["ls"]
        assert "judge" not in audit.decision_json(_all(kernel, judged=False)[0])
        assert len(_all(kernel)) == 2
        if not flushed:
            audit.flush_decision_journal(kernel)
