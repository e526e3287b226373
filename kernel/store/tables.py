"""The schema, declared once with SQLModel. The hot path uses SQLAlchemy Core on these tables.

JSON values are stored as compact JSON text (both dialects): args as their canonical text (number
lexemes intact), the rest as `json.dumps` output. Timestamps are UTC (`UTCDateTime`).

The execution tables are declared here; the audit and rollout tables in `audit_tables`, and the
column types in `columns`. Every table object is named here (`t.decisions` as `t.steps`), so the
store's modules read one namespace.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlmodel import Field, SQLModel

from kernel.store.audit_tables import (
    decision_journal,
    decision_rollup,
    decision_rollup_hours,
    decisions,
    mcp_tool_pins,
    policy_events,
    policy_shadows,
    shadow_disagreements,
    shadow_tallies,
)
from kernel.store.columns import UTCDateTime, text_field, ts


class AgentRow(SQLModel, table=True):
    __tablename__ = "agents"

    id: str = Field(sa_column=Column(String(200), primary_key=True))
    webhook_url: str = Field(sa_column=Column(Text, nullable=False))
    secret: str = Field(sa_column=Column(Text, nullable=False))
    lease_timeout_seconds: int | None = Field(default=None, sa_column=Column(Integer))
    registered_at: datetime = ts()
    description: str | None = text_field()
    input_schema: str | None = text_field()
    output_schema: str | None = text_field()


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
    created_at: datetime = ts()


def _where(sqlite: str, postgresql: str | None = None) -> dict[str, Any]:
    """A partial index's predicate on both stores. SQLite uses a partial index only when the query
    repeats its predicate's terms (`suspended = 1`, as SQLAlchemy renders `== true()` there) or,
    for `x IS NOT NULL`, compares x; PostgreSQL proves the implication from any strict operator."""
    return {"sqlite_where": text(sqlite), "postgresql_where": text(postgresql or sqlite)}


class ExecutionRow(SQLModel, table=True):
    __tablename__ = "executions"
    __table_args__ = (
        Index("ix_executions_agent", "agent_id", "id"),
        Index("ix_executions_status", "status", "id"),
        # Session admission reads a session's live and queued executions, oldest first.
        Index("ix_executions_session", "session", "status", "id"),
        # Partial (migration 018), as are the deadline and suspended indexes below: most executions
        # have no parent, no deadline and are not suspended, and a full index holds all those NULL
        # (or false) keys in heap order, so each execution insert or non-HOT update wrote one entry
        # at its tuple's place in the heap: a random leaf, read from disk, on a big store.
        Index("ix_executions_parent", "parent_execution_id", **_where("parent_execution_id IS NOT NULL")),
        # Retention's batch (migration 012): terminal executions created before the cutoff, of which
        # it keeps those updated since. Not updated_at: every step moves it, so an index on it would
        # be written twice a round trip (and on PostgreSQL end the executions row's HOT updates).
        Index("ix_executions_created", "status", "created_at"),
        # The repair sweep's suspended parents: few rows, set at a spawn, not on every step (012).
        Index("ix_executions_suspended", "suspended", **_where("suspended = 1", "suspended")),
        Index("ix_executions_deadline_at", "deadline_at", **_where("deadline_at IS NOT NULL")),
        UniqueConstraint("agent_id", "idempotency_key"),
    )

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    agent_id: str = Field(sa_column=Column(String(200), ForeignKey("agents.id"), nullable=False))
    input: str | None = text_field()
    status: str = Field(sa_column=Column(String(16), nullable=False))
    output: str | None = text_field()
    failure_reason: str | None = text_field()
    idempotency_key: str | None = Field(default=None, sa_column=Column(String(200)))
    last_event_seq: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    # Running token meter (sum of its steps' recorded usage), so a budget check is O(1).
    usage_input: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    usage_output: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = ts()
    updated_at: datetime = ts()
    deadline_at: datetime | None = ts(nullable=True)
    # The credential that created it: an API key's id, "bootstrap" or "dev". The key that created
    # an execution may not approve its steps.
    created_by: str | None = Field(default=None, sa_column=Column(String(36)))
    # Sessions, sub-agents and forks (migration 004; docs/architecture.md).
    session: str | None = Field(default=None, sa_column=Column(String(200)))
    parent_execution_id: str | None = Field(default=None, sa_column=Column(String(36)))
    spawned_step_id: str | None = Field(default=None, sa_column=Column(String(64)))
    previous_execution_id: str | None = Field(default=None, sa_column=Column(String(36)))
    state: str | None = text_field()
    forked_from: str | None = Field(default=None, sa_column=Column(String(36)))
    fork_seq: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    fork_bundle_id: int | None = Field(default=None, sa_column=Column(Integer))
    suspended: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    restoration: str | None = text_field()  # a fork's resources at its fork point (migration 010)


class ForkBundleRow(SQLModel, table=True):
    """A fork's own policy bundle: governs that execution in place of the agent's active one."""

    __tablename__ = "fork_bundles"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    agent_id: str = Field(sa_column=Column(String(200), nullable=False))
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    revision: str = Field(sa_column=Column(String(200), nullable=False))
    content: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = ts()


class ResourceRow(SQLModel, table=True):
    """An external resource an execution registered (a sandbox, say): binding and checkpoint state."""

    __tablename__ = "resources"

    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), primary_key=True)
    )
    key: str = Field(sa_column=Column(String(200), primary_key=True))
    driver_id: str = Field(sa_column=Column(Text, nullable=False))
    configuration: str | None = text_field()
    coverage_reuse: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    every_steps: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    on_completion: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    generation: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    binding: str | None = text_field()
    checkpoint_ref: str | None = text_field()  # the restored-from (or latest captured) checkpoint
    covered: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    steps_since_capture: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    created_at: datetime = ts()
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
    created_at: datetime = ts()


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
    occurred_at: datetime = ts()


class StepRow(SQLModel, table=True):
    __tablename__ = "steps"
    __table_args__ = (
        # Also the index of an execution's steps (its first column): a second index on execution_id
        # alone was dropped in migration 014 (PostgreSQL's generic plan of a submit's read took it).
        UniqueConstraint("execution_id", "kind", "target", "args_hash", "occurrence"),
        PrimaryKeyConstraint("execution_id", "step_id"),
    )

    # The primary key is (execution_id, step_id) (migration 017): a step id is a content hash, so
    # a key on it alone put every insert on a random leaf of a large index (one index block read
    # and a WAL full-page image per round trip on a year-old store); execution ids are UUIDv7, so
    # inserts now land at the index's right edge. Every read or update by step id binds its
    # execution (kernel/store/statements.py); no index on step_id alone.
    step_id: str = Field(sa_column=Column(String(64), primary_key=True))
    execution_id: str = Field(
        sa_column=Column(
            String(36), ForeignKey("executions.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    kind: str = Field(sa_column=Column(Text, nullable=False))
    target: str = Field(sa_column=Column(Text, nullable=False))
    args_hash: str = Field(sa_column=Column(String(64), nullable=False))
    occurrence: int = Field(sa_column=Column(Integer, nullable=False))
    status: str = Field(sa_column=Column(String(20), nullable=False))
    idempotency: str = Field(sa_column=Column(Text, nullable=False))
    args: str | None = text_field()
    result: str | None = text_field()
    error: str | None = text_field()
    usage_input: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    usage_output: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    started_at: datetime | None = ts(nullable=True)
    completed_at: datetime | None = ts(nullable=True)
    # The seq of the event that recorded its terminal outcome (migration 006): a fork reads its
    # source's steps whose outcome is at or before the fork point (docs/api.md, "Forks").
    outcome_seq: int | None = Field(default=None, sa_column=Column(BigInteger))


class ApprovalRow(SQLModel, table=True):
    __tablename__ = "approvals"
    __table_args__ = (
        Index("ix_approvals_status", "status", "created_at"),
        # The expiry sweep (pending, past timeout_at) and retention's delete by execution (012).
        Index("ix_approvals_due", "status", "timeout_at"),
        Index("ix_approvals_execution", "execution_id"),
        Index("ix_approvals_decided", "decided_at", "id"),  # migration 014: the inbox's poll
    )

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    step_id: str = Field(sa_column=Column(String(64), nullable=False, index=True))
    execution_id: str = Field(
        sa_column=Column(String(36), ForeignKey("executions.id", ondelete="CASCADE"), nullable=False)
    )
    status: str = Field(sa_column=Column(String(16), nullable=False))
    approvers: str | None = text_field()
    message: str | None = text_field()
    timeout_at: datetime = ts()
    decided_by: str | None = text_field()
    asserted_by: str | None = text_field()
    decided_at: datetime | None = ts(nullable=True)
    rationale: str | None = text_field()
    created_at: datetime = ts()
    # What the approver decides on (the step's args are read from its row): who asked, and why.
    agent_id: str | None = Field(default=None, sa_column=Column(String(200)))
    kind: str | None = text_field()
    target: str | None = text_field()
    rule_id: str | None = text_field()
    reason: str | None = text_field()
    policy_hash: str | None = Field(default=None, sa_column=Column(String(64)))
    policy_kind: str | None = Field(default=None, sa_column=Column(String(16)))
    policy_revision: str | None = text_field()
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
    next_attempt_at: datetime = ts()
    locked_by: str | None = Field(default=None, sa_column=Column(String(200)))
    locked_at: datetime | None = ts(nullable=True)
    created_at: datetime = ts()
    updated_at: datetime = ts()
    # The lease of the in-flight attempt: its period in milliseconds (the default lease may be
    # fractional), fixed at the claim (the agent's lease_timeout_seconds, else the kernel default:
    # what the webhook body told the agent), and its expiry, locked_at + that period, moved on by
    # every renewal. Stale once the row leaves in_flight; only in-flight rows are read for expiry.
    lease_ms: int | None = Field(default=None, sa_column=Column(Integer))
    lease_expires_at: datetime | None = ts(nullable=True)


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
    created_at: datetime = ts()
    revoked_at: datetime | None = ts(nullable=True)
    expires_at: datetime | None = ts(nullable=True)
    created_by: str | None = text_field()
    last_used_at: datetime | None = ts(nullable=True)


class RequestSignatureRow(SQLModel, table=True):
    """Signed agent mutations the replicas accepted, kept until their timestamp leaves the signature
    window: the replay guard they share (docs/api.md, Replayed requests). UNLOGGED on PostgreSQL."""

    __tablename__ = "request_signatures"
    __table_args__ = (Index("ix_request_signatures_expires", "expires_at"),)

    agent_id: str = Field(sa_column=Column(String(200), primary_key=True))
    timestamp: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    signature: str = Field(sa_column=Column(String(80), primary_key=True))
    expires_at: datetime = ts()



class SchemaVersionRow(SQLModel, table=True):
    __tablename__ = "regent_schema_version"

    version: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    applied_at: datetime = ts()


agents = AgentRow.__table__  # type: ignore[attr-defined]
policy_revisions = PolicyRevisionRow.__table__  # type: ignore[attr-defined]
executions = ExecutionRow.__table__  # type: ignore[attr-defined]
events = EventRow.__table__  # type: ignore[attr-defined]
steps = StepRow.__table__  # type: ignore[attr-defined]
approvals = ApprovalRow.__table__  # type: ignore[attr-defined]
dispatches = DispatchRow.__table__  # type: ignore[attr-defined]
dispatch_step_counters = DispatchStepCounterRow.__table__  # type: ignore[attr-defined]
api_keys = ApiKeyRow.__table__  # type: ignore[attr-defined]
request_signatures = RequestSignatureRow.__table__  # type: ignore[attr-defined]
schema_version = SchemaVersionRow.__table__  # type: ignore[attr-defined]
fork_bundles = ForkBundleRow.__table__  # type: ignore[attr-defined]
resources = ResourceRow.__table__  # type: ignore[attr-defined]
resource_checkpoints = ResourceCheckpointRow.__table__  # type: ignore[attr-defined]

metadata = SQLModel.metadata

# Every table, and the column type the statements bind with: the store's one namespace.
__all__ = [
    "UTCDateTime", "agents", "api_keys", "approvals", "decision_journal", "decision_rollup", "decision_rollup_hours",
    "decisions", "dispatch_step_counters", "dispatches", "events", "executions", "fork_bundles", "mcp_tool_pins",
    "metadata",
    "policy_events", "policy_revisions", "policy_shadows", "request_signatures", "resource_checkpoints", "resources",
    "schema_version", "shadow_disagreements", "shadow_tallies", "steps",
]
