"""`Tx`'s queries on a step's history: the events (gapless seqs, the decision's journal row), the
steps and their occurrence counters. On PostgreSQL `append` writes a step decided now, its
counter's advance and an outcome's step update in its events' one statement. Mixed into `Tx`
(sql.py), which supplies `store`, `conn` and `w`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select

from kernel.domain import DecisionAt, Event, Step, StepStatus
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.dialect import TxPart
from kernel.store.sql_audit import decision_params
from kernel.store.statements import (
    ADD_USAGE,
    APPEND,
    APPEND_WITH_EVENTS,
    COUNT_EVENTS,
    COUNTER_COLUMNS,
    EVENT_COLUMNS,
    GET_COUNTER,
    GET_STEP,
    INDETERMINATE,
    INSERT_DECISION,
    INSERT_EVENT_ROWS,
    INSERT_EVENT_ROWS_AND_DECISION,
    INSERT_EVENTS,
    INSERT_STEP,
    LENT_STEP,
    MAX_EVENT_ROWS,
    OUTCOME_EVENT_TYPES,
    SET_OUTCOME_SEQ,
    TERMINAL_STEPS,
    TOKEN_USAGE,
    UPDATE_STEP,
)


class StepQueries(TxPart):
    # -- events ---------------------------------------------------------------------------
    def append(
        self, execution_id: str, now: datetime, events: Sequence[tuple[str, dict[str, Any]]],
        *, decision: DecisionAt | None = None,
        step: tuple[Step, str | None] | None = None, counter: tuple[str, str, str, str, int] | None = None,
        outcome: tuple[str, dict[str, Any]] | None = None, **execution_values: Any,
    ) -> int:
        """Append events with gapless seqs and apply execution updates: on PostgreSQL in one
        statement (with the decision's journal row, the new step and its counter too), elsewhere
        in two or more.

        `decision`: a decision record and its event (one of `events`): the decisions row is
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
        index = None  # the decision event's place in `events`
        if decision is not None:
            params = decision_params(decision.record)
            index = _event_index(events, decision.event)
        marked = None  # a step whose outcome seq the one statement wrote
        changed: tuple[int, str, dict[str, Any]] | None = None
        if outcome is not None:
            sid, step_values = outcome
            at = _outcome_index(events, sid)
            if at < 0:
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
            new_step = None  # the new step's outcome event index, -1 for none
            if step is not None:
                sid = step[0].step_id
                new_step = _outcome_index(events, sid)
                marked = sid if new_step >= 0 else None
                values.update({f"s_{c}": v for c, v in _step_values(*step).items()})
            if counter is not None:
                values.update({f"c_{c}": v for c, v in zip(COUNTER_COLUMNS, counter, strict=True)})
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
                self._insert_events(execution_id, now, events, last, index, params)
            if counter is not None:
                self.advance_counter(*counter)
            if changed is not None:
                self.update_step(execution_id, changed[1], **changed[2], outcome_seq=last - n + 1 + changed[0])
        first = last - n + 1
        for i, (typ, payload) in enumerate(events):
            if typ in OUTCOME_EVENT_TYPES and "step_id" in payload and payload["step_id"] != marked:
                SET_OUTCOME_SEQ.run(self.w, {"_execution_id": execution_id, "_id": payload["step_id"], "seq": first + i})
        return int(last)

    def _insert_events(
        self, execution_id: str, now: datetime, events: Sequence[tuple[str, dict[str, Any]]], last: int,
        index: int | None, params: dict[str, Any] | None,
    ) -> None:
        n = len(events)
        first = last - n + 1
        rows = [
            (execution_id, first + i, str(typ), codec.dumps(payload), now)
            for i, (typ, payload) in enumerate(events)
        ]
        if index is not None and params is not None:
            params["event_seq"] = first + index
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
    def get_step(self, execution_id: str, step_id: str) -> Step | None:
        r = GET_STEP.first(self.conn, {"execution_id": execution_id, "id": step_id})
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

    def lend_step(
        self, source_execution_id: str, source_step_id: str, cutoff: int, step_id: str, execution_id: str
    ) -> Step | None:
        """A fork's lineage: the source's (`source_execution_id`) step `source_step_id`, when its outcome (succeeded,
        failed, denied) was recorded at or before event seq `cutoff`, written into the fork as
        `step_id` (one primary-key lookup, one insert; docs/api.md, "Forks")."""
        r = LENT_STEP.first(self.conn, {"execution_id": source_execution_id, "id": source_step_id, "cutoff": cutoff})
        if r is None:
            return None
        row = {c.key: getattr(r, c.key) for c in t.steps.c}
        row.update(step_id=step_id, execution_id=execution_id, outcome_seq=None)
        INSERT_STEP.run(self.w, row)
        return codec.to_step(SimpleNamespace(**row))

    def update_step(self, execution_id: str, step_id: str, **values: Any) -> bool:
        """Update a step unless it is terminal: a terminal outcome is never overwritten."""
        values = _step_update_values(values)
        stmt = UPDATE_STEP.get(tuple(sorted(values)))
        return stmt.run(self.w, {"_execution_id": execution_id, "_id": step_id, **values}) > 0

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


def _outcome_index(events: Sequence[tuple[str, dict[str, Any]]], step_id: str) -> int:
    """The index of `step_id`'s outcome event (step.succeeded, step.failed, step.denied) in
    `events`, or -1."""
    return next((i for i, (typ, payload) in enumerate(events)
                 if typ in OUTCOME_EVENT_TYPES and payload.get("step_id") == step_id), -1)


def _event_index(events: Sequence[tuple[str, dict[str, Any]]], event: tuple[str, dict[str, Any]]) -> int:
    """The index of `event` (that object, not an equal one) in `events`."""
    for i, at in enumerate(events):
        if at is event:
            return i
    raise ValueError("the decision's event is not in the batch")


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

