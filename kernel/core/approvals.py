"""Approval use cases: read, grant, deny, expire (rebuno-v0 §5; regent.md §2 principals)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kernel.core import decision_log as dlog
from kernel.core import events as ev
from kernel.core.audit import approval_record
from kernel.core.kernel import Kernel
from kernel.core.leases import enqueue
from kernel.core.lifecycle import with_ancestors
from kernel.core.store_ports import Transaction
from kernel.domain import (
    Approval,
    ApprovalStatus,
    Credential,
    DecisionAt,
    DecisionOutcome,
    EventType,
    Execution,
    ExecutionStatus,
    StepStatus,
)
from kernel.errors import Conflict, Forbidden, NotFound, invalid

MAX_RATIONALE_CHARS = 10_000  # an approval's `rationale` (docs/api.md, "Bounds")
MAX_DECIDED_BY_CHARS = 200


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling a client/admin route. `name` is set for a scoped API key, None for the
    shared bootstrap token or anonymous dev access."""

    name: str | None = None
    scopes: frozenset[str] = frozenset()
    admin: bool = False
    key_id: str | None = None  # the scoped API key's id
    dev: bool = False  # tokenless access to `regent dev`

    @property
    def credential(self) -> Credential:
        if self.name is not None:
            return Credential.KEY
        return Credential.DEV if self.dev else Credential.BOOTSTRAP

    @property
    def actor(self) -> str:
        """Who this is in an audit record: the key's name, else `bootstrap` (the shared token and
        anonymous dev access alike; `credential` tells them apart)."""
        return self.name if self.name is not None else Credential.BOOTSTRAP.value

    @property
    def creator(self) -> str:
        """What an execution records as `created_by`: the key's id, else the credential."""
        return self.key_id if self.key_id is not None else self.credential.value

    def has(self, *scopes: str) -> bool:
        return self.admin or all(s in self.scopes for s in scopes)


def get_approval(k: Kernel, approval_id: str) -> Approval:
    with k.store.read() as tx:
        a = tx.get_approval(approval_id)
    if a is None:
        raise NotFound("approval not found")
    return a


def list_approvals(k: Kernel, status: str | None = "pending") -> list[Approval]:
    with k.store.read() as tx:
        return tx.list_approvals(status)


def decide_approval(
    k: Kernel, approval_id: str, *, grant: bool, principal: Principal, decided_by: str, rationale: str | None
) -> Approval:
    """Grant or deny, binding the decider to the credential (docs/audit.md):

    - a scoped key: the decider is the key's name, whatever `decided_by` says (kept as
      `asserted_by` when it differs); the key that created the execution may not decide;
    - the bootstrap token (or dev access): the decider is only asserted — `decided_by` must name
      one of the rule's approvers when it lists any, the record carries `asserted_by` and
      `credential: bootstrap`, and `k.bootstrap_approvals` off refuses it outright.

    Returns the approval as it was asked (its context: agent, rule id, ...).
    """
    # Both are stored and shown on every page listing the approval; a 5 MB rationale was accepted.
    if len(decided_by) > MAX_DECIDED_BY_CHARS:
        raise invalid(f"decided_by must be at most {MAX_DECIDED_BY_CHARS} characters")
    if rationale is not None and len(rationale) > MAX_RATIONALE_CHARS:
        raise invalid(f"rationale must be at most {MAX_RATIONALE_CHARS} characters")
    now = k.clock.now()
    with k.store.read() as tx:
        a0 = tx.get_approval(approval_id)
    if a0 is None:
        raise NotFound("approval not found")
    decided_by = decided_by.strip()
    if principal.name is not None:
        who: str | None = principal.name
        asserted = decided_by if decided_by and decided_by != principal.name else None
    else:
        if not k.bootstrap_approvals:
            raise Forbidden("forbidden: approvals by the bootstrap token are disabled on this kernel "
                            "(REGENT_BOOTSTRAP_APPROVALS=false); decide with a named API key")
        who = decided_by or None
        asserted = who
    with dlog.collect(k), k.store.transaction(lock=a0.execution_id) as tx:
        a = tx.get_approval(approval_id)
        assert a is not None
        if a.status != ApprovalStatus.PENDING:
            raise Conflict(f"conflict: approval is {a.status.value}")
        if a.approvers and who not in a.approvers:
            if who is None:
                raise Forbidden("forbidden: name the decider (decided_by): this approval needs one of "
                                + ", ".join(a.approvers))
            raise Forbidden(f'forbidden: "{who}" is not an approver for this approval')
        e = tx.get_execution(a.execution_id)
        if e is None or e.status.is_terminal:
            raise Conflict("conflict: execution is terminal")
        if principal.key_id is not None:
            _refuse_self_approval(tx, e, principal)
        s = tx.get_step(a.execution_id, a.step_id)
        kind, target = (s.kind, s.target) if s else ("", None)
        status = ApprovalStatus.GRANTED if grant else ApprovalStatus.DENIED
        credential = principal.credential.value
        tx.set_approval(a.id, status=status, decided_by=who, asserted_by=asserted, decided_at=now,
                        rationale=rationale, credential=credential)
        extra = {"decided_by": who, "asserted_by": asserted, "credential": credential,
                 "key_id": principal.key_id, "rationale": rationale or None}
        if grant:
            tx.update_step(a.execution_id, a.step_id, status=StepStatus.ALLOWED)
            answered = ev.approval(EventType.APPROVAL_GRANTED, a, "granted", **extra)
            out = [answered, ev.step(EventType.STEP_ALLOWED, a.step_id, kind, target, **ev.asked_fields(a))]
        else:
            error = _denial(rationale or "approval_denied", a)
            tx.update_step(a.execution_id, a.step_id, status=StepStatus.DENIED, error=error, completed_at=now)
            answered = ev.approval(EventType.APPROVAL_DENIED, a, "denied", **extra)
            out = [answered,
                   ev.step(EventType.STEP_DENIED, a.step_id, kind, target, error=error, **ev.asked_fields(a))]
        outcome = DecisionOutcome.APPROVAL_GRANTED if grant else DecisionOutcome.APPROVAL_DENIED
        record = _record(k, a, answered, outcome, now, e.agent_id, kind, target, who, credential, rationale or None)
        _resume(k, tx, a.execution_id, now, out, record)
        return a  # as it was asked (its context), for the caller's metrics


def _denial(reason: str, a: Approval) -> dict[str, str]:
    """A denied step's error: the reason, and the rule that asked for the approval, so every
    `denied` answer names a rule (the replay of this step is one)."""
    return {"reason": reason, "rule_id": a.rule_id} if a.rule_id else {"reason": reason}


def _refuse_self_approval(tx: Transaction, e: Execution, principal: Principal) -> None:
    """The key that created an execution may not decide its approvals, nor may another key of
    the same name (the name is the decider the record keeps, so a second key minted under it
    would otherwise approve its holder's own steps), nor either of them for a sub-agent's
    execution under one it created (the child's steps are still its work)."""
    for at in with_ancestors(tx, e):
        whose = "this execution" if at is e else f"an ancestor of this execution ({at.id})"
        created_by = at.created_by
        if created_by is not None and created_by not in (Credential.BOOTSTRAP.value, Credential.DEV.value):
            if created_by == principal.key_id:
                raise Forbidden(f"forbidden: this key created {whose} and may not approve its steps")
            creator = tx.get_api_key(created_by)
            if creator is not None and creator.name == principal.name:
                raise Forbidden(f'forbidden: "{principal.name}" created {whose} (with another key of that name) '
                                "and may not approve its steps")


def _record(
    k: Kernel, a: Approval, answered: ev.Ev, outcome: DecisionOutcome, now: datetime, agent_id: str, kind: str,
    target: str | None, decided_by: str | None, credential: str | None, reason: str | None,
) -> DecisionAt | None:
    rec = approval_record(a, outcome, now, agent_id=agent_id, kind=kind, target=target or "",
                          decided_by=decided_by, credential=credential, reason=reason) if k.record_decisions else None
    # The decision-log entry of the same decision, with the record's id (shipped after commit).
    dlog.note_approval(k, a, agent_id, kind, target, outcome.value, now, decided_by=decided_by, rationale=reason,
                       decision_id=rec.id if rec is not None else None)
    return DecisionAt(answered, rec) if rec is not None else None


def _resume(
    k: Kernel, tx: Transaction, execution_id: str, now: datetime, out: list[ev.Ev],
    record: DecisionAt | None,
) -> None:
    out.append(ev.execution(EventType.EXECUTION_RESUMED, execution_id, ExecutionStatus.RUNNING))
    _, queued = enqueue(k, tx, execution_id, now)
    out.append(queued)
    tx.append(execution_id, now, out, status=ExecutionStatus.RUNNING, decision=record)


# Expired approvals per transaction. One each was a durable commit per resumed execution: with
# 10^5 executions parked on approvals and released at once, the sweep resumed about 80 a second
# (bench/parked.py, load 12-15) and 30 000 in its 300 s bound. A transaction holds the locks of
# its executions and (SQLite) the write lock while it writes: 20 keeps that to a few milliseconds.
EXPIRE_PER_TX = 20


def expire_approvals(k: Kernel, limit: int = 100) -> int:
    """The sweep: pending approvals past `timeout_at` expire and their steps are denied, their
    executions resumed; `EXPIRE_PER_TX` of them to a transaction."""
    now = k.clock.now()
    with k.store.read() as tx:
        due = tx.expired_approvals(now, limit)
    n = 0
    for i in range(0, len(due), EXPIRE_PER_TX):
        chunk = due[i:i + EXPIRE_PER_TX]
        with dlog.collect(k), k.store.transaction() as tx:
            # Every execution's lock before the first read and write (on SQLite the write lock
            # comes after the keyed ones), in one order so two sweepers cannot deadlock.
            for eid in sorted({a.execution_id for a in chunk}):
                tx.lock_execution(eid)
            for a0 in chunk:
                n += _expire(k, tx, a0.id, now)
    return n


def _expire(k: Kernel, tx: Transaction, approval_id: str, now: datetime) -> int:
    """Expire one approval under its execution's lock (re-read: it may have been answered)."""
    a = tx.get_approval(approval_id)
    if a is None or a.status != ApprovalStatus.PENDING or a.timeout_at > now:
        return 0
    e = tx.get_execution(a.execution_id)
    if e is None or e.status.is_terminal:
        return 0
    s = tx.get_step(a.execution_id, a.step_id)
    kind, target = (s.kind, s.target) if s else ("", None)
    error = _denial("approval_timeout", a)
    tx.set_approval(a.id, status=ApprovalStatus.EXPIRED, decided_at=now, rationale="timeout")
    tx.update_step(a.execution_id, a.step_id, status=StepStatus.DENIED, error=error, completed_at=now)
    answered = ev.approval(EventType.APPROVAL_EXPIRED, a, "expired", rationale="timeout")
    out = [answered, ev.step(EventType.STEP_DENIED, a.step_id, kind, target, error=error, **ev.asked_fields(a))]
    record = _record(k, a, answered, DecisionOutcome.APPROVAL_EXPIRED, now, e.agent_id, kind, target, None, None,
                     "approval_timeout")
    _resume(k, tx, a.execution_id, now, out, record)
    return 1
