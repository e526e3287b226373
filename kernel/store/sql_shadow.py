"""`Tx`'s queries on shadow bundles, their tallies and disagreements, and the policy audit trail.
Mixed into `Tx` (sql.py), which supplies `store`, `conn` and `w`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from kernel.domain.decision import TallyKey
from kernel.store import tables as t
from kernel.store.dialect import TxPart

SHADOWING = "shadowing"


class ShadowQueries(TxPart):
    # -- shadow bundles -------------------------------------------------------------------
    def add_shadow(self, agent_id: str, kind: str, revision: str, content: str, now: datetime,
                   created_by: str | None) -> int:
        """Store a new shadow for the agent; the one it replaces ends as `replaced`."""
        self.end_shadows(agent_id, "replaced", now)
        r = self.w.execute(
            insert(t.policy_shadows).values(
                agent_id=agent_id, kind=kind, revision=revision, content=content, status=SHADOWING,
                created_at=now, created_by=created_by,
            ).returning(t.policy_shadows.c.id)
        )
        return int(r.scalar_one())

    def end_shadows(self, agent_id: str, status: str, now: datetime) -> int:
        c = t.policy_shadows.c
        return self.w.execute(
            update(t.policy_shadows).where(c.agent_id == agent_id, c.status == SHADOWING)
            .values(status=status, ended_at=now)
        ).rowcount

    def current_shadow(self, agent_id: str) -> Any:
        c = t.policy_shadows.c
        return self.conn.execute(
            select(t.policy_shadows).where(c.agent_id == agent_id, c.status == SHADOWING)
            .order_by(c.id.desc()).limit(1)
        ).first()

    def latest_shadow(self, agent_id: str) -> Any:
        c = t.policy_shadows.c
        return self.conn.execute(
            select(t.policy_shadows).where(c.agent_id == agent_id).order_by(c.id.desc()).limit(1)
        ).first()

    def get_shadow(self, shadow_id: int) -> Any:
        return self.conn.execute(select(t.policy_shadows).where(t.policy_shadows.c.id == shadow_id)).first()

    def shadowing_refs(self) -> list[Any]:
        """(id, agent_id, kind, revision) of every shadow being evaluated, without content."""
        c = t.policy_shadows.c
        return list(self.conn.execute(
            select(c.id, c.agent_id, c.kind, c.revision).where(c.status == SHADOWING)
        ).all())

    def shadow_content(self, shadow_id: int) -> str | None:
        v = self.conn.execute(
            select(t.policy_shadows.c.content).where(t.policy_shadows.c.id == shadow_id)
        ).scalar()
        return None if v is None else str(v)

    def set_shadow_error(self, shadow_id: int, reason: str) -> None:
        self.w.execute(
            update(t.policy_shadows).where(t.policy_shadows.c.id == shadow_id).values(last_error=reason[:2000])
        )

    # -- tallies and disagreements -----------------------------------------------------------
    def add_shadow_tallies(self, shadow_id: int, counts: Mapping[TallyKey, int]) -> None:
        """Add to the counters; run under the lock `shadow:<id>` so replicas do not race the insert."""
        c = t.shadow_tallies.c
        for (outcome, active, shadow), n in counts.items():
            where = (c.shadow_id == shadow_id, c.outcome == outcome, c.active_decision == active,
                     c.shadow_decision == shadow)
            if self.w.execute(update(t.shadow_tallies).where(*where).values(count=c.count + n)).rowcount == 0:
                self.w.execute(insert(t.shadow_tallies).values(
                    shadow_id=shadow_id, outcome=outcome, active_decision=active, shadow_decision=shadow, count=n))

    def add_shadow_disagreements(self, rows: Iterable[dict[str, Any]]) -> None:
        batch = list(rows)
        if batch:
            self.w.execute(insert(t.shadow_disagreements), batch)

    def delete_shadow_disagreements_before(self, cutoff: datetime, limit: int) -> int:
        """Retention: up to `limit` disagreement rows that occurred before `cutoff`, oldest first.
        Rows are appended in about time order (each replica's batches), so walking the key
        from its start finds them without an index on the time."""
        c = t.shadow_disagreements.c
        ids = select(c.id).where(c.occurred_at < cutoff).order_by(c.id).limit(limit).scalar_subquery()
        return int(self.w.execute(delete(t.shadow_disagreements).where(c.id.in_(ids))).rowcount)

    def shadow_tallies(self, shadow_id: int) -> list[Any]:
        c = t.shadow_tallies.c
        return list(self.conn.execute(
            select(c.outcome, c.active_decision, c.shadow_decision, c.count).where(c.shadow_id == shadow_id)
        ).all())

    def shadow_disagreement_counts(self, shadow_id: int, column: str, limit: int) -> list[tuple[str, int]]:
        """The most frequent values of `column` (target, active_rule_id, shadow_rule_id) among
        the shadow's disagreements."""
        col = t.shadow_disagreements.c[column]
        n = func.count().label("n")
        q = (select(col, n).where(t.shadow_disagreements.c.shadow_id == shadow_id)
             .group_by(col).order_by(n.desc(), col).limit(limit))
        return [(str(r[0]), int(r[1])) for r in self.conn.execute(q).all()]

    def shadow_disagreement_samples(self, shadow_id: int, limit: int) -> list[Any]:
        c = t.shadow_disagreements.c
        return list(self.conn.execute(
            select(t.shadow_disagreements).where(c.shadow_id == shadow_id).order_by(c.id.desc()).limit(limit)
        ).all())

    # -- the policy audit trail ----------------------------------------------------------------
    def add_policy_event(self, agent_id: str, type_: str, now: datetime, *, actor: str | None,
                         credential: str | None, seq: int | None = None, shadow_id: int | None = None,
                         payload: Mapping[str, Any] | None = None) -> None:
        self.w.execute(insert(t.policy_events).values(
            agent_id=agent_id, type=type_, seq=seq, shadow_id=shadow_id, actor=actor, credential=credential,
            payload=json.dumps(dict(payload or {}), separators=(",", ":"), sort_keys=True), occurred_at=now,
        ))

    def policy_events(self, agent_id: str, limit: int, types: Iterable[str] | None = None) -> list[Any]:
        """The agent's policy audit events, newest first."""
        c = t.policy_events.c
        q = select(t.policy_events).where(c.agent_id == agent_id)
        if types is not None:
            q = q.where(c.type.in_(list(types)))
        return list(self.conn.execute(q.order_by(c.id.desc()).limit(limit)).all())
