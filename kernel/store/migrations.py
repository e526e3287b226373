"""Numbered schema migrations with a version table (`regent migrate`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection

from kernel.store import tables as t
from kernel.store.base import SqlStore


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[Connection], None]


def _initial(conn: Connection) -> None:
    # 001 is the schema as declared in tables.py. Until the first release it is edited in place;
    # from then on every change is a new numbered migration with explicit DDL.
    core = [
        t.agents,
        t.policy_revisions,
        t.executions,
        t.events,
        t.steps,
        t.approvals,
        t.dispatches,
        t.dispatch_step_counters,
        t.api_keys,
    ]
    t.metadata.create_all(conn, tables=core)


MIGRATIONS: list[Migration] = [Migration(1, "initial schema", _initial)]
LATEST = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table("regent_schema_version"):
        return 0
    v = conn.execute(select(t.schema_version.c.version).order_by(t.schema_version.c.version.desc())).first()
    return int(v[0]) if v else 0


def migrate(store: SqlStore) -> list[Migration]:
    """Apply every pending migration, each in its own transaction. Returns what was applied."""
    applied: list[Migration] = []
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            # Replicas starting together must not race each other through DDL.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended('regent_migrate', 0))"))
        t.metadata.create_all(conn, tables=[t.schema_version])
        have = current_version(conn)
        for m in MIGRATIONS:
            if m.version <= have:
                continue
            m.apply(conn)
            conn.execute(t.schema_version.insert().values(version=m.version, applied_at=datetime.now(UTC)))
            applied.append(m)
    return applied
