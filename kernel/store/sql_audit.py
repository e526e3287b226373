"""`Tx`'s queries on the audit record: the decision records (written with their event into the
journal, moved in batches into the indexed decisions table, read from both by `GET /v0/decisions`
and the console, pruned by their own retention) and bundle revisions by content hash. Mixed into
`Tx` (sql.py), which supplies `conn` and `w`.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Table,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
    select,
    tuple_,
    union_all,
)

from kernel.domain import DecisionOutcome, DecisionRecord
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.dialect import TxPart
from kernel.store.statements import DECISION_COLUMNS

# The filters `list_decisions` takes, each an equality on its indexed column.
DECISION_FILTERS = ("agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id")
# The ones decision_rollup keeps its counts by (target and execution are too many to count by).
ROLLUP_FILTERS = ("agent_id", "decision", "rule_id", "policy_hash")


def content_hash(content: str) -> str:
    """A bundle revision's `policy_hash`: SHA-256 of its stored canonical text (the YAML file, or the
    Rego bundle's sorted JSON mapping of modules, data and manifest)."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def decision_params(r: DecisionRecord) -> dict[str, Any]:
    return {
        "id": r.id, "agent_id": r.agent_id, "execution_id": r.execution_id, "step_id": r.step_id,
        "kind": r.kind, "target": r.target, "decision": r.decision.value, "rule_id": r.rule_id,
        "reason": r.reason, "policy_kind": r.policy_kind, "policy_revision": r.policy_revision,
        "policy_hash": r.policy_hash, "decided_by": r.decided_by, "credential": r.credential,
        "event_seq": r.event_seq, "decided_at": r.decided_at, "judge": codec.dumps_or_none(r.judge),
    }


def to_decision(r: Any) -> DecisionRecord:
    return DecisionRecord(
        id=r.id, agent_id=r.agent_id, execution_id=r.execution_id, step_id=r.step_id, kind=r.kind,
        target=r.target, decision=DecisionOutcome(r.decision), rule_id=r.rule_id, decided_at=r.decided_at,
        reason=r.reason, policy_kind=r.policy_kind, policy_revision=r.policy_revision,
        policy_hash=r.policy_hash, decided_by=r.decided_by, credential=r.credential,
        event_seq=r.event_seq, judge=codec.loads(r.judge),
    )


def _bucket(table: Table, edges: list[datetime]) -> Any:
    """The index i of [edges[i], edges[i+1]) holding decided_at: a nested CASE, log2 comparisons."""
    c = table.c

    def between(lo: int, hi: int) -> Any:
        if hi - lo == 1:
            return literal_column(str(lo))
        mid = (lo + hi) // 2
        edge = bindparam(f"edge_{mid}", edges[mid], type_=t.UTCDateTime())
        return case((c.decided_at < edge, between(lo, mid)), else_=between(mid, hi))

    return between(0, len(edges) - 1)


def _filtered(table: Table, q: Any, filters: dict[str, str], edges: list[datetime]) -> Any:
    c = table.c
    q = q.where(*_where(table, filters, None, None))
    return q.where(c.decided_at >= bindparam("edge_first", edges[0], type_=t.UTCDateTime()),
                   c.decided_at < bindparam("edge_last", edges[-1], type_=t.UTCDateTime()))


def _where(
    table: Table, filters: dict[str, str], since: datetime | None, until: datetime | None,
    judged: bool | None = None,
) -> list[Any]:
    c = table.c
    out: list[Any] = []
    if judged is not None:  # `IS NOT NULL` spelled as the partial index ix_decisions_judged says it
        out.append(c.judge.isnot(None) if judged else c.judge.is_(None))
    for name, value in filters.items():
        if name not in DECISION_FILTERS:
            raise ValueError(f"not a decision filter: {name}")
        out.append(c[name] == value)
    if since is not None:
        out.append(c.decided_at >= since)
    if until is not None:
        out.append(c.decided_at < until)
    return out


_FLUSH: dict[tuple[str, int], tuple[Any, ...]] = {}


def _flush_statements(dialect: str, limit: int) -> tuple[Any, ...]:
    """The journal flush's statements, built once per (dialect, batch size). SQLAlchemy memoizes a
    statement's cache key on the object, so statements rebuilt every second recomputed the key of
    a 16-column CTE every time: an empty flush on PostgreSQL cost 1.2–1.6 ms of CPU, 0.23–0.35 ms
    with the statements kept (in process, 300 flushes; bench/journal/2026-12-05-peer-and-scale.md)."""
    got = _FLUSH.get((dialect, limit))
    if got is not None:
        return got
    j = t.decision_journal
    cols = [j.c[n] for n in DECISION_COLUMNS]
    oldest = select(j.c.seq).order_by(j.c.seq).limit(limit).subquery()
    if dialect == "postgresql":
        moved = delete(j).where(j.c.seq.in_(select(oldest.c.seq))).returning(*cols).cte("moved")
        stmt = insert(t.decisions).from_select(list(DECISION_COLUMNS), select(*(moved.c[n] for n in DECISION_COLUMNS)))
        got = (stmt.returning(t.decisions.c.id),)
    else:
        last = bindparam("last", type_=BigInteger())
        got = (select(func.max(oldest.c.seq)),
               insert(t.decisions).from_select(list(DECISION_COLUMNS), select(*cols).where(j.c.seq <= last)),
               delete(j).where(j.c.seq <= last))
    _FLUSH[(dialect, limit)] = got
    return got


class AuditQueries(TxPart):
    # -- decisions ------------------------------------------------------------------------
    def list_decisions(
        self,
        filters: dict[str, str],
        *,
        since: datetime | None,
        until: datetime | None,
        before: tuple[datetime, str] | None,
        limit: int,
        judged: bool | None = None,
    ) -> list[DecisionRecord]:
        """Newest first on (decided_at, id). `filters`: column → value, for the columns in
        DECISION_FILTERS; `since` inclusive, `until` exclusive; `before`: the keyset cursor, the
        (decided_at, id) of the last row of the previous page; `judged`: only the records of a
        judge rule (True, from the partial index ix_decisions_judged), or only the others (False).

        One statement over both tables: the page of `decisions` answered from the index led by the
        filtered column, and the same page of the journal (small: one flush interval's records),
        merged."""
        parts = []
        for table in (t.decisions, t.decision_journal):
            c = table.c
            q = select(*(c[name] for name in DECISION_COLUMNS)).where(*_where(table, filters, since, until, judged))
            if before is not None:
                at = bindparam("before_at", before[0], type_=t.UTCDateTime())
                q = q.where(tuple_(c.decided_at, c.id) < tuple_(at, bindparam("before_id", before[1])))
            parts.append(select(q.order_by(c.decided_at.desc(), c.id.desc()).limit(limit).subquery()))
        both = union_all(*parts).subquery()
        q = select(both).order_by(both.c.decided_at.desc(), both.c.id.desc()).limit(limit)
        return [to_decision(r) for r in self.conn.execute(q).all()]

    def count_decisions(self, filters: dict[str, str], edges: list[datetime]) -> list[tuple[int, str, int]]:
        """(bucket, decision, count) of the records in [edges[0], edges[-1]), bucket i being
        [edges[i], edges[i+1]). The bucket is a nested CASE (log2 comparisons a row), so one
        pass over the index range answers the whole chart on either dialect (and one over the
        journal's few rows)."""
        totals: dict[tuple[int, str], int] = {}
        for table in (t.decisions, t.decision_journal):
            c = table.c
            q = _filtered(table, select(_bucket(table, edges).label("bucket"), c.decision.label("decision")),
                          filters, edges)
            sub = q.subquery()
            grouped = select(sub.c.bucket, sub.c.decision, func.count()).group_by(sub.c.bucket, sub.c.decision)
            for b, d, n in self.conn.execute(grouped).all():
                totals[(int(b), str(d))] = totals.get((int(b), str(d)), 0) + int(n)
        return [(b, d, n) for (b, d), n in totals.items()]

    # -- the chart's hourly counts (decision_rollup) ----------------------------------------
    def rollup_hours(self, first: datetime, last: datetime) -> set[datetime]:
        """The hours in [first, last) that decision_rollup holds."""
        c = t.decision_rollup_hours.c
        q = select(c.hour).where(c.hour >= first, c.hour < last)
        return {r[0] for r in self.conn.execute(q).all()}

    def oldest_decision_at(self) -> datetime | None:
        """When the oldest record was decided (the time index's first entry; the journal's few)."""
        found = [self.conn.execute(select(func.min(table.c.decided_at))).scalar()
                 for table in (t.decisions, t.decision_journal)]
        return min((f for f in found if f is not None), default=None)

    def count_hours_for_rollup(self, hours: list[datetime]) -> list[tuple[datetime, str, str, str, str, int]]:
        """(hour, agent_id, decision, rule_id, policy_hash, count) of the records in the
        contiguous run of whole hours `hours` (one pass over the time index)."""
        edges = [*hours, hours[-1] + timedelta(hours=1)]
        totals: dict[tuple[datetime, str, str, str, str], int] = {}
        for table in (t.decisions, t.decision_journal):  # the journal: records not yet moved
            c = table.c
            q = _filtered(table, select(_bucket(table, edges).label("bucket"), c.agent_id, c.decision, c.rule_id,
                                        c.policy_hash), {}, edges)
            sub = q.subquery()
            grouped = select(sub.c.bucket, sub.c.agent_id, sub.c.decision, sub.c.rule_id, sub.c.policy_hash,
                             func.count()).group_by(sub.c.bucket, sub.c.agent_id, sub.c.decision, sub.c.rule_id,
                                                    sub.c.policy_hash)
            for b, a, d, r, h, n in self.conn.execute(grouped).all():
                key = (hours[int(b)], str(a), str(d), str(r), str(h))
                totals[key] = totals.get(key, 0) + int(n)
        return [(*key, n) for key, n in totals.items()]

    def insert_rollup(self, hours: list[datetime], counts: list[tuple[datetime, str, str, str, str, int]],
                      now: datetime) -> None:
        """Store the counts of `hours` (none of which the rollup holds yet) and mark them held."""
        if counts:
            self.w.execute(t.decision_rollup.insert(), [
                {"hour": h, "agent_id": a, "decision": d, "rule_id": r, "policy_hash": ph, "count": n}
                for h, a, d, r, ph, n in counts])
        self.w.execute(t.decision_rollup_hours.insert(), [{"hour": h, "rolled_up_at": now} for h in hours])

    def sum_rollup(self, filters: dict[str, str], first: datetime, last: datetime) -> list[tuple[datetime, str, int]]:
        """(hour, decision, count) summed over the held hours in [first, last) for `filters` on
        agent_id, decision, rule_id, policy_hash."""
        c = t.decision_rollup.c
        q = select(c.hour, c.decision, func.sum(c.count)).where(c.hour >= first, c.hour < last)
        for name, value in filters.items():
            if name not in ROLLUP_FILTERS:
                raise ValueError(f"not a rollup filter: {name}")
            q = q.where(c[name] == value)
        q = q.group_by(c.hour, c.decision)
        return [(h, str(d), int(n)) for h, d, n in self.conn.execute(q).all()]

    def delete_rollup_before(self, cutoff: datetime) -> int:
        """Forget the hours that start before `cutoff` (retention deleted some of their records)."""
        n = int(self.w.execute(delete(t.decision_rollup_hours).where(t.decision_rollup_hours.c.hour < cutoff)).rowcount)
        self.w.execute(delete(t.decision_rollup).where(t.decision_rollup.c.hour < cutoff))
        return n

    def flush_decision_journal(self, limit: int) -> int:
        """Move up to `limit` of the oldest journal rows into `decisions`, in SQL (no row passes
        through Python); returns how many.

        PostgreSQL: one statement, `WITH moved AS (DELETE … RETURNING) INSERT … SELECT FROM moved`,
        so the rows inserted are exactly the rows deleted even under READ COMMITTED while steps
        keep appending. SQLite: INSERT … SELECT then DELETE of the same seq range, which no other
        writer can change in between (the transaction holds the database write lock)."""
        if self.w.dialect.name == "postgresql":
            (move,) = _flush_statements("postgresql", limit)
            return len(self.w.execute(move).all())  # rowcount is -1 here
        newest, copy, drop = _flush_statements("sqlite", limit)
        last = self.w.execute(newest).scalar()
        if last is None:
            return 0
        self.w.execute(copy, {"last": last})
        return int(self.w.execute(drop, {"last": last}).rowcount)

    def delete_decisions_before(self, cutoff: datetime, limit: int) -> int:
        """Retention of the decision records: up to `limit` rows decided before `cutoff`, oldest
        first (journal rows that old, left by a cleanup that has not run, go too)."""
        total = 0
        for table in (t.decisions, t.decision_journal):
            c = table.c
            ids = select(c.id).where(c.decided_at < cutoff).order_by(c.decided_at).limit(limit - total)
            total += int(self.w.execute(delete(table).where(c.id.in_(ids.scalar_subquery()))).rowcount)
            if total >= limit:
                break
        return total

    # -- bundle revisions by content ------------------------------------------------------
    def policy_hashes_of_revision(self, revision: str, agent_id: str | None) -> list[str]:
        """The content hashes stored under a revision name (of one agent, or of any); a small
        table, read without an index of its own."""
        return self._policy_hashes(t.policy_revisions.c.revision == revision, agent_id)

    def policy_hashes_with_prefix(self, prefix: str, agent_id: str | None) -> list[str]:
        """The stored content hashes that start with `prefix` (the first characters the console
        shows of a hash), of one agent or of any."""
        return self._policy_hashes(t.policy_revisions.c.content_hash.startswith(prefix, autoescape=True), agent_id)

    def _policy_hashes(self, where: Any, agent_id: str | None) -> list[str]:
        c = t.policy_revisions.c
        q = select(c.content_hash).where(where).distinct()
        if agent_id is not None:
            q = q.where(c.agent_id == agent_id)
        return sorted(str(r[0]) for r in self.conn.execute(q).all())

    def policy_revision_by_hash(self, agent_id: str, content_hash: str) -> Any:
        c = t.policy_revisions.c
        return self.conn.execute(
            select(t.policy_revisions)
            .where(c.agent_id == agent_id, c.content_hash == content_hash)
            .order_by(c.seq.desc())
            .limit(1)
        ).first()


__all__ = ["DECISION_FILTERS", "ROLLUP_FILTERS", "AuditQueries", "content_hash", "decision_params", "to_decision"]
