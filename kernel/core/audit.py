"""The durable decision record (docs/audit.md): building a row for each decision event, reading
them back with filters and keyset paging, and their own retention.

`list_decisions` is the one query the API route (`GET /v0/decisions`) and the operator console
call; `decision_json` is the one rendering of a record.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kernel.clock import rfc3339
from kernel.core import cursor
from kernel.core.kernel import Kernel
from kernel.core.retention import delete_in_batches
from kernel.domain import Approval, Decision, DecisionOutcome, DecisionRecord, Execution
from kernel.errors import invalid
from kernel.ids import new_uuid7
from kernel.text import check_text

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
        judge=d.judge_record,
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
        policy_kind=a.policy_kind or "", policy_revision=a.policy_revision or "", policy_hash=a.policy_hash or "",
        decided_by=decided_by,
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
    judged: bool | None = None  # only judge rules' records (True) or only the others (False); list only
    since: datetime | None = None
    until: datetime | None = None
    cursor: str | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class DecisionPage:
    decisions: list[DecisionRecord] = field(default_factory=list)
    next_cursor: str | None = None  # None on the last page


def encode_cursor(r: DecisionRecord) -> str:
    return cursor.encode_cursor(r.decided_at, r.id)


def decode_cursor(text: str) -> tuple[datetime, str]:
    """(decided_at, id) from an opaque cursor; ValidationError when it is not one of ours."""
    return cursor.decode_cursor(text, "a decisions cursor")


def list_decisions(k: Kernel, q: DecisionQuery) -> DecisionPage:
    """One page of decision records, newest first, answered from an index led by the filtered
    column (or by decided_at without one)."""
    if not 1 <= q.limit <= MAX_PAGE:
        raise invalid(f"limit must be 1-{MAX_PAGE}")
    if q.decision is not None and q.decision not in DecisionOutcome._value2member_map_:
        allowed = ", ".join(DecisionOutcome)
        raise invalid(f"decision must be one of {allowed}")
    filters = _filters(q)
    before = decode_cursor(q.cursor) if q.cursor else None
    with k.store.read() as tx:
        rows = tx.list_decisions(filters, since=q.since, until=q.until, before=before, limit=q.limit + 1,
                                 judged=q.judged)
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    return DecisionPage(rows, encode_cursor(rows[-1]) if more and rows else None)


# -- the chart: counts per outcome over time -------------------------------------------------------
HOUR = timedelta(hours=1)
# An hour is rolled up once it ended this long ago: a decision stamped just before the hour ended
# may still be committing, or come from a replica whose clock runs a little behind.
ROLLUP_GRACE = timedelta(minutes=5)
ROLLUP_CHUNK_HOURS = 168  # hours counted per pass when filling the rollup (one week)
MAX_BUCKETS = 36  # so a day is drawn in hours (24 bars), two in 2-hour bars
# Bucket widths the chart picks from: the narrowest that draws the range in MAX_BUCKETS bars.
_WIDTHS = tuple(timedelta(minutes=m) for m in (1, 5, 15, 30)) + tuple(
    timedelta(hours=h) for h in (1, 2, 3, 6, 12, 24, 48, 168, 720))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LAST = datetime(9000, 1, 1, tzinfo=UTC)
_ROLLUP_FILTERS = frozenset(("agent_id", "decision", "rule_id", "policy_hash"))
_ROLLUP_LOCK = "decision-rollup"  # serialises fillers across replicas (an advisory lock on PostgreSQL)


def _floor(t: datetime, width: timedelta) -> datetime:
    return _EPOCH + ((t - _EPOCH) // width) * width


def _ceil(t: datetime, width: timedelta) -> datetime:
    f = _floor(t, width)
    return f if f == t else f + width


def default_range(now: datetime) -> tuple[datetime, datetime]:
    """The chart's range when none is asked for: the 24 whole hours ending with the current one."""
    until = _floor(now, HOUR) + HOUR
    return until - timedelta(hours=24), until


def bucket_edges(since: datetime, until: datetime) -> tuple[list[datetime], timedelta]:
    """The chart's bucket edges over [since, until) and their width: edges inside the range are
    multiples of the width (from the Unix epoch, UTC), so the first and last buckets may be
    partial; with a width of an hour or more every inner edge is a whole hour."""
    span = until - since
    width = next((w for w in _WIDTHS if span / w <= MAX_BUCKETS), None)
    if width is None:
        width = timedelta(days=-(-span.days // MAX_BUCKETS) or 1)
    edges = [since]
    e = _floor(since, width) + width
    while e < until:
        edges.append(e)
        e += width
    edges.append(until)
    return edges, width


@dataclass(frozen=True, slots=True)
class DecisionCounts:
    """Decisions per outcome in time buckets, oldest first: the audit chart. Bucket i is
    [edges[i], edges[i+1]); inner edges are `width` apart."""

    edges: list[datetime]
    width: timedelta
    buckets: list[dict[str, int]]  # outcome → count
    rolled_up_hours: int = 0  # whole hours answered from decision_rollup rather than the records

    @property
    def since(self) -> datetime:
        return self.edges[0]


def _filters(q: DecisionQuery) -> dict[str, str]:
    """The query's column filters; a 400 for a value no record can hold (NUL, a lone surrogate),
    which PostgreSQL would refuse to compare and SQLite would simply not match."""
    return {name: check_text(value, name) for name in ("agent_id", "decision", "rule_id", "target", "policy_hash",
                                                      "execution_id")
            if (value := getattr(q, name)) is not None}


def _rollable(k: Kernel, first: datetime, last: datetime) -> tuple[datetime, datetime]:
    """[first, last) narrowed to the whole hours that may be rolled up now: closed for
    ROLLUP_GRACE, not reaching back before the retention cutoff (those lose records), nor before
    the oldest record's hour (so a range asked from year 1 marks no empty hours before it)."""
    now = k.clock.now()
    first = _ceil(first, HOUR)
    if k.decision_retention > 0:
        first = max(first, _ceil(now - timedelta(seconds=k.decision_retention), HOUR))
    last = min(_floor(last, HOUR), _floor(now - ROLLUP_GRACE, HOUR))
    if first < last:
        with k.store.read() as tx:
            oldest = tx.oldest_decision_at()
        first = last if oldest is None else max(first, _floor(oldest, HOUR))
    return first, last


def roll_up_decisions(k: Kernel, first: datetime, last: datetime) -> int:
    """Fill decision_rollup for the closed hours in [first, last) it does not hold yet; returns
    how many hours were filled. Counting reads a snapshot (no writer is held up on SQLite while
    it scans); storing re-checks under a lock, so two replicas never store one hour twice."""
    first, last = _rollable(k, first, last)
    if first >= last:
        return 0
    with k.store.read() as tx:
        held = tx.rollup_hours(first, last)
    hours = [first + i * HOUR for i in range((last - first) // HOUR)]
    missing = [h for h in hours if h not in held]
    runs: list[list[datetime]] = []
    for h in missing:
        if runs and h - runs[-1][-1] == HOUR and len(runs[-1]) < ROLLUP_CHUNK_HOURS:
            runs[-1].append(h)
        else:
            runs.append([h])
    filled = 0
    for run in runs:
        with k.store.read() as tx:
            counts = tx.count_hours_for_rollup(run)
        with k.store.transaction(lock=_ROLLUP_LOCK) as tx:
            again = tx.rollup_hours(run[0], run[-1] + HOUR)
            todo = [h for h in run if h not in again]
            if todo:
                keep = set(todo)
                tx.insert_rollup(todo, [c for c in counts if c[0] in keep], k.clock.now())
        filled += len(todo)
    return filled


def roll_up_recent(k: Kernel, hours: int = 48) -> int:
    """The cleanup sweep's share: the last `hours` closed hours, so the default chart never waits."""
    now = k.clock.now()
    return roll_up_decisions(k, _floor(now, HOUR) - timedelta(hours=hours), now)


def count_decisions(k: Kernel, q: DecisionQuery, since: datetime, until: datetime) -> DecisionCounts:
    """The records matching `q`'s filters (not its own time range or cursor) decided in
    [since, until), counted by outcome in the buckets of `bucket_edges`.

    With buckets of an hour or more and filters the rollup keeps counts by (agent, decision,
    rule, bundle), the closed whole hours are summed from decision_rollup (filled first where it
    has gaps) and only the rest, the open hour and any partial hour at either end, is counted
    from the records' time index: the cost follows the number of hours drawn, not of decisions."""
    if until <= since:
        raise invalid("the time range is empty (from must be before to)")
    since, until = max(since, _EPOCH), min(until, _LAST)  # no record is older, and edges stay in range
    if until <= since:
        raise invalid("the time range holds no decisions (it ends before 1970)")
    edges, width = bucket_edges(since, until)
    filters = _filters(q)
    out: list[dict[str, int]] = [{} for _ in range(len(edges) - 1)]

    def add(i: int, decision: str, n: int) -> None:
        out[i][decision] = out[i].get(decision, 0) + n

    live = [(since, until)]
    held = 0
    if width >= HOUR and _ROLLUP_FILTERS.issuperset(filters):
        first, last = _rollable(k, since, until)
        if first < last:
            roll_up_decisions(k, first, last)
            with k.store.read() as tx:
                for hour, decision, n in tx.sum_rollup(filters, first, last):
                    add(bisect.bisect_right(edges, hour) - 1, decision, n)
            live = [(since, first), (last, until)]
            held = (last - first) // HOUR
    with k.store.read() as tx:
        for lo, hi in live:
            if lo >= hi:
                continue
            offset = bisect.bisect_right(edges, lo) - 1
            sub = [lo, *(e for e in edges if lo < e < hi), hi]
            for bucket, decision, n in tx.count_decisions(filters, sub):
                add(offset + bucket, decision, n)
    return DecisionCounts(edges, width, out, held)


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
    if r.judge is not None:
        out["judge"] = r.judge
    return out


# -- the journal's cleanup -------------------------------------------------------------------------
def flush_decision_journal(k: Kernel, batch: int = 1000) -> int:
    """Move the journal's records into the indexed decisions table, in bounded batches (oldest
    first). Reads see every record either way; this keeps the journal small. Returns how many."""
    total = 0
    for _ in range(_MAX_BATCHES):
        with k.store.transaction() as tx:
            n = tx.flush_decision_journal(batch)
        total += n
        if n < batch:
            break
    return total


# -- retention -------------------------------------------------------------------------------------
def delete_expired_decisions(k: Kernel, batch: int = 1000) -> int:
    """Delete decision records older than now − `decision_retention` (0 keeps them for ever), in
    bounded batches; independent of the executions' retention."""
    if k.decision_retention <= 0:
        return 0
    cutoff = k.clock.now() - timedelta(seconds=k.decision_retention)
    with k.store.transaction(lock=_ROLLUP_LOCK) as tx:
        tx.delete_rollup_before(cutoff)  # an hour that loses records is counted from them again
    return delete_in_batches(k, lambda tx, before, n: tx.delete_decisions_before(before, n), cutoff, batch)
