"""The dialect-neutral queries: `Tx` holds every query a use case runs inside one transaction.

`SqlStore` (base.py) opens the transactions; the hot path's statements are prepared once in
statements.py; dialect modules (`sqlite.py`, `postgres.py`) supply the engine, the per-execution
lock, upserts and the dispatch claim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import delete, exists, func, insert, or_, select, update
from sqlalchemy.engine import Connection

from kernel.domain import (
    Agent,
    DecisionRecord,
    Dispatch,
    Event,
    Execution,
    ExecutionStatus,
    Step,
    StepStatus,
)
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.dialect import Dialect
from kernel.store.sql_audit import AuditQueries, content_hash, decision_params
from kernel.store.sql_dispatch import DispatchQueries
from kernel.store.sql_resource import ResourceQueries
from kernel.store.sql_session import SessionQueries
from kernel.store.sql_shadow import ShadowQueries
from kernel.store.statements import (
    ACTIVE_POLICY_REF,
    ADD_USAGE,
    APPEND,
    APPEND_WITH_EVENTS,
    COUNT_EVENTS,
    D_COLS,
    E_COLS,
    EVENT_COLUMNS,
    GET_AGENT,
    GET_COUNTER,
    GET_EXECUTION,
    GET_STEP,
    INDETERMINATE,
    INSERT_DECISION,
    INSERT_EVENT_ROWS,
    INSERT_EVENT_ROWS_AND_DECISION,
    INSERT_EVENTS,
    INSERT_STEP,
    LENT_STEP,
    MAX_EVENT_ROWS,
    OUTCOME_CONTEXT,
    OUTCOME_EVENT_TYPES,
    POLICY_CONTENT,
    S_COLS,
    SET_OUTCOME_SEQ,
    SUBMIT_CONTEXT,
    TERMINAL_EXECUTIONS,
    TERMINAL_STEPS,
    TOKEN_USAGE,
    UPDATE_STEP,
    DRow,
    ERow,
    PolicyRef,
    SRow,
)


class Tx(DispatchQueries, AuditQueries, SessionQueries, ResourceQueries, ShadowQueries):
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
        e = codec.execution_of(ERow._make(r[:ne]), self.store.inputs)
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
            codec.execution_of(ERow._make(r[:ne]), self.store.inputs),
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
        session: str | None = None, parent: str | None = None,
    ) -> list[Execution]:
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
        q = q.order_by(t.executions.c.id.desc()).limit(limit)
        return [codec.to_execution(r) for r in self.conn.execute(q).all()]

    def count_executions_by_status(self, agent_id: str | None) -> dict[str, int]:
        q = select(t.executions.c.status, func.count()).group_by(t.executions.c.status)
        if agent_id is not None:
            q = q.where(t.executions.c.agent_id == agent_id)
        return {str(status): int(n) for status, n in self.conn.execute(q).all()}

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
                    e.status.in_(TERMINAL_EXECUTIONS), e.updated_at < cutoff,
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

    # -- events ---------------------------------------------------------------------------
    def append(
        self, execution_id: str, now: datetime, events: Sequence[tuple[str, dict[str, Any]]],
        *, decision: tuple[int, DecisionRecord] | None = None,
        step: tuple[Step, str | None] | None = None, counter: tuple[str, str, str, str, int] | None = None,
        outcome: tuple[str, dict[str, Any]] | None = None, **execution_values: Any,
    ) -> int:
        """Append events with gapless seqs and apply execution updates: on PostgreSQL in one
        statement (with the decision's journal row, the new step and its counter too), elsewhere
        in two or more.

        `decision`: (index in `events` of the decision event, its record): the decisions row is
        written in this transaction, with that event's seq. Must run under the execution's lock.
        An outcome event (step.succeeded, step.failed, step.denied) writes its seq on its step.
        `step`: (a step decided now, its args text), inserted as `insert_step` would, before the
        events. `counter`: (dispatch_id, kind, target, args_hash, to), advanced as
        `advance_counter` would. `outcome` (not with `step`): (a recorded step whose outcome
        event is in `events`, the values `update_step` would set), that update with the event's
        seq. Returns the last seq written.
        """
        if step is not None and outcome is not None:
            raise ValueError("a step is either written new or updated with its outcome, not both")
        n = len(events)
        if "status" in execution_values:
            execution_values["status"] = str(execution_values["status"])
        for key in ("output", "state"):
            if key in execution_values:
                execution_values[key] = codec.dumps_or_none(execution_values[key])
        execution_values["updated_at"] = now
        keys = tuple(sorted(execution_values))
        params: dict[str, Any] | None = None
        if decision is not None:
            params = decision_params(decision[1])
        marked = None  # a step whose outcome seq the one statement wrote
        changed: tuple[int, str, dict[str, Any]] | None = None
        if outcome is not None:
            sid, step_values = outcome
            at = next((i for i, (typ, payload) in enumerate(events)
                       if typ in OUTCOME_EVENT_TYPES and payload.get("step_id") == sid), None)
            if at is None:
                raise ValueError(f"no outcome event of step {sid} in the batch")
            changed, marked = (at, sid, step_values), sid
        if 0 < n <= MAX_EVENT_ROWS and self.store.dialect == "postgresql":
            # One statement: the seq advance feeds the events' INSERT (and the journal row's, the
            # step's and the counter's).
            values = {"_id": execution_id, "_n": n, **execution_values}
            for i, (typ, payload) in enumerate(events):
                values[f"type_{i}"], values[f"payload_{i}"] = str(typ), codec.dumps(payload)
            if params is not None:
                values.update({f"d_{c}": v for c, v in params.items() if c != "event_seq"})
            index = decision[0] if decision is not None else None
            new_step = None  # the new step's outcome event index, -1 for none
            if step is not None:
                sid = step[0].step_id
                new_step = next((i for i, (typ, payload) in enumerate(events)
                                 if typ in OUTCOME_EVENT_TYPES and payload.get("step_id") == sid), -1)
                marked = sid if new_step >= 0 else None
                values.update({f"s_{c}": v for c, v in _step_values(*step).items()})
            if counter is not None:
                values.update(zip(("c_dispatch_id", "c_kind", "c_target", "c_args_hash", "c_consumed"), counter,
                                  strict=True))
            spec_outcome = None
            if changed is not None:
                stored = _step_update_values(changed[2])
                spec_outcome = (changed[0], tuple(sorted(stored)))
                values["u__id"] = changed[1]
                values.update({f"u_{c}": v for c, v in stored.items()})
            spec = (keys, n, index, new_step, counter is not None, spec_outcome)
            written = APPEND_WITH_EVENTS.get(spec).all(self.w, values)
            if not written:
                raise LookupError(f"execution {execution_id} not found")
            last = max(r[0] for r in written)
        else:
            if step is not None:
                self.insert_step(*step)
            last = APPEND.get(keys).scalar(self.w, {"_id": execution_id, "_n": n, **execution_values})
            if last is None:
                raise LookupError(f"execution {execution_id} not found")
            if n:
                self._insert_events(execution_id, now, events, last, decision, params)
            if counter is not None:
                self.advance_counter(*counter)
            if changed is not None:
                self.update_step(changed[1], **changed[2], outcome_seq=last - n + 1 + changed[0])
        first = last - n + 1
        for i, (typ, payload) in enumerate(events):
            if typ in OUTCOME_EVENT_TYPES and "step_id" in payload and payload["step_id"] != marked:
                SET_OUTCOME_SEQ.run(self.w, {"_id": payload["step_id"], "seq": first + i})
        return int(last)

    def _insert_events(
        self, execution_id: str, now: datetime, events: Sequence[tuple[str, dict[str, Any]]], last: int,
        decision: tuple[int, DecisionRecord] | None, params: dict[str, Any] | None,
    ) -> None:
        n = len(events)
        first = last - n + 1
        rows = [
            (execution_id, first + i, str(typ), codec.dumps(payload), now)
            for i, (typ, payload) in enumerate(events)
        ]
        if decision is not None and params is not None:
            params["event_seq"] = first + decision[0]
        event_params = (
            {f"{c}_{i}": v for i, row in enumerate(rows) for c, v in zip(EVENT_COLUMNS, row, strict=True)}
            if n <= MAX_EVENT_ROWS else None
        )
        if event_params is not None and params is not None and self.w.dialect.name == "postgresql":
            event_params.update({f"d_{c}": v for c, v in params.items()})
            INSERT_EVENT_ROWS_AND_DECISION.get(n).run(self.w, event_params)  # one round trip
            params = None
        elif event_params is not None:
            INSERT_EVENT_ROWS.get(n).run(self.w, event_params)
        else:
            INSERT_EVENTS.many(self.w, [dict(zip(EVENT_COLUMNS, row, strict=True)) for row in rows])
        if params is not None:
            INSERT_DECISION.run(self.w, params)

    def list_events(self, execution_id: str, after_seq: int, limit: int) -> list[Event]:
        q = (
            select(t.events)
            .where(t.events.c.execution_id == execution_id, t.events.c.event_seq > after_seq)
            .order_by(t.events.c.event_seq)
            .limit(limit)
        )
        return [codec.to_event(r) for r in self.conn.execute(q).all()]

    def last_event_seq(self, execution_id: str) -> int:
        q = select(t.executions.c.last_event_seq).where(t.executions.c.id == execution_id)
        return int(self.conn.execute(q).scalar() or 0)

    def count_events(self, execution_id: str, type_: str) -> int:
        return int(COUNT_EVENTS.scalar(self.conn, {"execution_id": execution_id, "type": type_}) or 0)

    def count_events_of(self, execution_id: str, types: list[str]) -> int:
        """Events of any of `types` in one execution (one pass over its events)."""
        c = t.events.c
        q = select(func.count()).select_from(t.events).where(c.execution_id == execution_id, c.type.in_(types))
        return int(self.conn.execute(q).scalar() or 0)

    def count_steps(self, execution_id: str) -> int:
        q = select(func.count()).select_from(t.steps).where(t.steps.c.execution_id == execution_id)
        return int(self.conn.execute(q).scalar() or 0)

    # -- steps ----------------------------------------------------------------------------
    def get_step(self, step_id: str) -> Step | None:
        r = GET_STEP.first(self.conn, {"id": step_id})
        return codec.to_step(r) if r else None

    def list_steps(self, execution_id: str, terminal_only: bool = False) -> list[Step]:
        q = select(t.steps).where(t.steps.c.execution_id == execution_id)
        if terminal_only:
            q = q.where(t.steps.c.status.in_(TERMINAL_STEPS))
        q = q.order_by(t.steps.c.started_at, t.steps.c.step_id)
        return [codec.to_step(r) for r in self.conn.execute(q).all()]

    def get_steps(self, execution_id: str, step_ids: Sequence[str]) -> list[Step]:
        """The execution's steps among `step_ids` (in batches: a bound-parameter list is finite)."""
        out: list[Step] = []
        for lo in range(0, len(step_ids), 500):
            q = select(t.steps).where(t.steps.c.execution_id == execution_id,
                                      t.steps.c.step_id.in_(step_ids[lo:lo + 500]))
            out += [codec.to_step(r) for r in self.conn.execute(q).all()]
        return out

    def insert_step(self, s: Step, args_text: str | None) -> None:
        INSERT_STEP.run(self.w, _step_values(s, args_text))

    def lend_step(self, source_step_id: str, cutoff: int, step_id: str, execution_id: str) -> Step | None:
        """A fork's lineage: the source's step `source_step_id`, when its outcome (succeeded,
        failed, denied) was recorded at or before event seq `cutoff`, written into the fork as
        `step_id` (one primary-key lookup, one insert; docs/api.md, "Forks")."""
        r = LENT_STEP.first(self.conn, {"id": source_step_id, "cutoff": cutoff})
        if r is None:
            return None
        row = {c.key: getattr(r, c.key) for c in t.steps.c}
        row.update(step_id=step_id, execution_id=execution_id, outcome_seq=None)
        INSERT_STEP.run(self.w, row)
        return codec.to_step(SimpleNamespace(**row))

    def update_step(self, step_id: str, **values: Any) -> bool:
        """Update a step unless it is terminal: a terminal outcome is never overwritten."""
        values = _step_update_values(values)
        stmt = UPDATE_STEP.get(tuple(sorted(values)))
        return stmt.run(self.w, {"_id": step_id, **values}) > 0

    def steps_in_status(self, execution_id: str, status: StepStatus) -> list[Step]:
        q = select(t.steps).where(t.steps.c.execution_id == execution_id, t.steps.c.status == status.value)
        return [codec.to_step(r) for r in self.conn.execute(q).all()]

    def has_indeterminate_failure(self, execution_id: str, kind: str, target: str, args_hash: str) -> bool:
        params = {"execution_id": execution_id, "kind": kind, "target": target, "args_hash": args_hash}
        for (err,) in INDETERMINATE.all(self.conn, params):
            value = codec.loads(err)
            if isinstance(value, dict) and value.get("reason") == "indeterminate":
                return True
        return False

    def token_usage(self, execution_id: str) -> tuple[int, int]:
        """The execution's token meter: (input, output) summed over its recorded steps."""
        r = TOKEN_USAGE.first(self.conn, {"id": execution_id})
        return (int(r[0]), int(r[1])) if r else (0, 0)

    def add_usage(self, execution_id: str, input_tokens: int, output_tokens: int) -> None:
        ADD_USAGE.run(self.w, {"id": execution_id, "input_tokens": input_tokens, "output_tokens": output_tokens})

    # -- occurrence counters --------------------------------------------------------------
    def get_counter(self, dispatch_id: str, kind: str, target: str, args_hash: str) -> int:
        params = {"dispatch_id": dispatch_id, "kind": kind, "target": target, "args_hash": args_hash}
        return int(GET_COUNTER.scalar(self.conn, params) or 0)

    def advance_counter(self, dispatch_id: str, kind: str, target: str, args_hash: str, to: int) -> None:
        """Move the counter to `to`, never backwards."""
        self.store.upsert_max(
            self.w,
            t.dispatch_step_counters,
            {"dispatch_id": dispatch_id, "kind": kind, "target": target, "args_hash": args_hash, "consumed": to},
            key=("dispatch_id", "kind", "target", "args_hash"),
            column="consumed",
        )


def _step_update_values(values: dict[str, Any]) -> dict[str, Any]:
    """`update_step`'s values as stored: result and error as JSON text, the status as text."""
    out = dict(values)
    for key in ("result", "error"):
        if key in out:
            out[key] = codec.dumps_or_none(out[key])
    if "status" in out:
        out["status"] = str(out["status"])
    return out


def _step_values(s: Step, args_text: str | None) -> dict[str, Any]:
    """A new step's row (its outcome seq comes later, with its outcome event)."""
    return {
        "step_id": s.step_id,
        "execution_id": s.execution_id,
        "kind": s.kind,
        "target": s.target,
        "args_hash": s.args_hash,
        "occurrence": s.occurrence,
        "status": s.status.value,
        "idempotency": s.idempotency,
        "args": args_text,
        "result": None,
        "error": codec.dumps_or_none(s.error),
        "usage_input": 0,
        "usage_output": 0,
        "started_at": s.started_at,
        "completed_at": s.completed_at,
        "outcome_seq": None,
    }


__all__ = ["Tx"]
