"""Step use cases: submit (replay or decide), record an outcome, read (rebuno-v0 §2.1, §2.2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kernel.clock import rfc3339
from kernel.core import decision_log as dlog
from kernel.core import events as ev
from kernel.core import resources
from kernel.core.audit import policy_record
from kernel.core.executions import load_owned, owned
from kernel.core.kernel import Kernel
from kernel.core.leases import check_attempt, park_until, require_live_lease
from kernel.core.ports import LimitOutcome, ShadowObservation
from kernel.core.store_ports import StepStore, Transaction
from kernel.core.usage import parse_usage
from kernel.domain import (
    Answer,
    Approval,
    ApprovalStatus,
    Decision,
    DecisionAt,
    DecisionOutcome,
    DispatchStatus,
    EventType,
    Execution,
    ExecutionStatus,
    JudgeAnswer,
    JudgeSpec,
    Lease,
    PolicyInput,
    Step,
    StepKind,
    StepStatus,
    Verdict,
    resolve_judge,
)
from kernel.domain.decision import apply_budget
from kernel.domain.step import INDETERMINATE_ERROR, Idempotency
from kernel.errors import Conflict, LeaseSuperseded, NotFound
from kernel.identity import step_id as compute_step_id
from kernel.ids import new_uuid7


class JudgeNeeded(Exception):
    """A judge rule decided this new step. Raised inside the submit's transaction before anything
    is written (so it rolls back): the caller asks the judge outside any transaction or lane
    thread, then submits again with the answer in `judged` (kernel/api/routes/agent.py)."""

    def __init__(self, rule_id: str, spec: JudgeSpec, inp: PolicyInput):
        super().__init__(rule_id)
        self.rule_id, self.spec, self.input = rule_id, spec, inp


INDETERMINATE_RETRY = Decision(Verdict.DENY, "__indeterminate_retry", "prior attempt outcome unknown; retry refused")
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class StepRequest:
    kind: str
    target: str
    args: Any  # decoded (for policy)
    args_text: str  # canonical JSON text (stored; identity is its hash)
    args_hash: str
    idempotency: str = Idempotency.SAFE_TO_RETRY.value
    resources: tuple[str, ...] = ()  # the registered resources the body may change


@dataclass(frozen=True, slots=True)
class StepAnswer:
    """The decision object of the v0 API; empty fields are omitted on the wire."""

    decision: Answer
    step_id: str | None = None
    result: Any = _UNSET
    error: Any = None
    approval_id: str | None = None
    reason: str | None = None
    rule_id: str | None = None
    # A `proceed` answer's declared resources: [{key, generation, due}] (kernel/core/resources.py).
    resources: list[dict[str, Any]] | None = None
    # The rule of the policy decision this answer made (None for replays and refusals before
    # policy): the metrics label, never on the wire.
    decided_rule: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"decision": self.decision}
        if self.step_id:
            out["step_id"] = self.step_id
        if self.result is not _UNSET:
            out["result"] = self.result
        for key in ("error", "approval_id", "reason", "rule_id"):
            value = getattr(self, key)
            if value is not None and value != "":
                out[key] = value
        if self.resources is not None:
            out["resources"] = self.resources
        return out

    @property
    def recorded(self) -> bool:
        return self.step_id is not None


def submit_step(
    k: Kernel, lease: Lease, req: StepRequest, judged: Mapping[str, JudgeAnswer] | None = None,
) -> StepAnswer:
    """Replay or decide one step. A judge rule's first pass raises JudgeNeeded; the second pass
    takes the judge's answer by rule id in `judged` (a rule other than the one asked about, say
    after a bundle change in between, is resolved as if the judge were unavailable)."""
    # The shadow bundle is evaluated after the answer has committed, off this thread: here it
    # costs one dict lookup, and a queue put for the steps the active bundle decided.
    seen = _Seen() if k.shadow.wants(lease.agent_id) else None
    with dlog.collect(k):  # decision-log entries leave only once the transaction has committed
        answer = _submit_step(k, lease, req, judged, seen)
    if seen is not None and seen.observation is not None:
        observation = seen.observation
        k.store.after_commit(lambda: k.shadow.observe(observation))
    return answer


class _Seen:
    """What the shadow needs of a decided step, filled in while the step is decided."""

    __slots__ = ("limit", "limit_key", "observation")

    def __init__(self) -> None:
        self.observation: ShadowObservation | None = None
        self.limit_key: str | None = None
        self.limit: LimitOutcome | None = None


class _Submit:
    """One submit's values, which every helper deciding a new step reads: the kernel, the
    transaction, the caller's lease, the request, the clock's reading, the execution as read under
    its lock, the step's id and occurrence, and what the shadow needs (None when it does not)."""

    __slots__ = ("e", "k", "lease", "now", "occurrence", "req", "seen", "sid", "tx")

    def __init__(self, k: Kernel, tx: Transaction, lease: Lease, req: StepRequest, now: datetime, e: Execution,
                 sid: str, occurrence: int, seen: _Seen | None) -> None:
        self.k, self.tx, self.lease, self.req, self.now = k, tx, lease, req, now
        self.e, self.sid, self.occurrence, self.seen = e, sid, occurrence, seen


def _submit_step(
    k: Kernel, lease: Lease, req: StepRequest, judged: Mapping[str, JudgeAnswer] | None, seen: _Seen | None,
) -> StepAnswer:
    now = k.clock.now()
    execution_id, dispatch_id = lease.execution_id, lease.dispatch_id
    with k.store.transaction(lock=execution_id) as tx:
        e0, d, occurrence, at = tx.submit_context(execution_id, dispatch_id, req.kind, req.target, req.args_hash)
        e = owned(e0, lease.agent_id)
        if e.status.is_terminal:
            return StepAnswer(Answer.EXECUTION_TERMINAL)
        if (d is None or d.execution_id != execution_id or d.attempt != lease.attempt
                or d.status != DispatchStatus.IN_FLIGHT):
            raise LeaseSuperseded()
        sid = compute_step_id(execution_id, req.kind, req.target, req.args_hash, occurrence)
        declared = resources.require_registered(tx, execution_id, req.resources) if req.resources else None
        # The step recorded at this call's identity and occurrence is the one `sid` names (the id
        # is a hash of them); a row under another id there would be a collision: read by id then.
        existing = at if at is None or at.step_id == sid else tx.get_step(execution_id, sid)
        if existing is None and e.forked_from is not None:
            existing = _lent(tx, e, sid, occurrence, req, now)
        if existing is not None:
            require_live_lease(tx, lease, now)
            answer = _answer_existing(tx, existing, req, now)
            tx.advance_counter(dispatch_id, req.kind, req.target, req.args_hash, occurrence + 1)
        elif e.status == ExecutionStatus.BLOCKED:
            return StepAnswer(Answer.EXECUTION_BLOCKED)
        else:
            # A step recorded now advances its counter with its own writes (`_record`).
            answer = _decide_new(_Submit(k, tx, lease, req, now, e, sid, occurrence, seen), judged)
            if not answer.recorded:
                return answer
        if declared is not None and answer.decision == Answer.PROCEED:
            answer = dataclasses.replace(
                answer, resources=resources.advance(tx, execution_id, declared, bump=existing is None))
        return answer


_OUTCOME_EVENT = {
    StepStatus.SUCCEEDED: EventType.STEP_SUCCEEDED,
    StepStatus.FAILED: EventType.STEP_FAILED,
    StepStatus.DENIED: EventType.STEP_DENIED,
}


def _lent(tx: StepStore, e: Execution, sid: str, occurrence: int, req: StepRequest, now: datetime) -> Step | None:
    """A fork's lineage (docs/api.md, "Forks"): a step the fork has not recorded, whose source
    recorded its outcome at or before the fork point, is written into the fork as the source
    recorded it (its `step.proposed` and outcome event, marked `replayed_from`) and replayed."""
    assert e.forked_from is not None
    source_sid = compute_step_id(e.forked_from, req.kind, req.target, req.args_hash, occurrence)
    s = tx.lend_step(e.forked_from, source_sid, e.fork_seq, sid, e.id)
    if s is None:
        return None
    extra: dict[str, Any] = {"replayed_from": source_sid}
    if s.status == StepStatus.SUCCEEDED and (s.usage_input or s.usage_output):
        extra["usage"] = {"input_tokens": s.usage_input, "output_tokens": s.usage_output}
        tx.add_usage(e.id, s.usage_input, s.usage_output)
    if s.status != StepStatus.SUCCEEDED:
        extra["error"] = s.error
    if s.status == StepStatus.DENIED and isinstance(s.error, dict):
        extra.update({k: s.error[k] for k in ("reason", "rule_id") if k in s.error})
    tx.append(e.id, now, [
        ev.step(EventType.STEP_PROPOSED, sid, s.kind, s.target, replayed_from=source_sid),
        ev.step(_OUTCOME_EVENT[s.status], sid, s.kind, s.target, **extra),
    ])
    return s


def _answer_existing(tx: Transaction, s: Step, req: StepRequest, now: datetime) -> StepAnswer:
    """The replay table: answer from the stored status without consulting policy."""
    sid = s.step_id
    if s.status == StepStatus.SUCCEEDED:
        return StepAnswer(Answer.REPLAY, sid, result=s.result)
    if s.status == StepStatus.FAILED:
        return StepAnswer(Answer.REPLAY, sid, error=s.error)
    if s.status == StepStatus.DENIED:
        reason = s.error.get("reason") if isinstance(s.error, dict) else None
        rule = s.error.get("rule_id") if isinstance(s.error, dict) else None
        return StepAnswer(Answer.DENIED, sid, reason=reason or "policy_denied", rule_id=rule)
    if s.status == StepStatus.AWAITING_APPROVAL:
        a = tx.pending_approval_for_step(sid)
        return StepAnswer(Answer.BLOCKED, sid, approval_id=a.id if a else None)
    if s.status in (StepStatus.ALLOWED, StepStatus.PROPOSED):
        tx.update_step(s.execution_id, sid, status=StepStatus.EXECUTING, started_at=now)
        tx.append(s.execution_id, now, [ev.step(EventType.STEP_EXECUTING, sid, s.kind, s.target)])
        return StepAnswer(Answer.PROCEED, sid)
    if s.status == StepStatus.EXECUTING and req.idempotency == Idempotency.AT_MOST_ONCE:
        # Orphaned: the body may have run. Never run it twice; report the unknown outcome.
        tx.update_step(s.execution_id, sid, status=StepStatus.FAILED, error=INDETERMINATE_ERROR, completed_at=now)
        tx.append(s.execution_id, now, [ev.step(EventType.STEP_FAILED, sid, s.kind, s.target, error=INDETERMINATE_ERROR)])
        return StepAnswer(Answer.REPLAY, sid, error=INDETERMINATE_ERROR)
    return StepAnswer(Answer.PROCEED, sid)  # executing & safe to retry (or unreachable states)


def _decide_new(c: _Submit, judged: Mapping[str, JudgeAnswer] | None) -> StepAnswer:
    k, tx, e, sid, req, now, seen = c.k, c.tx, c.e, c.sid, c.req, c.now, c.seen
    usage_in, usage_out = e.usage_input, e.usage_output  # read with the row, under the lock
    inp = PolicyInput(
        agent_id=e.agent_id,
        kind=req.kind,
        target=req.target,
        args=req.args,
        idempotency=req.idempotency,
        execution={
            "id": e.id,
            "agent_id": e.agent_id,
            "input": e.input,
            "created_at": rfc3339(e.created_at),
            "session": e.session,
            "parent_execution_id": e.parent_execution_id,
            "forked_from": e.forked_from,
        },
        usage={"input_tokens": usage_in, "output_tokens": usage_out},
        now=rfc3339(now),
        session=e.session,
    )
    if req.idempotency == Idempotency.AT_MOST_ONCE and tx.has_indeterminate_failure(
        e.id, req.kind, req.target, req.args_hash
    ):
        decision = INDETERMINATE_RETRY
    else:
        decision = k.policy.decide(inp, tx=tx, bundle_id=e.fork_bundle_id)
        if decision.judge is not None:
            decision = _judged(decision, inp, judged)
        limited = _apply_rate_limit(c, decision)
        if limited is not None:
            dlog.note_step(k, e, sid, inp, decision, EventType.STEP_RATE_LIMITED.value, now,
                           outcome=limited.decision, reason=limited.reason)
            if seen is not None:
                seen.observation = ShadowObservation(e.id, sid, now, inp, decision, "rate_limited",
                                                     seen.limit_key, seen.limit)
            return limited
        spend = usage_in + usage_out
        if decision.budget is not None and decision.budget.scope == "session" and e.session is not None:
            spend = sum(tx.session_usage(e.session))
        final = _gate_fork_effect(e, req, apply_budget(decision, spend))
        if seen is not None:
            seen.observation = ShadowObservation(e.id, sid, now, inp, decision, final.verdict.value,
                                                 seen.limit_key, seen.limit)
        decision = final
    # The lease is checked again inside the transaction that records the answer, so a reclaim
    # that landed since the entry check fails the whole write with 409 and leaves no trace.
    require_live_lease(tx, c.lease, now)
    answer = _record(c, decision)
    dlog.note_step(k, e, sid, inp, decision, _DECISION_EVENTS[decision.verdict].value, now)
    return answer


_DECISION_EVENTS = {
    Verdict.ALLOW: EventType.STEP_ALLOWED,
    Verdict.DENY: EventType.STEP_DENIED,
    Verdict.REQUIRE_APPROVAL: EventType.STEP_AWAITING_APPROVAL,
}


def _judged(d: Decision, inp: PolicyInput, judged: Mapping[str, JudgeAnswer] | None) -> Decision:
    assert d.judge is not None
    if judged is None:
        raise JudgeNeeded(d.rule_id, d.judge, inp)
    answer = judged.get(d.rule_id) or JudgeAnswer.unavailable("the policy changed while the judge was asked")
    return resolve_judge(d, answer)


def _apply_rate_limit(c: _Submit, d: Decision) -> StepAnswer | None:
    k, tx, e, seen = c.k, c.tx, c.e, c.seen
    spec = d.rate_limit
    if spec is None or not spec.active:
        return None
    key = spec.bucket(d.rule_id, e.agent_id, e.id, e.session)
    outcome = k.limiter.hit(key, spec)
    if seen is not None:
        seen.limit_key, seen.limit = key, outcome
    if outcome.error is not None:
        if spec.on_limiter_error == "deny":
            return _refuse(c, d, "rate_limiter_unavailable")
        return None  # fail open
    if outcome.admitted:
        return None
    if spec.max_wait_seconds <= 0:
        return _refuse(c, d, "rate_limit_exceeded")
    wait = outcome.wait_seconds if outcome.wait_seconds > 0 else spec.window_seconds / spec.max_calls
    if wait > spec.max_wait_seconds or tx.count_events(e.id, EventType.STEP_RATE_LIMITED.value) > 0:
        return _refuse(c, d, "rate_limit_exceeded")
    wait = min(wait + k.rng.uniform(0, wait / 2), spec.max_wait_seconds)
    require_live_lease(tx, c.lease, c.now)
    limited = _rate_limited_event(c, d, "rate_limit_exceeded")
    queued = park_until(k, tx, e.id, c.now, wait)
    tx.append(e.id, c.now, [limited, queued], decision=_limited_record(c, d, "rate_limit_exceeded", limited))
    return StepAnswer(Answer.BLOCKED, reason="rate_limit_exceeded", decided_rule=d.rule_id)


def _limited_record(c: _Submit, d: Decision, reason: str, event: ev.Ev) -> DecisionAt | None:
    if not c.k.record_decisions:
        return None
    return DecisionAt(event, dlog.bind(policy_record(c.e, c.sid, c.req.kind, c.req.target,
                                                     DecisionOutcome.RATE_LIMITED, d, c.now, reason=reason)))


def _rate_limited_event(c: _Submit, d: Decision, reason: str) -> ev.Ev:
    error = {"reason": reason, "rule_id": d.rule_id}
    fields = ev.decision_fields(d)
    fields.pop("reason", None)
    return ev.step(EventType.STEP_RATE_LIMITED, c.sid, c.req.kind, c.req.target, error=error, **fields)


def _refuse(c: _Submit, d: Decision, reason: str) -> StepAnswer:
    require_live_lease(c.tx, c.lease, c.now)
    limited = _rate_limited_event(c, d, reason)
    c.tx.append(c.e.id, c.now, [limited], decision=_limited_record(c, d, reason, limited))
    return StepAnswer(Answer.RATE_LIMITED, reason=reason, decided_rule=d.rule_id)


FORK_EFFECT_RULE = "__fork_effect"


def _gate_fork_effect(e: Execution, req: StepRequest, d: Decision) -> Decision:
    """A fork may reach an effect its source already performed after the fork point: every
    `at_most_once` step a fork runs live needs approval first (rule `__fork_effect`; docs/api.md)."""
    if e.forked_from is None or req.idempotency != Idempotency.AT_MOST_ONCE or d.verdict != Verdict.ALLOW:
        return d
    return dataclasses.replace(d, verdict=Verdict.REQUIRE_APPROVAL, rule_id=FORK_EFFECT_RULE,
                               reason="a fork runs this at_most_once effect live: approval required")


def _record(c: _Submit, d: Decision) -> StepAnswer:
    """Write a step decided now: its row, its events, its decision record and its occurrence
    counter's advance, on PostgreSQL in one statement (`Tx.append`)."""
    k, tx, e, sid, occurrence, req, now = c.k, c.tx, c.e, c.sid, c.occurrence, c.req, c.now
    counter = (c.lease.dispatch_id, req.kind, req.target, req.args_hash, occurrence + 1)

    def row(status: StepStatus, **more: Any) -> Step:
        return Step(step_id=sid, execution_id=e.id, kind=req.kind, target=req.target, args_hash=req.args_hash,
                    occurrence=occurrence, status=status, idempotency=req.idempotency, **more)

    proposed = ev.step(EventType.STEP_PROPOSED, sid, req.kind, req.target)
    fields = ev.decision_fields(d)

    def record(decided: ev.Ev, outcome: DecisionOutcome, reason: str | None = None) -> DecisionAt | None:
        if not k.record_decisions:
            return None
        return DecisionAt(decided, dlog.bind(policy_record(e, sid, req.kind, req.target, outcome, d, now,
                                                           reason=reason)))

    if d.verdict == Verdict.ALLOW:
        allowed = ev.step(EventType.STEP_ALLOWED, sid, req.kind, req.target, **fields)
        tx.append(e.id, now, [
            proposed,
            allowed,
            ev.step(EventType.STEP_EXECUTING, sid, req.kind, req.target),
        ], decision=record(allowed, DecisionOutcome.ALLOWED), step=(row(StepStatus.EXECUTING, started_at=now), req.args_text),
            counter=counter)
        return StepAnswer(Answer.PROCEED, sid, decided_rule=d.rule_id)
    if d.verdict == Verdict.DENY:
        reason = d.reason or "policy_denied"
        error = {"reason": reason, "rule_id": d.rule_id}
        fields["reason"] = reason
        denied = ev.step(EventType.STEP_DENIED, sid, req.kind, req.target, error=error, **fields)
        tx.append(e.id, now, [proposed, denied], decision=record(denied, DecisionOutcome.DENIED, reason),
            step=(row(StepStatus.DENIED, error=error, completed_at=now), req.args_text), counter=counter)
        return StepAnswer(Answer.DENIED, sid, reason=reason, rule_id=d.rule_id, decided_rule=d.rule_id)
    # require_approval: the execution blocks and its lease is released until a human decides.
    cfg = d.approval
    timeout = cfg.timeout_seconds if cfg and cfg.timeout_seconds > 0 else k.approval_timeout
    a = Approval(
        id=new_uuid7(), step_id=sid, execution_id=e.id, status=ApprovalStatus.PENDING,
        approvers=list(cfg.approvers) if cfg and cfg.approvers else [],
        message=(cfg.message or None) if cfg else None,
        timeout_at=now + timedelta(seconds=timeout), created_at=now,
        agent_id=e.agent_id, kind=req.kind, target=req.target, rule_id=d.rule_id, reason=d.reason or None,
        policy_hash=d.policy_hash or None, policy_kind=d.policy_kind.value, policy_revision=d.policy_revision,
    )
    tx.insert_step(row(StepStatus.AWAITING_APPROVAL), req.args_text)
    tx.insert_approval(a)
    tx.retire_dispatches(e.id, now)
    awaiting = ev.step(EventType.STEP_AWAITING_APPROVAL, sid, req.kind, req.target, **fields)
    tx.append(e.id, now, [
        proposed,
        awaiting,
        ev.approval(EventType.APPROVAL_REQUESTED, a, "pending"),
        ev.execution(EventType.EXECUTION_BLOCKED, e.id, ExecutionStatus.BLOCKED),
    ], status=ExecutionStatus.BLOCKED, decision=record(awaiting, DecisionOutcome.AWAITING_APPROVAL), counter=counter)
    return StepAnswer(Answer.BLOCKED, sid, approval_id=a.id, decided_rule=d.rule_id)


def record_outcome(
    k: Kernel, lease: Lease, step_id: str, *, result: Any = None, error: Any = None, failed: bool = False,
    captures: list[resources.Capture] | None = None, capture_failures: list[resources.CaptureFailure] | None = None,
) -> StepAnswer:
    """Complete or fail a step; a terminal outcome is never overwritten (replay answers it). The
    body's `captures` of its resources cover from the outcome's event (kernel/core/resources.py)."""
    now = k.clock.now()
    execution_id = lease.execution_id
    # Nothing slow runs between the outcome's one read and its writes: on SQLite the transaction
    # takes the write lock at BEGIN, with no read snapshot (and its COMMIT) first.
    with k.store.transaction(lock=execution_id, write=True) as tx:
        e0, s, d = tx.outcome_context(execution_id, step_id, lease.dispatch_id)
        e = owned(e0, lease.agent_id)
        if s is None or s.execution_id != execution_id:
            raise NotFound("step not found")
        if e.status.is_terminal:
            return StepAnswer(Answer.EXECUTION_TERMINAL)
        if s.status.is_terminal:
            # The stored outcome, whichever call this is, as the submit route's replay answers it:
            # a succeeded step's result, any other terminal step's error, never `"result": null`
            # for a step that failed (rebuno-v0 §2.1: empty fields are omitted).
            if s.status == StepStatus.SUCCEEDED:
                return StepAnswer(Answer.REPLAY, result=s.result)
            return StepAnswer(Answer.REPLAY, error=s.error)
        if s.status != StepStatus.EXECUTING:
            raise Conflict(f"conflict: cannot record outcome for step in status {s.status.value}")
        check_attempt(d, lease)
        # The outcome event and the step's update together, so that update also records the
        # event's seq (outcome_seq, which a fork's lineage reads): on PostgreSQL one statement.
        if failed:
            seq = tx.append(execution_id, now, [ev.step(EventType.STEP_FAILED, step_id, s.kind, s.target, error=error)],
                            outcome=(step_id, {"status": StepStatus.FAILED, "error": error, "completed_at": now}))
            resources.record_captures(tx, execution_id, now, captures or [], capture_failures or [], at_seq=seq)
            return StepAnswer(Answer.RECORDED)
        usage = parse_usage(result) if s.kind == StepKind.LLM_CALL else None
        values: dict[str, Any] = {"status": StepStatus.SUCCEEDED, "result": result, "completed_at": now}
        extra: dict[str, Any] = {}
        if usage is not None:
            values.update(usage_input=usage[0], usage_output=usage[1])
            extra["usage"] = {"input_tokens": usage[0], "output_tokens": usage[1]}
            tx.add_usage(execution_id, usage[0], usage[1])
        seq = tx.append(execution_id, now, [ev.step(EventType.STEP_SUCCEEDED, step_id, s.kind, s.target, **extra)],
                        outcome=(step_id, values))
        resources.record_captures(tx, execution_id, now, captures or [], capture_failures or [], at_seq=seq)
        return StepAnswer(Answer.RECORDED)


def get_step(k: Kernel, execution_id: str, step_id: str, agent_id: str | None) -> Step:
    with k.store.read() as tx:
        load_owned(tx, execution_id, agent_id)
        s = tx.get_step(execution_id, step_id)
    if s is None or s.execution_id != execution_id:
        raise NotFound("step not found")
    return s


def list_steps(k: Kernel, execution_id: str, agent_id: str | None, terminal_only: bool) -> list[Step]:
    with k.store.read() as tx:
        load_owned(tx, execution_id, agent_id)
        return tx.list_steps(execution_id, terminal_only)
