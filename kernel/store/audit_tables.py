"""The audit and rollout tables: the durable decision record (its journal and hourly rollup),
shadow bundles with their tallies and disagreements, the policy audit trail and the MCP tool pins
(docs/audit.md, docs/policy-rollout.md, docs/mcp.md). Declared apart from the execution tables in `tables`, which names them too."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, ForeignKey, Index, Integer, String, Table, Text, text
from sqlmodel import Field, SQLModel

from kernel.store.columns import UTCDateTime, text_field, ts


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
    reason: str | None = text_field()
    policy_kind: str = Field(sa_column=Column(String(16), nullable=False))
    policy_revision: str = Field(sa_column=Column(Text, nullable=False))
    policy_hash: str = Field(sa_column=Column(String(64), nullable=False))
    decided_by: str | None = text_field()
    credential: str | None = Field(default=None, sa_column=Column(String(16)))
    event_seq: int | None = Field(default=None, sa_column=Column(BigInteger))
    decided_at: datetime = ts()
    judge: str | None = text_field()  # JSON: the judge's record (asked, answered, outcome, latency), judge rules only


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
    rolled_up_at: datetime = ts()


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
    created_at: datetime = ts()
    created_by: str | None = text_field()
    ended_at: datetime | None = ts(nullable=True)
    last_error: str | None = text_field()  # the latest shadow fault's reason


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
    active_reason: str | None = text_field()
    active_revision: str | None = text_field()
    shadow_decision: str = Field(sa_column=Column(String(32), nullable=False))
    shadow_rule_id: str = Field(sa_column=Column(Text, nullable=False))
    shadow_reason: str | None = text_field()
    shadow_revision: str | None = text_field()
    occurred_at: datetime = ts()


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
    actor: str | None = text_field()
    credential: str | None = Field(default=None, sa_column=Column(String(16)))
    payload: str = Field(sa_column=Column(Text, nullable=False))
    occurred_at: datetime = ts()


class ToolPinRow(SQLModel, table=True):
    """An agent's MCP tool (docs/mcp.md, "Pinned tool definitions"): the definition the gateways
    last reported offering and the one approved, with who approved it; the approvals themselves
    are events of the policy audit trail (`mcp.tool_approved`)."""

    __tablename__ = "mcp_tool_pins"

    agent_id: str = Field(
        sa_column=Column(String(200), ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    )
    tool: str = Field(sa_column=Column(String(200), primary_key=True))
    upstream: str | None = Field(default=None, sa_column=Column(String(64)))
    offered_sha256: str | None = Field(default=None, sa_column=Column(String(64)))
    offered_definition: str | None = text_field()  # canonical JSON, ASCII (an upstream's text is hostile)
    offered_at: datetime | None = ts(nullable=True)
    approved_sha256: str | None = Field(default=None, sa_column=Column(String(64)))
    approved_definition: str | None = text_field()  # as offered when approved (None from a manifest pin)
    approved_by: str | None = text_field()
    approved_credential: str | None = Field(default=None, sa_column=Column(String(16)))
    approved_via: str | None = Field(default=None, sa_column=Column(String(24)))
    approved_at: datetime | None = ts(nullable=True)


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
mcp_tool_pins = ToolPinRow.__table__  # type: ignore[attr-defined]
