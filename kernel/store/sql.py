"""The dialect-neutral queries: `Tx` holds every query a use case runs inside one transaction.

`SqlStore` (base.py) opens the transactions; the hot path's statements are prepared once in
statements.py; dialect modules (`sqlite.py`, `postgres.py`) supply the engine, the per-execution
lock, upserts and the dispatch claim.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, func, insert, or_, select, update
from sqlalchemy.engine import Connection

from kernel.domain import (
    Agent,
    Dispatch,
    Execution,
    ExecutionStatus,
    Step,
)
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.dialect import Dialect
from kernel.store.sql_audit import AuditQueries, content_hash
from kernel.store.sql_dispatch import DispatchQueries
from kernel.store.sql_resource import ResourceQueries
from kernel.store.sql_session import SessionQueries
from kernel.store.sql_shadow import ShadowQueries
from kernel.store.sql_steps import StepQueries
from kernel.store.sql_tool_pins import ToolPinQueries
from kernel.store.statements import (
    ACTIVE_POLICY_REF,
    D_COLS,
    E_COLS,
    GET_AGENT,
    GET_EXECUTION,
    OUTCOME_CONTEXT,
    POLICY_CONTENT,
    S_COLS,
    SUBMIT_CONTEXT,
    TERMINAL_EXECUTIONS,
    DRow,
    ERow,
    PolicyRef,
    SRow,
)


class Tx(StepQueries, DispatchQueries, AuditQueries, SessionQueries, ResourceQueries, ShadowQueries,
         ToolPinQueries):
    """One open transaction. Every method is a single round trip or a small batch."""

    def __init__(self, store: Dialect, conn: Connection, escalate: Callable[[], Connection] | None = None,
                 lock_more: Callable[[str], None] | None = None):
        self.store = store
        self._conn = conn
        self._escalate = escalate
        self._lock_more = lock_more
        self._policy_ref: tuple[str, Any] | None = None  # (agent id, its active revision) read ahead

    def lock_execution(self, execution_id: str) -> None:
        """Take one more execution's lock inside this transaction (session admission: the session
        first, then the admitted execution). On SQLite, call it before the first write."""
        if self._lock_more is None:
            raise RuntimeError("this transaction cannot take more locks")
        self._lock_more(execution_id)

    @property
    def conn(self) -> Connection:
        """The connection reads use: the write connection once the transaction has written."""
        return self._conn

    @property
    def w(self) -> Connection:
        """The connection writes use. On SQLite the first write takes the database write lock."""
        if self._escalate is not None:
            self._conn = self._escalate()
            self._escalate = None
        return self._conn

    # -- agents ---------------------------------------------------------------------------
    def get_agent(self, agent_id: str) -> Agent | None:
        r = GET_AGENT.first(self.conn, {"id": agent_id})
        return codec.to_agent(r) if r else None

    def list_agents(self) -> list[Agent]:
        rows = self.conn.execute(select(t.agents).order_by(t.agents.c.id)).all()
        return [codec.to_agent(r) for r in rows]

    def upsert_agent(self, agent: Agent) -> None:
        values = {
            "id": agent.id,
            "webhook_url": agent.webhook_url,
            "secret": agent.secret,
            "lease_timeout_seconds": agent.lease_timeout_seconds,
            "registered_at": agent.registered_at,
            "description": agent.description,
            "input_schema": codec.dumps_or_none(agent.input_schema),
            "output_schema": codec.dumps_or_none(agent.output_schema),
        }
        self.store.upsert(self.w, t.agents, values, key=("id",))

    def update_agent_metadata(self, agent_id: str, description: Any, input_schema: Any, output_schema: Any) -> None:
        self.w.execute(
            update(t.agents)
            .where(t.agents.c.id == agent_id)
            .values(
                description=description,
                input_schema=codec.dumps_or_none(input_schema),
                output_schema=codec.dumps_or_none(output_schema),
            )
        )

    def delete_agent(self, agent_id: str) -> bool:
        return self.w.execute(delete(t.agents).where(t.agents.c.id == agent_id)).rowcount > 0

    def agent_has_executions(self, agent_id: str) -> bool:
        q = select(t.executions.c.id).where(t.executions.c.agent_id == agent_id).limit(1)
        return self.conn.execute(q).first() is not None

    # -- policy revisions -----------------------------------------------------------------
    def add_policy_revision(self, agent_id: str, kind: str, revision: str, content: str, now: datetime) -> int:
        self._policy_ref = None  # what submit_context read ahead no longer holds
        seq = self.w.execute(
            select(func.coalesce(func.max(t.policy_revisions.c.seq), 0)).where(
                t.policy_revisions.c.agent_id == agent_id
            )
        ).scalar_one() + 1
        self.w.execute(
            update(t.policy_revisions)
            .where(t.policy_revisions.c.agent_id == agent_id, t.policy_revisions.c.active.is_(True))
            .values(active=False)
        )
        self.w.execute(
            insert(t.policy_revisions).values(
                agent_id=agent_id, seq=seq, kind=kind, revision=revision, content=content,
                content_hash=content_hash(content), active=True, created_at=now,
            )
        )
        return int(seq)

    def activate_policy_revision(self, agent_id: str, seq: int) -> bool:
        self._policy_ref = None  # what submit_context read ahead no longer holds
        exists = self.conn.execute(
            select(t.policy_revisions.c.id).where(
                t.policy_revisions.c.agent_id == agent_id, t.policy_revisions.c.seq == seq
            )
        ).first()
        if not exists:
            return False
        self.w.execute(
            update(t.policy_revisions)
            .where(t.policy_revisions.c.agent_id == agent_id)
            .values(active=t.policy_revisions.c.seq == seq)
        )
        return True

    def active_policy_ref(self, agent_id: str) -> Any:
        """(id, agent_id, kind, revision, content_hash) of the agent's active revision, without its
        content."""
        ahead = self._policy_ref
        if ahead is not None and ahead[0] == agent_id:
            return ahead[1]
        return ACTIVE_POLICY_REF.first(self.conn, {"agent_id": agent_id})

    def policy_content(self, revision_id: int) -> str | None:
        v = POLICY_CONTENT.scalar(self.conn, {"id": revision_id})
        return None if v is None else str(v)

    def active_policy(self, agent_id: str) -> Any:
        return self.conn.execute(
            select(t.policy_revisions).where(
                t.policy_revisions.c.agent_id == agent_id, t.policy_revisions.c.active.is_(True)
            )
        ).first()

    def list_policy_revisions(self, agent_id: str) -> list[Any]:
        return list(
            self.conn.execute(
                select(t.policy_revisions)
                .where(t.policy_revisions.c.agent_id == agent_id)
                .order_by(t.policy_revisions.c.seq)
            ).all()
        )

    def clear_policy(self, agent_id: str) -> None:
        self._policy_ref = None  # what submit_context read ahead no longer holds
        self.w.execute(
            update(t.policy_revisions)
            .where(t.policy_revisions.c.agent_id == agent_id)
            .values(active=False)
        )

    # -- executions -----------------------------------------------------------------------
    def get_execution(self, execution_id: str) -> Execution | None:
        r = GET_EXECUTION.first(self.conn, {"id": execution_id})
        return codec.to_execution(r) if r else None

    def submit_context(
        self, execution_id: str, dispatch_id: str, kind: str, target: str, args_hash: str
    ) -> tuple[Execution | None, Dispatch | None, int, Step | None]:
        """One read for a submit: the execution, the named dispatch, the occurrence counter of
        (kind, target, args_hash) in that dispatch, and the step the execution recorded at that
        identity and occurrence (the one the call's step id names), if any."""
        r = SUBMIT_CONTEXT.first(
            self.conn,
            {"execution_id": execution_id, "dispatch_id": dispatch_id, "kind": kind, "target": target,
             "args_hash": args_hash},
        )
        if r is None:
            return None, None, 0, None
        ne, nd, ns = len(E_COLS), len(D_COLS), len(S_COLS)
        d, st, pr = r[ne:ne + nd], r[ne + nd + 1:ne + nd + 1 + ns], r[ne + nd + 1 + ns:]
        e = codec.to_execution(ERow._make(r[:ne]), self.store.inputs)
        # The policy decision in this transaction reads it from here (`active_policy_ref`).
        self._policy_ref = (e.agent_id, PolicyRef._make(pr) if pr[0] is not None else None)
        return (
            e,
            codec.to_dispatch(DRow._make(d)) if d[0] is not None else None,
            int(r[ne + nd] or 0),
            codec.to_step(SRow._make(st)) if st[0] is not None else None,
        )

    def outcome_context(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> tuple[Execution | None, Step | None, Dispatch | None]:
        """One read for a step outcome: the execution, the step and the named dispatch."""
        r = OUTCOME_CONTEXT.first(
            self.conn, {"execution_id": execution_id, "dispatch_id": dispatch_id, "step_id": step_id}
        )
        if r is None:
            return None, None, None
        ne, nd = len(E_COLS), len(D_COLS)
        d, st = r[ne:ne + nd], r[ne + nd:]
        return (
            codec.to_execution(ERow._make(r[:ne]), self.store.inputs),
            codec.to_step(SRow._make(st)) if st[0] is not None else None,
            codec.to_dispatch(DRow._make(d)) if d[0] is not None else None,
        )

    def find_execution_by_key(self, agent_id: str, key: str) -> Execution | None:
        r = self.conn.execute(
            select(t.executions).where(
                t.executions.c.agent_id == agent_id, t.executions.c.idempotency_key == key
            )
        ).first()
        return codec.to_execution(r) if r else None

    def insert_execution(self, e: Execution) -> None:
        self.w.execute(
            insert(t.executions).values(
                id=e.id,
                agent_id=e.agent_id,
                input=codec.dumps(e.input),
                status=e.status.value,
                output=None,
                failure_reason=None,
                idempotency_key=e.idempotency_key,
                last_event_seq=0,
                usage_input=0,
                usage_output=0,
                created_at=e.created_at,
                updated_at=e.updated_at,
                deadline_at=e.deadline_at,
                created_by=e.created_by,
                session=e.session,
                parent_execution_id=e.parent_execution_id,
                spawned_step_id=e.spawned_step_id,
                previous_execution_id=e.previous_execution_id,
                state=None,
                forked_from=e.forked_from,
                fork_seq=e.fork_seq,
                fork_bundle_id=e.fork_bundle_id,
                suspended=False,
                restoration=codec.dumps_or_none(e.restoration),
            )
        )

    def list_executions(
        self, agent_id: str | None, status: str | None, cursor: str | None, limit: int,
        created_from: datetime | None = None, created_to: datetime | None = None,
        session: str | None = None, parent: str | None = None, newer_than: str | None = None,
        id_prefix: str | None = None,
    ) -> list[Execution]:
        """Newest first (ids are time-ordered), after `cursor`; or, with `newer_than`, the `limit`
        executions just newer than it (still newest first). `id_prefix` (lowercase hex and
        hyphens) is read as a range on the primary key, then matched exactly."""
        q = select(t.executions)
        if agent_id is not None:
            q = q.where(t.executions.c.agent_id == agent_id)
        if status is not None:
            q = q.where(t.executions.c.status == status)
        if session is not None:
            q = q.where(t.executions.c.session == session)
        if parent is not None:
            q = q.where(t.executions.c.parent_execution_id == parent)
        if cursor is not None:
            q = q.where(t.executions.c.id < cursor)
        if created_from is not None:
            q = q.where(t.executions.c.created_at >= created_from)
        if created_to is not None:
            q = q.where(t.executions.c.created_at < created_to)
        if id_prefix:
            q = q.where(t.executions.c.id >= id_prefix, t.executions.c.id.startswith(id_prefix, autoescape=True))
            if (bound := _successor(id_prefix)) is not None:
                q = q.where(t.executions.c.id < bound)
        if newer_than is not None:
            q = q.where(t.executions.c.id > newer_than).order_by(t.executions.c.id).limit(limit)
            return [codec.to_execution(r) for r in self.conn.execute(q).all()][::-1]
        q = q.order_by(t.executions.c.id.desc()).limit(limit)
        return [codec.to_execution(r) for r in self.conn.execute(q).all()]

    def count_executions_by_status(self, agent_id: str | None, cap: int | None = None) -> dict[str, int]:
        """Executions per status. With `cap`, each status is counted up to cap + 1 along its index
        range (a result above `cap` reads "more than cap"): the GROUP BY read the whole table's
        status index on every console page view, 10^6 entries on a store a year old."""
        c = t.executions.c
        if cap is None:
            q = select(c.status, func.count()).group_by(c.status)
            if agent_id is not None:
                q = q.where(c.agent_id == agent_id)
            return {str(status): int(n) for status, n in self.conn.execute(q).all()}
        out: dict[str, int] = {}
        for status in ExecutionStatus:
            rows = select(c.id).where(c.status == status.value)
            if agent_id is not None:
                rows = rows.where(c.agent_id == agent_id)
            n = self.conn.execute(select(func.count()).select_from(rows.limit(cap + 1).subquery())).scalar_one()
            if n:
                out[status.value] = int(n)
        return out

    def set_execution(self, execution_id: str, now: datetime, **values: Any) -> None:
        for key in ("output", "state"):
            if key in values:
                values[key] = codec.dumps_or_none(values[key])
        if "status" in values:
            values["status"] = str(values["status"])
        self.w.execute(
            update(t.executions).where(t.executions.c.id == execution_id).values(updated_at=now, **values)
        )

    def execution_ids_past_deadline(self, now: datetime, limit: int) -> list[str]:
        q = (
            select(t.executions.c.id)
            .where(t.executions.c.deadline_at <= now, t.executions.c.status.not_in(TERMINAL_EXECUTIONS))
            .limit(limit)
        )
        return [r[0] for r in self.conn.execute(q).all()]

    def delete_terminal_executions_before(self, cutoff: datetime, limit: int) -> int:
        """Retention (docs/configuration.md, REGENT_RETENTION): terminal executions last updated
        before `cutoff`, except those something live still reads: a session is kept whole while
        any of its executions is live or was updated since `cutoff` (its turns read the previous
        ones), a child while its parent is live, a fork's source while the fork is live."""
        e, other = t.executions.c, t.executions.alias("other").c
        live = (ExecutionStatus.PENDING.value, ExecutionStatus.RUNNING.value, ExecutionStatus.BLOCKED.value)
        session_busy = exists().where(other.session == e.session,
                                      or_(other.status.in_(live), other.updated_at >= cutoff))
        parent_live = exists().where(other.id == e.parent_execution_id, other.status.in_(live))
        # The live executions are few (ix_executions_status): their sources, read once.
        live_sources = select(other.forked_from).where(other.status.in_(live), other.forked_from.is_not(None))
        ids = [
            r[0]
            for r in self.conn.execute(
                select(e.id)
                .where(
                    # created_at <= updated_at always: the redundant bound lets ix_executions_created
                    # walk only the executions created before the cutoff (migration 012).
                    e.status.in_(TERMINAL_EXECUTIONS), e.created_at < cutoff, e.updated_at < cutoff,
                    or_(e.session.is_(None), ~session_busy),
                    or_(e.parent_execution_id.is_(None), ~parent_live),
                    e.id.not_in(live_sources),
                )
                .limit(limit)
            ).all()
        ]
        if not ids:
            return 0
        # Children first: SQLite only cascades with foreign_keys on, and we do not rely on it.
        for table in (t.dispatch_step_counters,):
            self.w.execute(
                delete(table).where(
                    table.c.dispatch_id.in_(select(t.dispatches.c.id).where(t.dispatches.c.execution_id.in_(ids)))
                )
            )
        for table in (t.events, t.steps, t.approvals, t.dispatches, t.resources, t.resource_checkpoints):
            self.w.execute(delete(table).where(table.c.execution_id.in_(ids)))
        self.w.execute(delete(t.executions).where(t.executions.c.id.in_(ids)))
        return len(ids)


__all__ = ["Tx"]


def _successor(prefix: str) -> str | None:
    """The least string above every id that starts with `prefix` (hex digits and hyphens), for
    an index range: its last hex digit raised by one (f carries left); None when it cannot be
    (all f, or a carry into a hyphen): the LIKE alone then bounds the range."""
    head = prefix.rstrip("-")
    while head and head[-1] == "f":
        head = head[:-1]
    if not head or head[-1] == "-":
        return None
    last = head[-1]
    return head[:-1] + ("a" if last == "9" else chr(ord(last) + 1))
