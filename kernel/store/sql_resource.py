"""`Tx`'s queries for resources and their checkpoints (docs/api.md, "Resources and checkpoints").
Mixed into `Tx` (sql.py), which supplies `conn` and `w`. An execution has a handful of resources,
so these are plain Core statements, off the hot path (a step that declares no resource never
reaches them).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select, update

from kernel.store import tables as t
from kernel.store.dialect import TxPart


class ResourceQueries(TxPart):
    def get_resource(self, execution_id: str, key: str) -> Any:
        c = t.resources.c
        return self.conn.execute(select(t.resources).where(c.execution_id == execution_id, c.key == key)).first()

    def list_resources(self, execution_id: str) -> list[Any]:
        c = t.resources.c
        return list(self.conn.execute(select(t.resources).where(c.execution_id == execution_id).order_by(c.key)).all())

    def insert_resource(self, row: dict[str, Any]) -> None:
        self.w.execute(insert(t.resources).values(**row))

    def update_resource(self, execution_id: str, key: str, **values: Any) -> None:
        c = t.resources.c
        self.w.execute(update(t.resources).where(c.execution_id == execution_id, c.key == key).values(**values))

    def insert_checkpoint(
        self, execution_id: str, key: str, generation: int, checkpoint_ref: str, event_seq: int, now: datetime,
    ) -> None:
        self.w.execute(insert(t.resource_checkpoints).values(
            execution_id=execution_id, key=key, generation=generation, checkpoint_ref=checkpoint_ref,
            event_seq=event_seq, superseded_seq=None, created_at=now,
        ))

    def supersede_checkpoints(self, execution_id: str, key: str, seq: int) -> None:
        """A step changed the resource at `seq`: its checkpoints stop covering from there on."""
        c = t.resource_checkpoints.c
        self.w.execute(
            update(t.resource_checkpoints)
            .where(c.execution_id == execution_id, c.key == key, c.superseded_seq.is_(None))
            .values(superseded_seq=seq)
        )

    def checkpoint_at(self, execution_id: str, key: str, seq: int, covering: bool) -> Any:
        """The newest checkpoint recorded at or before `seq`; with `covering`, only one that still
        covered `seq` (no step changed the resource between it and `seq`)."""
        c = t.resource_checkpoints.c
        q = select(t.resource_checkpoints).where(c.execution_id == execution_id, c.key == key, c.event_seq <= seq)
        if covering:
            q = q.where(or_(c.superseded_seq.is_(None), c.superseded_seq > seq))
        return self.conn.execute(q.order_by(c.event_seq.desc(), c.id.desc()).limit(1)).first()

    def list_checkpoints(self, execution_id: str) -> list[Any]:
        c = t.resource_checkpoints.c
        q = select(t.resource_checkpoints).where(c.execution_id == execution_id).order_by(c.event_seq, c.id)
        return list(self.conn.execute(q).all())
