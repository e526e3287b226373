"""The durable decision record (docs/audit.md): building a row for each decision event, reading
them back with filters and keyset paging, and their own retention.

`list_decisions` is the one query the API route (`GET /v0/decisions`) and the operator console
call; `decision_json` is the one rendering of a record.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kernel.clock import rfc3339
from kernel.core.kernel import Kernel
from kernel.domain import Approval, Decision, DecisionOutcome, DecisionRecord, Execution
from kernel.errors import ValidationError
from kernel.identity import new_uuid7

MAX_PAGE = 500
_MAX_BATCHES = 100  # a retention pass deletes at most this many batches; the next tick goes on


# -- building records (inside the use case's transaction) ------------------------------------------
def policy_record(
    e: Execution, step_id: str, kind: str, target: str, outcome: DecisionOutcome, d: Decision,
    now: datetime, *, reason: str | None = None,
) -> DecisionRecord:
    """The record of a policy decision on a new step (allowed, denied, awaiting_approval,
    rate_limited). `reason` overrides the decision's own (a rate-limit refusal says why)."""
    return DecisionRecord(
        id=new_uuid7(), agent_id=e.agent_id, execution_id=e.id, step_id=step_id, kind=kind, target=target,
        decision=outcome, rule_id=d.rule_id, decided_at=now, reason=reason if reason is not None else (d.reason or None),
        policy_kind=d.policy_kind.value, policy_revision=d.policy_revision, policy_hash=d.policy_hash,
    )


def approval_record(
    a: Approval, outcome: DecisionOutcome, now: datetime, *, agent_id: str, kind: str, target: str,
    decided_by: str | None, credential: str | None, reason: str | None,
) -> DecisionRecord:
    """The record of a person's (or the expiry sweep's) answer to an approval; the rule id and
    bundle hash are those of the decision that asked for it."""
    return DecisionRecord(
        id=new_uuid7(), agent_id=agent_id, execution_id=a.execution_id, step_id=a.step_id, kind=kind,
        target=target, decision=outcome, rule_id=a.rule_id or "", decided_at=now, reason=reason,
        policy_kind="", policy_revision="", policy_hash=a.policy_hash or "", decided_by=decided_by,
        credential=credential,
    )


# -- reading ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DecisionQuery:
    """Filters for `list_decisions`; every one is optional and they combine with AND.

    `since` is inclusive and `until` exclusive (on `decided_at`); `cursor` is the `next_cursor`
    of the previous page; `limit` is 1..MAX_PAGE."""

    agent_id: str | None = None
    decision: str | None = None
    rule_id: str | None = None
    target: str | None = None
    policy_hash: str | None = None
    execution_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    cursor: str | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class DecisionPage:
    decisions: list[DecisionRecord] = field(default_factory=list)
    next_cursor: str | None = None  # None on the last page


def encode_cursor(r: DecisionRecord) -> str:
    raw = f"{r.decided_at.isoformat()}|{r.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """(decided_at, id) from an opaque cursor; ValidationError when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, rid = raw.partition("|")
        when = datetime.fromisoformat(at)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationError("validation error: cursor is not a decisions cursor") from None
    if when.tzinfo is None or not rid or len(rid) > 36:
        raise ValidationError("validation error: cursor is not a decisions cursor")
    return when, rid


def list_decisions(k: Kernel, q: DecisionQuery) -> DecisionPage:
    """One page of decision records, newest first, answered from an index led by the filtered
    column (or by decided_at without one)."""
    if not 1 <= q.limit <= MAX_PAGE:
        raise ValidationError(f"validation error: limit must be 1-{MAX_PAGE}")
    if q.decision is not None and q.decision not in DecisionOutcome._value2member_map_:
        allowed = ", ".join(DecisionOutcome)
        raise ValidationError(f"validation error: decision must be one of {allowed}")
    filters = {name: value for name in ("agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id")
               if (value := getattr(q, name)) is not None}
    before = decode_cursor(q.cursor) if q.cursor else None
    with k.store.read() as tx:
        rows = tx.list_decisions(filters, since=q.since, until=q.until, before=before, limit=q.limit + 1)
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    return DecisionPage(rows, encode_cursor(rows[-1]) if more and rows else None)


@dataclass(frozen=True, slots=True)
class DecisionCounts:
    """Decisions per outcome in equal time buckets, oldest first: the audit chart."""

    since: datetime
    width: timedelta
    buckets: list[dict[str, int]]  # outcome → count


def count_decisions(k: Kernel, q: DecisionQuery, since: datetime, until: datetime, buckets: int) -> DecisionCounts:
    """The records matching `q`'s filters (not its own time range or cursor) decided in
    [since, until), counted by outcome in `buckets` (1-200) equal slices, in one grouped query."""
    if until <= since:
        raise ValidationError("validation error: the time range is empty (from must be before to)")
    n = max(1, min(buckets, 200))
    width = (until - since) / n
    filters = {name: value for name in ("agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id")
               if (value := getattr(q, name)) is not None}
    with k.store.read() as tx:
        rows = tx.count_decisions(filters, [since + i * width for i in range(n)] + [until])
    out: list[dict[str, int]] = [{} for _ in range(n)]
    for bucket, decision, count in rows:
        out[int(bucket)][str(decision)] = int(count)
    return DecisionCounts(since, width, out)


def decision_json(r: DecisionRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": r.id,
        "agent_id": r.agent_id,
        "execution_id": r.execution_id,
        "step_id": r.step_id,
        "kind": r.kind,
        "target": r.target,
        "decision": r.decision.value,
        "rule_id": r.rule_id,
        "decided_at": rfc3339(r.decided_at),
    }
    for key in ("reason", "policy_kind", "policy_revision", "policy_hash", "decided_by", "credential"):
        value = getattr(r, key)
        if value:
            out[key] = value
    if r.event_seq is not None:
        out["event_seq"] = r.event_seq
    return out


# -- retention -------------------------------------------------------------------------------------
def delete_expired_decisions(k: Kernel, batch: int = 1000) -> int:
    """Delete decision records older than now − `decision_retention` (0 keeps them for ever), in
    bounded batches; independent of the executions' retention."""
    if k.decision_retention <= 0:
        return 0
    cutoff = k.clock.now() - timedelta(seconds=k.decision_retention)
    total = 0
    for _ in range(_MAX_BATCHES):
        with k.store.transaction() as tx:
            n = tx.delete_decisions_before(cutoff, batch)
        total += n
        if n < batch:
            break
    return total
