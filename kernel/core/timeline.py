"""Read models for an operator: a page of executions with counts per status, and one execution's
timeline (its events in order, each step folded into one row with its decision and approval)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kernel.core.executions import load_owned
from kernel.core.kernel import Kernel
from kernel.domain import Approval, Event, EventType, Execution, Step
from kernel.errors import invalid
from kernel.text import check_text

TIMELINE_EVENTS = 500  # events per timeline page (about 125 steps); the rest are a "later events" link away
_DECISIONS = {
    EventType.STEP_ALLOWED.value: "allow",
    EventType.STEP_DENIED.value: "deny",
    EventType.STEP_AWAITING_APPROVAL.value: "require_approval",
    EventType.STEP_RATE_LIMITED.value: "rate_limited",
}


# The console's status counts stop here: each is an index range read up to it, where a full count
# read the whole status index on every view. At 10 000 the page still grew with the store until
# every status passed the cap: on the year-old stores (bench/scale.py) three statuses were past it at
# 10^6 executions and one at 10^5, so a view read about 30 000 index entries against 17 000 and its
# p99 was 1.6× (SQLite) and 2.25× (PostgreSQL) the tenth-size store's. At 1 000 a status of a
# store a few days old is already past it, and a view reads at most 6 × 1 001 entries at any size.
COUNT_CAP = 1_000


@dataclass(frozen=True, slots=True)
class ExecutionPage:
    executions: list[Execution]
    next_cursor: str | None  # older executions: pass as `cursor`
    counts: dict[str, int]  # status → executions (of the agent filter, all time), up to count_cap + 1
    prev_cursor: str | None = None  # newer executions: pass as `newer_than`
    count_cap: int = COUNT_CAP  # a count above it is shown as "more than count_cap"


_ID_PREFIX = re.compile(r"[0-9a-f-]{1,36}")


def id_prefix(text: str) -> str:
    """An execution id or the first characters of one, as typed into the search (any case,
    surrounding spaces dropped); ValidationError for anything an id cannot start with."""
    t = text.strip().lower()
    if not _ID_PREFIX.fullmatch(t):
        raise invalid("an execution id (or its first characters) is hex digits and hyphens")
    return t


def execution_page(
    k: Kernel, *, agent_id: str | None, status: str | None, created_from: datetime | None,
    created_to: datetime | None, cursor: str | None, limit: int, newer_than: str | None = None,
    id_starts: str | None = None,
) -> ExecutionPage:
    """Newest first, keyset-paged on the (time-ordered) id both ways: `cursor` → the older page
    after it, `newer_than` → the newer page before it. `id_starts`: ids starting with it."""
    if limit < 1:
        raise invalid("limit must be >= 1")
    if agent_id is not None:
        check_text(agent_id, "agent id")
    prefix = id_prefix(id_starts) if id_starts else None
    filters: dict[str, Any] = {"created_from": created_from, "created_to": created_to, "id_prefix": prefix}
    with k.store.read() as tx:
        if newer_than is not None:
            rows = tx.list_executions(agent_id, status, None, limit + 1, newer_than=newer_than, **filters)
            newer = len(rows) > limit
            rows = rows[1:] if newer else rows
            older = bool(rows) and bool(tx.list_executions(agent_id, status, rows[-1].id, 1, **filters))
            if not rows:  # nothing newer any more: the first page
                return execution_page(k, agent_id=agent_id, status=status, created_from=created_from,
                                      created_to=created_to, cursor=None, limit=limit, id_starts=id_starts)
        else:
            rows = tx.list_executions(agent_id, status, cursor, limit + 1, **filters)
            older = len(rows) > limit
            rows = rows[:limit]
            newer = cursor is not None and bool(rows) and bool(
                tx.list_executions(agent_id, status, None, 1, newer_than=rows[0].id, **filters))
        counts = tx.count_executions_by_status(agent_id, COUNT_CAP)
    return ExecutionPage(rows, rows[-1].id if older and rows else None, counts,
                         rows[0].id if newer and rows else None, COUNT_CAP)


@dataclass(slots=True)
class StepRow:
    """One step of the timeline: the step's row (None when refused before one was written, as a
    rate-limited step) and every event about it, the first decision's fields lifted out."""

    step_id: str
    kind: str
    target: str
    seq: int
    occurred_at: datetime
    step: Step | None = None
    decision: str = ""  # allow | deny | require_approval | rate_limited
    rule_id: str = ""
    reason: str = ""
    policy_kind: str = ""
    policy_revision: str = ""
    policy_hash: str = ""  # the bundle's content hash (a Rego revision may name two bundles)
    approval: Approval | None = None
    events: list[Event] = field(default_factory=list)
    # Later decisions of the same step, (verdict, rule id): a parked step decided again when the
    # agent is delivered back, so its row does not read rate_limited once it ran.
    then: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.step.status.value if self.step is not None else self.decision


@dataclass(slots=True)
class Timeline:
    execution: Execution
    rows: list[StepRow | Event]  # in event order; a step's row sits at its first event
    last_seq: int  # of the events read
    execution_seq: int  # the execution's last event seq (what a live page compares)
    next_seq: int | None  # where the next page starts, when there is one
    steps: int  # of the whole execution, as are the attempts
    attempts: int  # dispatch attempts delivered
    after_seq: int = 0  # where this page starts (its first event is the next one)
    page_size: int = TIMELINE_EVENTS

    @property
    def latest_start(self) -> int:
        """Where the page holding the execution's newest events starts (seqs are gapless)."""
        return max(self.execution_seq - 1, 0) // self.page_size * self.page_size

    @property
    def earlier_start(self) -> int:
        return max(self.after_seq - self.page_size, 0)


def timeline(k: Kernel, execution_id: str, after_seq: int = 0, limit: int = TIMELINE_EVENTS) -> Timeline:
    with k.store.read() as tx:
        e = load_owned(tx, execution_id, None)
        events = tx.list_events(execution_id, after_seq, limit + 1)
        ids = {sid for ev in events[:limit] if isinstance(sid := ev.payload.get("step_id"), str)}
        steps = {s.step_id: s for s in tx.get_steps(execution_id, sorted(ids))}
        approvals = {a.step_id: a for a in tx.list_approvals(None, execution_id=execution_id)}
        execution_seq = tx.last_event_seq(execution_id)
        if after_seq == 0 and len(events) <= limit:  # the whole execution is on this page
            total_steps = total_attempts = -1
        else:
            total_steps = tx.count_steps(execution_id)
            total_attempts = tx.count_events_of(
                execution_id, [EventType.DISPATCH_ACKED.value, EventType.DISPATCH_FAILED.value])
    more = len(events) > limit
    events = events[:limit]
    rows: list[StepRow | Event] = []
    by_step: dict[str, StepRow] = {}
    attempts = 0
    for ev in events:
        p = ev.payload
        sid = p.get("step_id")
        if ev.type.startswith("dispatch."):
            attempts += ev.type == EventType.DISPATCH_ACKED.value or ev.type == EventType.DISPATCH_FAILED.value
        if not isinstance(sid, str):
            rows.append(ev)
            continue
        row = by_step.get(sid)
        if row is None:
            s = steps.get(sid)
            row = StepRow(sid, str(p.get("step_type") or (s.kind if s else "")),
                          str(p.get("target") or (s.target if s else "")), ev.event_seq, ev.occurred_at, s,
                          approval=approvals.get(sid))
            by_step[sid] = row
            rows.append(row)
        row.events.append(ev)
        verdict = _DECISIONS.get(ev.type)
        if verdict and "rule_id" in p and row.rule_id:
            row.then.append((verdict, str(p["rule_id"])))
        elif verdict and "rule_id" in p:
            row.decision = verdict
            row.rule_id = str(p["rule_id"])
            error = p.get("error")
            row.reason = str(p.get("reason") or (error.get("reason") if isinstance(error, dict) else "") or "")
            row.policy_kind = str(p.get("policy_kind") or "")
            row.policy_revision = str(p.get("policy_revision") or "")
            row.policy_hash = str(p.get("policy_hash") or "")
    last = events[-1].event_seq if events else after_seq
    return Timeline(e, rows, last, execution_seq, last if more else None,
                    len(by_step) if total_steps < 0 else total_steps,
                    attempts if total_attempts < 0 else total_attempts, after_seq, limit)


def last_event_seq(k: Kernel, execution_id: str) -> tuple[int, str]:
    """(the execution's last event seq, its status): what a live timeline polls."""
    with k.store.read() as tx:
        e = load_owned(tx, execution_id, None)
        seq = tx.last_event_seq(execution_id)
    return seq, e.status.value
