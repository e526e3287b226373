"""The schema, declared once with SQLModel. The hot path uses SQLAlchemy Core on these tables.

JSON values are stored as compact JSON text (both dialects): args as their canonical text (number
lexemes intact), the rest as `json.dumps` output. Timestamps are UTC (`UTCDateTime`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every dialect (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    # SQLite keeps these as text in SQLAlchemy's DATETIME storage format, `YYYY-MM-DD
    # HH:MM:SS.ffffff`. The chain above (our processor, then the dialect's: a %-format of a dict
    # one way, `fromisoformat` then `replace` the other) cost ~2.4 and ~0.9 µs a value, a dozen
    # binds and twenty results per step round trip; these give the same text and values in ~1
    # and ~0.1 µs, and hand anything else to the chain.
    def bind_processor(self, dialect: Any) -> Any:
        chain = super().bind_processor(dialect)
        if dialect.name != "sqlite" or chain is None:
            return chain

        # A use case binds the one `now` it read many times (a step's row, its events, the
        # execution's updated_at, the decision): the last value formatted, kept by identity,
        # answers the repeats. One tuple, replaced whole, so threads never see half of one.
        last: list[tuple[Any, str]] = [(object(), "")]  # never `is` a bound value

        def process(value: Any) -> Any:
            seen = last[0]
            if seen[0] is value:
                return seen[1]
            if value.__class__ is datetime and value.tzinfo is UTC:
                text = value.isoformat(" ", "microseconds")[:26]  # without its "+00:00"
                last[0] = (value, text)
                return text
            return chain(value)

        return process

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        chain = super().result_processor(dialect, coltype)
        if dialect.name != "sqlite" or chain is None:
            return chain
        parse = datetime.fromisoformat

        def process(value: Any) -> Any:
            if value.__class__ is str and len(value) == 26 and value[19] == ".":  # the storage format
                return parse(value + "+00:00")  # tzinfo is then the UTC singleton, as replace gives
            if value is None:  # NULL: an unset deadline, a step not completed yet
                return None
            return chain(value)

        return process


def _ts(nullable: bool = False, index: bool = False) -> Any:
    return Field(sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


def _text(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(Text, nullable=nullable))


class AgentRow(SQLModel, table=True):
    __tablename__ = "agents"

    id: str = Field(sa_column=Column(String(200), primary_key=True))
    webhook_url: str = Field(sa_column=Column(Text, nullable=False))
    secret: str = Field(sa_column=Column(Text, nullable=False))
    lease_timeout_seconds: int | None = Field(default=None, sa_column=Column(Integer))
    registered_at: datetime = _ts()
    description: str | None = _text()
    input_schema: str | None = _text()
    output_schema: str | None = _text()


class PolicyRevisionRow(SQLModel, table=True):
    """Every stored bundle revision is kept; at most one per agent is active."""

    __tablename__ = "policy_revisions"
    __table_args__ = (
        Index("ix_policy_revisions_agent", "agent_id", "seq"),
        Index("ix_policy_revisions_hash", "agent_id", "content_hash"),
        UniqueConstraint("agent_id", "seq"),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    agent_id: str = Field(
        sa_column=Column(String(200), ForeignKey("agents.id", ondelete="CASCADE"), nullable=False)
    )
    seq: int = Field(sa_column=Column(Integer, nullable=False))
    kind: str = Field(sa_column=Column(String(16), nullable=False))  # yaml | rego | none
    revision: str = Field(sa_column=Column(String(200), nullable=False))
    content: str = Field(sa_column=Column(Text, nullable=False))  # YAML text, or Rego bundle JSON
    # SHA-256 of `content` (the canonical bundle: YAML text, or the sorted Rego JSON): the
    # `policy_hash` of every decision this revision makes, and the key of GET …/revisions/{hash}.
    content_hash: str = Field(default="", sa_column=Column(String(64), nullable=False, server_default=""))
    active: bool = Field(default=False, nullable=False)
    created_at: datetime = _ts()


class ExecutionRow(SQLModel, table=True):
    __tablename__ = "executions"
    __table_args__ = (
        Index("ix_executions_agent", "agent_id", "id"),
        Index("ix_executions_status", "status", "id"),
        # Session admission reads a session's live and queued executions, oldest first.
        Index("ix_executions_session", "session", "status", "id"),
        Index("ix_executions_parent", "parent_execution_id"),
        UniqueConstraint("agent_id", "idempotency_key"),
    )

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    agent_id: str = Field(sa_column=Column(String(200), ForeignKey("agents.id"), nullable=False))
    input: str | None = _text()
    status: str = Field(sa_column=Column(String(16), nullable=False))
    output: str | None = _text()
    failure_reason: str | None = _text()
    idempotency_key: str | None = Field(default=None, sa_column=Column(String(200)))
    last_event_seq: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    # Running token meter (sum of its steps' recorded usage), so a budget check is O(1).
    usage_input: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    usage_output: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    deadline_at: datetime | None = _ts(nullable=True, index=True)
    # The credential that created it: an API key's id, "bootstrap" or "dev". The key that created
    # an execution may not approve its steps.
    created_by: str | None = Field(default=None, sa_column=Column(String(36)))
    # Sessions, sub-agents and forks (migration 004; docs/architecture.md).
    session: str | None = Field(default=None, sa_column=Column(String(200)))
    parent_execution_id: str | None = Field(default=None, sa_column=Column(String(36)))
    spawned_step_id: str | None = Field(default=None, sa_column=Column(String(64)))
    previous_execution_id: str | None = Field(default=None, sa_column=Column(String(36)))
    state: str | None = _text()
    forked_from: str | None = Field(default=None, sa_column=Column(String(36)))
    fork_seq: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    fork_bundle_id: int | None = Field(default=None, sa_column=Column(Integer))
    suspended: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    restoration: str | None = _text()  # a fork's resources at its fork point (migration 010)


class ForkBundleRow(SQLModel, table=True):
    """A fork's own policy bundle: governs that execution in place of the agent's active one."""

    __tablename__ = "fork_bundles"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    agent_id: str = Field(sa_column=Column(String(200), nullable=False))
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    revision: str = Field(sa_column=Column(String(200), nullable=False))
    content: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = _ts()


class ResourceRow(SQLModel, table=True):
    """An external resource an execution registered (a sandbox, say): binding and checkpoint state."""

    __tablename__ = "resources"

    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), primary_key=True)
    )
    key: str = Field(sa_column=Column(String(200), primary_key=True))
    driver_id: str = Field(sa_column=Column(Text, nullable=False))
    configuration: str | None = _text()
    coverage_reuse: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    every_steps: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    on_completion: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    generation: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    binding: str | None = _text()
    checkpoint_ref: str | None = _text()  # the restored-from (or latest captured) checkpoint
    covered: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    steps_since_capture: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    created_at: datetime = _ts()
    # The event seq at which it was registered (a fork restores only what existed at its fork
    # point; migration 010).
    registered_seq: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))


class ResourceCheckpointRow(SQLModel, table=True):
    """Every capture a resource recorded, with the event seq it covers (fork selection reads it)."""

    __tablename__ = "resource_checkpoints"
    __table_args__ = (Index("ix_resource_checkpoints_seq", "execution_id", "key", "event_seq"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), nullable=False)
    )
    key: str = Field(sa_column=Column(String(200), nullable=False))
    generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    checkpoint_ref: str = Field(sa_column=Column(Text, nullable=False))
    event_seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    # The seq of the first step after it that changed the resource: the checkpoint covers the
    # event seqs [event_seq, superseded_seq) (migration 010).
    superseded_seq: int | None = Field(default=None, sa_column=Column(BigInteger))
    created_at: datetime = _ts()


class EventRow(SQLModel, table=True):
    __tablename__ = "events"

    execution_id: str = Field(
        sa_column=Column(
            String(36), ForeignKey("executions.id", ondelete="CASCADE"), primary_key=True
        )
    )
    event_seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    type: str = Field(sa_column=Column(String(40), nullable=False))
    payload: str = Field(sa_column=Column(Text, nullable=False))
    occurred_at: datetime = _ts()


class StepRow(SQLModel, table=True):
    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("execution_id", "kind", "target", "args_hash", "occurrence"),
        Index("ix_steps_execution", "execution_id"),
    )

    step_id: str = Field(sa_column=Column(String(64), primary_key=True))
    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), nullable=False)
    )
    kind: str = Field(sa_column=Column(Text, nullable=False))
    target: str = Field(sa_column=Column(Text, nullable=False))
    args_hash: str = Field(sa_column=Column(String(64), nullable=False))
    occurrence: int = Field(sa_column=Column(Integer, nullable=False))
    status: str = Field(sa_column=Column(String(20), nullable=False))
    idempotency: str = Field(sa_column=Column(Text, nullable=False))
    args: str | None = _text()
    result: str | None = _text()
    error: str | None = _text()
    usage_input: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    usage_output: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    started_at: datetime | None = _ts(nullable=True)
    completed_at: datetime | None = _ts(nullable=True)
    # The seq of the event that recorded its terminal outcome (migration 006): a fork reads its
    # source's steps whose outcome is at or before the fork point (docs/api.md, "Forks").
    outcome_seq: int | None = Field(default=None, sa_column=Column(BigInteger))


class ApprovalRow(SQLModel, table=True):
    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_status", "status", "created_at"),)

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    step_id: str = Field(sa_column=Column(String(64), nullable=False, index=True))
    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), nullable=False)
    )
    status: str = Field(sa_column=Column(String(16), nullable=False))
    approvers: str | None = _text()
    message: str | None = _text()
    timeout_at: datetime = _ts()
    decided_by: str | None = _text()
    asserted_by: str | None = _text()
    decided_at: datetime | None = _ts(nullable=True)
    rationale: str | None = _text()
    created_at: datetime = _ts()
    # What the approver decides on (the step's args are read from its row): who asked, and why.
    agent_id: str | None = Field(default=None, sa_column=Column(String(200)))
    kind: str | None = _text()
    target: str | None = _text()
    rule_id: str | None = _text()
    reason: str | None = _text()
    policy_hash: str | None = Field(default=None, sa_column=Column(String(64)))
    # How the decider was identified: key | bootstrap | dev (docs/audit.md).
    credential: str | None = Field(default=None, sa_column=Column(String(16)))


class DispatchRow(SQLModel, table=True):
    __tablename__ = "dispatches"
    __table_args__ = (
        Index("ix_dispatches_due", "status", "next_attempt_at"),
        Index("ix_dispatches_execution", "execution_id"),
        # The reaper: WHERE status = 'in_flight' AND lease_expires_at <= :now ORDER BY lease_expires_at.
        Index("ix_dispatches_lease", "status", "lease_expires_at"),
    )

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), nullable=False)
    )
    status: str = Field(sa_column=Column(String(16), nullable=False))
    attempt: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    max_attempts: int = Field(sa_column=Column(Integer, nullable=False))
    next_attempt_at: datetime = _ts()
    locked_by: str | None = Field(default=None, sa_column=Column(String(200)))
    locked_at: datetime | None = _ts(nullable=True)
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    # The lease of the in-flight attempt: its period in milliseconds (the default lease may be
    # fractional), fixed at the claim (the agent's lease_timeout_seconds, else the kernel default:
    # what the webhook body told the agent), and its expiry, locked_at + that period, moved on by
    # every renewal. Stale once the row leaves in_flight; only in-flight rows are read for expiry.
    lease_ms: int | None = Field(default=None, sa_column=Column(Integer))
    lease_expires_at: datetime | None = _ts(nullable=True)


class DispatchStepCounterRow(SQLModel, table=True):
    __tablename__ = "dispatch_step_counters"

    dispatch_id: str = Field(
        sa_column=Column(
            String(36), ForeignKey("dispatches.id", ondelete="CASCADE"), primary_key=True
        )
    )
    kind: str = Field(sa_column=Column(Text, primary_key=True))
    target: str = Field(sa_column=Column(Text, primary_key=True))
    args_hash: str = Field(sa_column=Column(String(64), primary_key=True))
    consumed: int = Field(default=0, sa_column=Column(Integer, nullable=False))


class ApiKeyRow(SQLModel, table=True):
    __tablename__ = "api_keys"

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    name: str = Field(sa_column=Column(String(200), nullable=False))
    scopes: str = Field(sa_column=Column(Text, nullable=False))  # JSON array
    secret_hash: bytes = Field(sa_column=Column(LargeBinary(32), nullable=False))
    created_at: datetime = _ts()
    revoked_at: datetime | None = _ts(nullable=True)
    expires_at: datetime | None = _ts(nullable=True)
    created_by: str | None = _text()
    last_used_at: datetime | None = _ts(nullable=True)


class DecisionRow(SQLModel, table=True):
    """The durable decision record (docs/audit.md): one row per decision event, written in the
    event's transaction, no foreign key to executions (it outlives their retention). Paged newest
    first on (decided_at, id); each filter has an index led by its column."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_time", "decided_at", "id"),
        Index("ix_decisions_agent", "agent_id", "decided_at", "id"),
        Index("ix_decisions_rule", "rule_id", "decided_at", "id"),
        Index("ix_decisions_decision", "decision", "decided_at", "id"),
        Index("ix_decisions_target", "target", "decided_at", "id"),
        Index("ix_decisions_policy_hash", "policy_hash", "decided_at", "id"),
        Index("ix_decisions_execution", "execution_id", "decided_at", "id"),
        # Partial: only judge rules' records (few), so the other decisions pay nothing for it.
        Index("ix_decisions_judged", "decided_at", "id", sqlite_where=text("judge IS NOT NULL"),
              postgresql_where=text("judge IS NOT NULL")),
    )

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    agent_id: str = Field(sa_column=Column(String(200), nullable=False))
    execution_id: str = Field(sa_column=Column(String(36), nullable=False))
    step_id: str | None = Field(default=None, sa_column=Column(String(64)))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    target: str = Field(sa_column=Column(Text, nullable=False))
    decision: str = Field(sa_column=Column(String(24), nullable=False))
    rule_id: str = Field(sa_column=Column(Text, nullable=False))
    reason: str | None = _text()
    policy_kind: str = Field(sa_column=Column(String(16), nullable=False))
    policy_revision: str = Field(sa_column=Column(Text, nullable=False))
    policy_hash: str = Field(sa_column=Column(String(64), nullable=False))
    decided_by: str | None = _text()
    credential: str | None = Field(default=None, sa_column=Column(String(16)))
    event_seq: int | None = Field(default=None, sa_column=Column(BigInteger))
    decided_at: datetime = _ts()
    judge: str | None = _text()  # JSON: the judge's record (asked, answered, outcome, latency), judge rules only


class DecisionRollupRow(SQLModel, table=True):
    """Decisions counted per closed hour and (agent, outcome, rule, bundle): what the audit chart
    sums instead of scanning the decisions table (docs/audit.md, "The chart"). Derived data: an
    hour is filled once, from the decisions table, after it has closed."""

    __tablename__ = "decision_rollup"

    hour: datetime = Field(sa_column=Column(UTCDateTime(), primary_key=True))
    agent_id: str = Field(sa_column=Column(String(200), primary_key=True))
    decision: str = Field(sa_column=Column(String(24), primary_key=True))
    rule_id: str = Field(sa_column=Column(Text, primary_key=True))
    policy_hash: str = Field(sa_column=Column(String(64), primary_key=True))
    count: int = Field(sa_column=Column(BigInteger, nullable=False))


class DecisionRollupHourRow(SQLModel, table=True):
    """The hours `decision_rollup` holds (an hour without decisions has no counts, only this row)."""

    __tablename__ = "decision_rollup_hours"

    hour: datetime = Field(sa_column=Column(UTCDateTime(), primary_key=True))
    rolled_up_at: datetime = _ts()


class PolicyShadowRow(SQLModel, table=True):
    """A candidate (shadow) bundle, evaluated beside the active one without deciding anything.
    Rows are kept when the shadow ends (promoted, cleared, replaced), so a report stays readable."""

    __tablename__ = "policy_shadows"
    __table_args__ = (Index("ix_policy_shadows_agent", "agent_id", "status"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    agent_id: str = Field(
        sa_column=Column(String(200), ForeignKey("agents.id", ondelete="CASCADE"), nullable=False)
    )
    kind: str = Field(sa_column=Column(String(16), nullable=False))  # yaml | rego
    revision: str = Field(sa_column=Column(String(200), nullable=False))
    content: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(String(16), nullable=False))  # shadowing | promoted | cleared | replaced
    created_at: datetime = _ts()
    created_by: str | None = _text()
    ended_at: datetime | None = _ts(nullable=True)
    last_error: str | None = _text()  # the latest shadow fault's reason


class ShadowTallyRow(SQLModel, table=True):
    """Counts per shadow and (outcome, active decision, shadow decision); agreement is only counted."""

    __tablename__ = "shadow_tallies"

    shadow_id: int = Field(
        sa_column=Column(Integer, ForeignKey("policy_shadows.id", ondelete="CASCADE"), primary_key=True)
    )
    outcome: str = Field(sa_column=Column(String(16), primary_key=True))  # agreed | disagreed | error | dropped
    active_decision: str = Field(sa_column=Column(String(32), primary_key=True))
    shadow_decision: str = Field(sa_column=Column(String(32), primary_key=True))  # errors: the fault class
    count: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class ShadowDisagreementRow(SQLModel, table=True):
    """One step on which the shadow and the active bundle differed (decision or rule id)."""

    __tablename__ = "shadow_disagreements"
    __table_args__ = (Index("ix_shadow_disagreements_shadow", "shadow_id", "id"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    shadow_id: int = Field(
        sa_column=Column(Integer, ForeignKey("policy_shadows.id", ondelete="CASCADE"), nullable=False)
    )
    agent_id: str = Field(sa_column=Column(String(200), nullable=False))
    execution_id: str = Field(sa_column=Column(String(36), nullable=False))
    step_id: str = Field(sa_column=Column(String(64), nullable=False))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    target: str = Field(sa_column=Column(Text, nullable=False))
    active_decision: str = Field(sa_column=Column(String(32), nullable=False))
    active_rule_id: str = Field(sa_column=Column(Text, nullable=False))
    active_reason: str | None = _text()
    active_revision: str | None = _text()
    shadow_decision: str = Field(sa_column=Column(String(32), nullable=False))
    shadow_rule_id: str = Field(sa_column=Column(Text, nullable=False))
    shadow_reason: str | None = _text()
    shadow_revision: str | None = _text()
    occurred_at: datetime = _ts()


class PolicyEventRow(SQLModel, table=True):
    """The agent's policy audit trail: activations, shadows set and cleared, promotions,
    rollbacks, each with the acting identity. Rollback reads the activations from it."""

    __tablename__ = "policy_events"
    __table_args__ = (Index("ix_policy_events_agent", "agent_id", "id"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    agent_id: str = Field(sa_column=Column(String(200), nullable=False))
    type: str = Field(sa_column=Column(String(40), nullable=False))
    seq: int | None = Field(default=None, sa_column=Column(Integer))  # the revision made active, if any
    shadow_id: int | None = Field(default=None, sa_column=Column(Integer))
    actor: str | None = _text()
    credential: str | None = Field(default=None, sa_column=Column(String(16)))
    payload: str = Field(sa_column=Column(Text, nullable=False))
    occurred_at: datetime = _ts()


class RequestSignatureRow(SQLModel, table=True):
    """Signed agent mutations the replicas accepted, kept until their timestamp leaves the signature
    window: the replay guard they share (docs/api.md, Replayed requests). UNLOGGED on PostgreSQL."""

    __tablename__ = "request_signatures"
    __table_args__ = (Index("ix_request_signatures_expires", "expires_at"),)

    agent_id: str = Field(sa_column=Column(String(200), primary_key=True))
    timestamp: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    signature: str = Field(sa_column=Column(String(80), primary_key=True))
    expires_at: datetime = _ts()


class SchemaVersionRow(SQLModel, table=True):
    __tablename__ = "regent_schema_version"

    version: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    applied_at: datetime = _ts()


agents = AgentRow.__table__  # type: ignore[attr-defined]
policy_revisions = PolicyRevisionRow.__table__  # type: ignore[attr-defined]
executions = ExecutionRow.__table__  # type: ignore[attr-defined]
events = EventRow.__table__  # type: ignore[attr-defined]
steps = StepRow.__table__  # type: ignore[attr-defined]
approvals = ApprovalRow.__table__  # type: ignore[attr-defined]
dispatches = DispatchRow.__table__  # type: ignore[attr-defined]
dispatch_step_counters = DispatchStepCounterRow.__table__  # type: ignore[attr-defined]
api_keys = ApiKeyRow.__table__  # type: ignore[attr-defined]
decisions = DecisionRow.__table__  # type: ignore[attr-defined]
decision_rollup = DecisionRollupRow.__table__  # type: ignore[attr-defined]
decision_rollup_hours = DecisionRollupHourRow.__table__  # type: ignore[attr-defined]
# The decision journal (docs/audit.md): where a decision's record is written, in its event's
# transaction; the cleanup of the journal moves rows into `decisions` in batches. It has the
# decisions columns and no index beyond its rowid key, so writing a record costs one append to
# one B-tree instead of eight index updates per step (SQLite: `INTEGER PRIMARY KEY` is the rowid).
decision_journal = Table(
    "decision_journal", SQLModel.metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    *(Column(c.name, c.type, nullable=c.nullable) for c in decisions.c),
)
policy_shadows = PolicyShadowRow.__table__  # type: ignore[attr-defined]
shadow_tallies = ShadowTallyRow.__table__  # type: ignore[attr-defined]
shadow_disagreements = ShadowDisagreementRow.__table__  # type: ignore[attr-defined]
policy_events = PolicyEventRow.__table__  # type: ignore[attr-defined]
request_signatures = RequestSignatureRow.__table__  # type: ignore[attr-defined]
schema_version = SchemaVersionRow.__table__  # type: ignore[attr-defined]
fork_bundles = ForkBundleRow.__table__  # type: ignore[attr-defined]
resources = ResourceRow.__table__  # type: ignore[attr-defined]
resource_checkpoints = ResourceCheckpointRow.__table__  # type: ignore[attr-defined]

metadata = SQLModel.metadata
