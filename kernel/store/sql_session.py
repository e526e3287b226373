"""`Tx`'s queries for sessions, the sub-agent tree, forks and resources. Mixed into `Tx` (sql.py),
which supplies `store`, `conn` and `w`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, func, insert, select, true, update

from kernel.domain import Execution, ExecutionStatus
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.dialect import TxPart
from kernel.store.statements import TERMINAL_EXECUTIONS

_LIVE = (ExecutionStatus.RUNNING.value, ExecutionStatus.BLOCKED.value)
_WAITING = (ExecutionStatus.PENDING.value, *_LIVE)


class SessionQueries(TxPart):
    # -- sessions -------------------------------------------------------------------------
    def session_occupied(self, session: str) -> bool:
        """Whether the session has an execution running, blocked or already queued (a new one
        queues behind the queued ones, so admission stays in creation order)."""
        c = t.executions.c
        q = select(c.id).where(c.session == session, c.status.in_(_WAITING)).limit(1)
        return self.conn.execute(q).first() is not None

    def session_live(self, session: str) -> str | None:
        """The session's running or blocked execution, if any (there is at most one)."""
        c = t.executions.c
        q = select(c.id).where(c.session == session, c.status.in_(_LIVE)).limit(1)
        r = self.conn.execute(q).first()
        return None if r is None else str(r[0])

    def oldest_pending(self, session: str) -> str | None:
        c = t.executions.c
        q = (select(c.id).where(c.session == session, c.status == ExecutionStatus.PENDING.value)
             .order_by(c.id).limit(1))
        r = self.conn.execute(q).first()
        return None if r is None else str(r[0])

    def latest_completed(self, session: str, agent_id: str, before_id: str) -> str | None:
        """The agent's most recently created completed execution in the session, older than
        `before_id` (ids are UUIDv7: creation order)."""
        c = t.executions.c
        q = (select(c.id)
             .where(c.session == session, c.agent_id == agent_id, c.id < before_id,
                    c.status == ExecutionStatus.COMPLETED.value)
             .order_by(c.id.desc()).limit(1))
        r = self.conn.execute(q).first()
        return None if r is None else str(r[0])

    def admit(self, execution_id: str, now: datetime, previous: str | None) -> bool:
        """pending → running, only if still pending (a cancel may have won the race)."""
        c = t.executions.c
        res = self.w.execute(
            update(t.executions)
            .where(c.id == execution_id, c.status == ExecutionStatus.PENDING.value)
            .values(status=ExecutionStatus.RUNNING.value, previous_execution_id=previous, updated_at=now)
        )
        return bool(res.rowcount)

    def stalled_sessions(self, limit: int) -> list[str]:
        """Sessions with queued executions and none running or blocked (the admission after the
        last one ended did not happen: a crash between the two transactions)."""
        e, live = t.executions.c, t.executions.alias("live").c
        q = (
            select(e.session)
            .where(e.session.is_not(None), e.status == ExecutionStatus.PENDING.value,
                   ~exists().where(and_(live.session == e.session, live.status.in_(_LIVE))))
            .group_by(e.session)
            .limit(limit)
        )
        return [str(r[0]) for r in self.conn.execute(q).all()]

    def session_usage(self, session: str) -> tuple[int, int]:
        """The token meter of a whole session: its executions' meters summed."""
        c = t.executions.c
        r = self.conn.execute(
            select(func.coalesce(func.sum(c.usage_input), 0), func.coalesce(func.sum(c.usage_output), 0))
            .where(c.session == session)
        ).first()
        return (int(r[0]), int(r[1])) if r else (0, 0)

    # -- the sub-agent tree ---------------------------------------------------------------
    def children(self, parent_id: str) -> list[Execution]:
        c = t.executions.c
        q = select(t.executions).where(c.parent_execution_id == parent_id).order_by(c.id)
        return [codec.to_execution(r) for r in self.conn.execute(q).all()]

    def children_ids(self, parent_ids: Sequence[str]) -> dict[str, list[str]]:
        """parent id → its children's ids, oldest first, for a page of executions."""
        out: dict[str, list[str]] = {p: [] for p in parent_ids}
        if not parent_ids:
            return out
        c = t.executions.c
        q = select(c.parent_execution_id, c.id).where(c.parent_execution_id.in_(list(parent_ids))).order_by(c.id)
        for parent, child in self.conn.execute(q).all():
            out[str(parent)].append(str(child))
        return out

    def live_children(self, parent_id: str) -> int:
        c = t.executions.c
        q = select(func.count()).select_from(t.executions).where(
            c.parent_execution_id == parent_id, c.status.not_in(TERMINAL_EXECUTIONS))
        return int(self.conn.execute(q).scalar_one())

    def suspended_parents_ready(self, limit: int) -> list[str]:
        """Suspended executions none of whose children are still live (their resume was missed)."""
        p, ch = t.executions.c, t.executions.alias("ch").c
        # `= true`, not `IS TRUE`: PostgreSQL answers only the former from ix_executions_suspended,
        # so a pass reads the few suspended rows, not every live one (10^5 parked: 40 ms a pass).
        q = (
            select(p.id)
            .where(p.suspended == true(), p.status.not_in(TERMINAL_EXECUTIONS),
                   ~exists().where(and_(ch.parent_execution_id == p.id, ch.status.not_in(TERMINAL_EXECUTIONS))))
            .limit(limit)
        )
        return [str(r[0]) for r in self.conn.execute(q).all()]

    def cancelled_with_live_children(self, limit: int) -> list[str]:
        p, ch = t.executions.c, t.executions.alias("ch").c
        q = (
            select(p.id)
            .where(p.status == ExecutionStatus.CANCELLED.value,
                   exists().where(and_(ch.parent_execution_id == p.id, ch.status.not_in(TERMINAL_EXECUTIONS))))
            .limit(limit)
        )
        return [str(r[0]) for r in self.conn.execute(q).all()]

    # -- forks ----------------------------------------------------------------------------
    def insert_fork_bundle(self, agent_id: str, kind: str, revision: str, content: str, now: datetime) -> int:
        r = self.w.execute(
            insert(t.fork_bundles)
            .values(agent_id=agent_id, kind=kind, revision=revision, content=content, created_at=now)
            .returning(t.fork_bundles.c.id)
        )
        return int(r.scalar_one())

    def fork_bundle_ref(self, bundle_id: int) -> Any:
        """(id, agent_id, kind, revision) of a fork's bundle, the shape of an active-revision ref."""
        c = t.fork_bundles.c
        return self.conn.execute(select(c.id, c.agent_id, c.kind, c.revision).where(c.id == bundle_id)).first()

    def fork_bundle_content(self, bundle_id: int) -> str | None:
        c = t.fork_bundles.c
        v = self.conn.execute(select(c.content).where(c.id == bundle_id)).scalar()
        return None if v is None else str(v)

    def events_upto(self, execution_id: str, at_seq: int) -> list[Any]:
        """The raw event rows (seq, type, payload text, occurred_at) up to `at_seq`, in order."""
        c = t.events.c
        q = (select(c.event_seq, c.type, c.payload, c.occurred_at)
             .where(c.execution_id == execution_id, c.event_seq <= at_seq).order_by(c.event_seq))
        return list(self.conn.execute(q).all())

    def insert_many(self, table: Any, rows: list[dict[str, Any]]) -> None:
        """Bulk insert: one executemany per 1000 rows."""
        for i in range(0, len(rows), 1000):
            self.w.execute(insert(table), rows[i:i + 1000])

    def last_event_seq(self, execution_id: str) -> int:
        c = t.executions.c
        return int(self.conn.execute(select(c.last_event_seq).where(c.id == execution_id)).scalar() or 0)

    def set_last_event_seq(self, execution_id: str, seq: int) -> None:
        self.w.execute(update(t.executions).where(t.executions.c.id == execution_id).values(last_event_seq=seq))
