"""The hot path's statements (rebuno-v0 §2.1, §2.2), built once as Core and run prepared.

Each is a `Prepared` (kernel/store/prepared.py): compiled once per dialect, executed on the driver
cursor inside the transaction `Tx` has open. `Tx` (sql.py) is the only user.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from sqlalchemy import (
    BigInteger,
    String,
    Text,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from kernel.domain import (
    DispatchStatus,
    ExecutionStatus,
    StepStatus,
)
from kernel.domain.step import TERMINAL_STEP_STATUSES
from kernel.store import tables as t
from kernel.store.prepared import Prepared, PreparedCache

TERMINAL_STEPS = tuple(s.value for s in TERMINAL_STEP_STATUSES)
TERMINAL_EXECUTIONS = tuple(
    s.value for s in (ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)
)


def param(name: str) -> Any:
    return bindparam(name)


def not_terminal_step() -> Any:
    # Constant lists as literals: prepared statements take no expanding (IN-list) parameters.
    return t.steps.c.status.not_in([literal_column(f"'{v}'") for v in TERMINAL_STEPS])


# The hot path's statements (rebuno-v0 §2.1, §2.2), built once; see kernel/store/prepared.py.
GET_AGENT = Prepared(select(t.agents).where(t.agents.c.id == param("id")))
GET_EXECUTION = Prepared(select(t.executions).where(t.executions.c.id == param("id")))
GET_DISPATCH = Prepared(select(t.dispatches).where(t.dispatches.c.id == param("id")))
# Steps are keyed (execution_id, step_id) (migration 017): every lookup by step id binds its
# execution too, so it is one primary-key probe.
GET_STEP = Prepared(
    select(t.steps).where(t.steps.c.execution_id == param("execution_id"), t.steps.c.step_id == param("id"))
)


def _consumed() -> Any:
    """The occurrence counter of one (dispatch, kind, target, args_hash)."""
    c = t.dispatch_step_counters.c
    return select(c.consumed).where(
        c.dispatch_id == param("dispatch_id"),
        c.kind == param("kind"),
        c.target == param("target"),
        c.args_hash == param("args_hash"),
    )


GET_COUNTER = Prepared(_consumed())
# The round trip's entry reads, one statement each (rebuno-v0 §2.1, §2.2): the execution, the
# dispatch the request names (LEFT JOIN on the given id, so a missing one reads as NULLs) and, for a
# submit, the occurrence counter; for an outcome, the step.
E_COLS = tuple(t.executions.c)
D_COLS = tuple(t.dispatches.c)
S_COLS = tuple(t.steps.c)
ERow = namedtuple("ERow", [c.key for c in E_COLS])  # type: ignore[misc]
DRow = namedtuple("DRow", [c.key for c in D_COLS])  # type: ignore[misc]
SRow = namedtuple("SRow", [c.key for c in S_COLS])  # type: ignore[misc]
# The agent's active policy revision, without its content (what the resolver looks up per decision).
P_COLS = (t.policy_revisions.c.id, t.policy_revisions.c.agent_id, t.policy_revisions.c.kind,
          t.policy_revisions.c.revision, t.policy_revisions.c.content_hash)
PolicyRef = namedtuple("PolicyRef", [c.key for c in P_COLS])  # type: ignore[misc]
# A submit's read also takes the agent's active policy revision (the decision's one lookup, read
# ahead: `Tx.active_policy_ref`) and the step recorded at the call's identity (execution, kind, target,
# args hash, occurrence: the steps table's unique key, so one index lookup), which is the step the
# call's deterministic id names: one statement instead of a second read by step id.
SUBMIT_CONTEXT = Prepared(
    select(
        *E_COLS,
        *D_COLS,
        _consumed().scalar_subquery().label("consumed"),
        *S_COLS,
        *P_COLS,
    )
    .select_from(
        t.executions.outerjoin(t.dispatches, t.dispatches.c.id == param("dispatch_id")).outerjoin(
            t.policy_revisions,
            and_(t.policy_revisions.c.agent_id == t.executions.c.agent_id, t.policy_revisions.c.active.is_(True)),
        ).outerjoin(
            t.steps,
            and_(
                t.steps.c.execution_id == t.executions.c.id,
                t.steps.c.kind == param("kind"),
                t.steps.c.target == param("target"),
                t.steps.c.args_hash == param("args_hash"),
                t.steps.c.occurrence == func.coalesce(_consumed().scalar_subquery(), 0),
            ),
        )
    )
    .where(t.executions.c.id == param("execution_id"))
)
OUTCOME_CONTEXT = Prepared(
    select(*E_COLS, *D_COLS, *S_COLS)
    .select_from(
        t.executions.outerjoin(t.dispatches, t.dispatches.c.id == param("dispatch_id")).outerjoin(
            t.steps,
            and_(t.steps.c.execution_id == t.executions.c.id, t.steps.c.step_id == param("step_id")),
        )
    )
    .where(t.executions.c.id == param("execution_id"))
)
TOKEN_USAGE = Prepared(
    select(t.executions.c.usage_input, t.executions.c.usage_output).where(t.executions.c.id == param("id"))
)
ADD_USAGE = Prepared(
    update(t.executions)
    .where(t.executions.c.id == param("id"))
    .values(
        usage_input=t.executions.c.usage_input + param("input_tokens"),
        usage_output=t.executions.c.usage_output + param("output_tokens"),
    )
)
ACTIVE_POLICY_REF = Prepared(
    select(*P_COLS).where(t.policy_revisions.c.agent_id == param("agent_id"), t.policy_revisions.c.active.is_(True))
)
POLICY_CONTENT = Prepared(select(t.policy_revisions.c.content).where(t.policy_revisions.c.id == param("id")))
INSERT_STEP = Prepared(insert(t.steps))
INSERT_EVENTS = Prepared(insert(t.events))
EVENT_COLUMNS = ("execution_id", "event_seq", "type", "payload", "occurred_at")


def event_param(column: str, row: int) -> Any:
    # Typed: in a multi-row VALUES SQLAlchemy gives an untyped bindparam its column's type in the
    # first row only, and the later rows' timestamps then skipped UTCDateTime's bind processor.
    return bindparam(f"{column}_{row}", type_=t.events.c[column].type)


# One multi-row INSERT for the few events a use case appends (an allowed step: three): on
# PostgreSQL, executemany goes through psycopg's pipeline machinery, which cost more than the
# statement. Keyed by the row count; larger batches use INSERT_EVENTS.many.
MAX_EVENT_ROWS = 8
INSERT_EVENT_ROWS = PreparedCache(
    lambda n: insert(t.events).values(
        [{c: event_param(c, i) for c in EVENT_COLUMNS} for i in range(n)]
    )
)


class plus_ms(FunctionElement[Any]):
    """`timestamp + milliseconds` in SQL, per dialect: PostgreSQL adds an interval; SQLite, which
    stores `UTCDateTime` as `YYYY-MM-DD HH:MM:SS.ffffff` text, shifts it with strftime (whose `%f`
    keeps milliseconds, padded back to six digits so stored values keep one sortable format)."""

    type = t.UTCDateTime()
    inherit_cache = True
    name = "plus_ms"


@compiles(plus_ms)
def _plus_ms(element: plus_ms, compiler: Any, **kw: Any) -> str:
    ts, ms = (compiler.process(c, **kw) for c in element.clauses)
    return f"({ts} + ({ms}) * interval '1 millisecond')"


@compiles(plus_ms, "sqlite")
def _plus_ms_sqlite(element: plus_ms, compiler: Any, **kw: Any) -> str:
    ts, ms = (compiler.process(c, **kw) for c in element.clauses)
    return f"(strftime('%Y-%m-%d %H:%M:%f', {ts}, '+' || (({ms}) / 1000.0) || ' seconds') || '000')"


# Renewing moves the expiry on by the period the claim stored on the row (`lease_ms`), in the
# UPDATE itself: the submit, outcome and heartbeat paths need not know the agent's lease period,
# and no query is added to them.
_NOW = bindparam("now", type_=t.UTCDateTime())
RENEW_LEASE = Prepared(
    update(t.dispatches)
    .where(
        t.dispatches.c.id == param("id"),
        t.dispatches.c.execution_id == param("execution_id"),
        t.dispatches.c.attempt == param("attempt"),
        t.dispatches.c.status == literal_column(f"'{DispatchStatus.IN_FLIGHT.value}'"),
    )
    .values(locked_at=_NOW, lease_expires_at=plus_ms(_NOW, t.dispatches.c.lease_ms))
)
INDETERMINATE = Prepared(
    select(t.steps.c.error).where(
        t.steps.c.execution_id == param("execution_id"),
        t.steps.c.kind == param("kind"),
        t.steps.c.target == param("target"),
        t.steps.c.args_hash == param("args_hash"),
        t.steps.c.status == literal_column(f"'{StepStatus.FAILED.value}'"),
    )
)
PENDING_APPROVAL = Prepared(
    select(t.approvals)
    .where(t.approvals.c.step_id == param("step_id"), t.approvals.c.status == literal_column("'pending'"))
    .order_by(t.approvals.c.created_at)
)
COUNT_EVENTS = Prepared(
    select(func.count())
    .select_from(t.events)
    .where(t.events.c.execution_id == param("execution_id"), t.events.c.type == param("type"))
)
# Keyed by the columns set: the use cases set a handful of fixed combinations.
UPDATE_STEP = PreparedCache(
    lambda keys: update(t.steps)
    .where(t.steps.c.execution_id == param("_execution_id"), t.steps.c.step_id == param("_id"),
           not_terminal_step())
    .values({k: param(k) for k in keys})
)
APPEND = PreparedCache(
    lambda keys: update(t.executions)
    .where(t.executions.c.id == param("_id"))
    .values(last_event_seq=t.executions.c.last_event_seq + param("_n"), **{k: param(k) for k in keys})
    .returning(t.executions.c.last_event_seq)
)
STEP_COLUMNS = tuple(c.key for c in t.steps.c)
COUNTER_COLUMNS = ("dispatch_id", "kind", "target", "args_hash", "consumed")


# PostgreSQL: the seq advance and the events' INSERT in one statement (one round trip instead of
# two; SQLite runs no DML in a WITH), with the decision's journal row when there is one, and for a
# step decided now its row (`s_<column>`; its outcome_seq that of event `step` when that event is
# its outcome, else NULL) and its occurrence counter's advance (`c_<column>`). Keyed by (the
# execution columns set, the number of events, the decision event's index or None, the step:
# None, or the index of its outcome event or -1, whether the counter advances); RETURNING the seqs
# written, none when the execution does not exist (and then no other row is written either).
# `outcome`: (the index of a recorded step's outcome event, the step columns its update sets,
# `u_<column>`, the step `u__id`): the step's update (unless it is terminal) with that seq.
def _append_with_events(
    spec: tuple[tuple[str, ...], int, int | None, int | None, bool, tuple[int, tuple[str, ...]] | None],
) -> Any:
    keys, n, decision_index, step, counter, outcome = spec
    seq = (
        update(t.executions)
        .where(t.executions.c.id == bindparam("_id", type_=String()))
        .values(last_event_seq=t.executions.c.last_event_seq + bindparam("_n", type_=BigInteger()),
                **{k: param(k) for k in keys})
        .returning(t.executions.c.last_event_seq)
        .cte("seq")
    )

    def seq_of(i: int) -> Any:  # the seq of event i of the batch
        return seq.c.last_event_seq - literal_column(str(n - 1 - i), BigInteger())

    rows = union_all(*[
        select(literal_column(str(i), BigInteger()).label("i"), bindparam(f"type_{i}", type_=String()).label("type"),
               bindparam(f"payload_{i}", type_=Text()).label("payload"))
        for i in range(n)
    ]).subquery("ev")
    source = select(
        bindparam("_id", type_=String()), seq_of(0) + rows.c.i, rows.c.type, rows.c.payload,
        bindparam("updated_at", type_=t.UTCDateTime()),
    ).select_from(seq.join(rows, true()))
    stmt = insert(t.events).from_select(list(EVENT_COLUMNS), source).returning(t.events.c.event_seq)
    if decision_index is not None:
        # The decision's journal row, its event_seq that of the decision event (decision_index).
        journal = t.decision_journal.c
        row = select(*[
            seq_of(decision_index) if c == "event_seq" else bindparam(f"d_{c}", type_=journal[c].type)
            for c in DECISION_COLUMNS
        ]).select_from(seq)
        stmt = stmt.add_cte(insert(t.decision_journal).from_select(list(DECISION_COLUMNS), row).cte("decision_row"))
    if step is not None:
        steps = t.steps.c
        row = select(*[
            (seq_of(step) if step >= 0 else null()) if c == "outcome_seq"
            else bindparam(f"s_{c}", type_=steps[c].type)
            for c in STEP_COLUMNS
        ]).select_from(seq)
        stmt = stmt.add_cte(insert(t.steps).from_select(list(STEP_COLUMNS), row).cte("step_row"))
    if counter:
        counters = t.dispatch_step_counters
        # Only once the seq advance found the execution, like every other row of the statement.
        row = select(*[bindparam(f"c_{c}", type_=counters.c[c].type) for c in COUNTER_COLUMNS]).select_from(seq)
        upsert = pg_insert(counters).from_select(list(COUNTER_COLUMNS), row)
        upsert = upsert.on_conflict_do_update(
            index_elements=list(COUNTER_COLUMNS[:4]),
            set_={"consumed": func.greatest(counters.c.consumed, upsert.excluded.consumed)},
        )
        stmt = stmt.add_cte(upsert.cte("counter_row"))
    if outcome is not None:
        index, columns = outcome
        changed = (
            update(t.steps)
            .where(t.steps.c.execution_id == bindparam("_id", type_=String()),
                   t.steps.c.step_id == bindparam("u__id", type_=String()), not_terminal_step())
            .values({**{c: bindparam(f"u_{c}", type_=t.steps.c[c].type) for c in columns},
                     "outcome_seq": seq_of(index)})
        )
        stmt = stmt.add_cte(changed.cte("outcome_row"))
    return stmt


APPEND_WITH_EVENTS = PreparedCache(_append_with_events)
# An outcome event marks its step with its seq (Tx.append), which a fork's lineage reads.
OUTCOME_EVENT_TYPES = frozenset({"step.succeeded", "step.failed", "step.denied"})
SET_OUTCOME_SEQ = Prepared(
    update(t.steps)
    .where(t.steps.c.execution_id == param("_execution_id"), t.steps.c.step_id == param("_id"))
    .values(outcome_seq=param("seq"))
)
# A fork's source step, when its outcome was recorded at or before the fork point.
LENT_STEP = Prepared(
    select(t.steps).where(
        t.steps.c.execution_id == param("execution_id"),
        t.steps.c.step_id == param("id"),
        t.steps.c.outcome_seq <= param("cutoff"),
        t.steps.c.status.in_([literal_column(f"'{v}'") for v in ("succeeded", "failed", "denied")]),
    )
)
DECISION_COLUMNS = tuple(c.key for c in t.decisions.c)
# A decision's record goes to the journal (tables.py); the journal's cleanup moves it to `decisions`.
INSERT_DECISION = Prepared(insert(t.decision_journal).values({c: param(c) for c in DECISION_COLUMNS}))
# PostgreSQL only (a data-modifying CTE): the events of a step and its decision's journal row in
# one statement, so the record costs no round trip of its own. Decision parameters are `d_<column>`.
INSERT_EVENT_ROWS_AND_DECISION = PreparedCache(
    lambda n: insert(t.events).values(
        [{c: event_param(c, i) for c in EVENT_COLUMNS} for i in range(n)]
    ).add_cte(insert(t.decision_journal).values({c: param(f"d_{c}") for c in DECISION_COLUMNS}).cte("decision_row"))
)
