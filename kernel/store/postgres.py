"""PostgreSQL, for several replicas: advisory locks per execution, SKIP LOCKED claims, a leader lock."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import generators
from psycopg.pq import Escaping, ExecStatus, TransactionStatus
from sqlalchemy import create_engine, func, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from kernel.store.base import SqlStore, end_transaction
from kernel.store.prepared import Prepared
from kernel.store.sql import Tx

_LOCK = Prepared(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"))
_TRY_LOCK = text("SELECT pg_try_advisory_lock(hashtextextended(:k, 0))")
_UNLOCK = text("SELECT pg_advisory_unlock(hashtextextended(:k, 0))")
_IDLE = TransactionStatus.IDLE
_FATAL = ExecStatus.FATAL_ERROR


def driver_url(url: str) -> str:
    """`postgresql://…` → SQLAlchemy's psycopg 3 driver URL."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url}")


class PostgresStore(SqlStore):
    dialect = "postgresql"
    insert = staticmethod(pg_insert)
    greatest = func.greatest
    # A Connection idle for longer goes back through the pool, whose pre-ping replaces one the
    # server dropped; one used within the last second is handed out again as it is.
    idle_fresh_seconds = 1.0

    def __init__(self, url: str, *, pool_size: int = 10, max_overflow: int = 20):
        engine = create_engine(
            driver_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_pre_ping=True,
            # Lock waits are bounded so a stuck replica cannot wedge the others forever.
            connect_args={"options": "-c lock_timeout=10000 -c statement_timeout=30000"},
        )
        super().__init__(engine, url)

    def unavailable_reason(self, exc: BaseException) -> str | None:
        # Connection failures (no SQLSTATE: refused, reset), class 08 (connection exception),
        # 57 (operator intervention: admin shutdown, the server starting up) and 53 (insufficient
        # resources: disk full, too many connections). Serialization failures and the like are
        # not outages and keep their own meaning.
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, psycopg.OperationalError):
            state = getattr(orig, "sqlstate", None)
            if state is None or state[:2] in ("08", "57", "53"):
                return ("the database refused or lost the connection" if state is None or state[:2] != "53"
                        else "the database is out of resources (disk or connections)")
        return super().unavailable_reason(exc)

    def conflict_reason(self, exc: IntegrityError) -> str:
        # The server's message repeats the offending key's values (DETAIL: Key (id)=(…)): only
        # the constraint's name is kept.
        name = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
        return f"constraint {name} failed" if name else super().conflict_reason(exc)

    def _lock_execution(self, conn: Connection, execution_id: str) -> None:
        # Transaction-scoped: released by COMMIT/ROLLBACK, so no code path can leak it.
        _LOCK.run(conn, {"k": f"execution:{execution_id}"})

    @contextmanager
    def transaction(self, lock: str | None = None, session: str | None = None,
                    write: bool = False) -> Iterator[Tx]:
        """As `SqlStore.transaction` (`write` changes nothing here); the transaction's BEGIN and its first locks (the session's,
        then the execution's) go to the server as one query, one network round trip instead of
        psycopg's BEGIN and then one per lock."""
        with self._begin(write=True) as conn:
            names = [f"session:{session}"] if session is not None else []
            if lock is not None:
                names.append(lock)
            if names:
                self._begin_locked(conn, names)
            yield Tx(self, conn, lock_more=lambda eid: self._lock_execution(conn, eid))

    @contextmanager
    def autocommit(self) -> Iterator[Tx]:
        """As `SqlStore.autocommit`: the driver connection in autocommit mode, so the use case's one
        statement is sent without BEGIN and committed as it runs (synchronous_commit as any
        COMMIT): one network round trip instead of three."""
        with self._connection() as conn:
            raw: Any = conn.connection.driver_connection
            if conn.in_transaction() or raw.pgconn.transaction_status != _IDLE:
                with self._begin_on(conn) as tx:
                    yield tx
                return
            raw.autocommit = True
            try:
                yield Tx(self, conn)
                end_transaction(conn, commit=True)  # a Core statement run through the Connection
            finally:
                if raw.pgconn.transaction_status == _IDLE:
                    raw.autocommit = False
                else:  # lost, or left inside a transaction: never handed out again
                    conn.invalidate()

    @contextmanager
    def _begin_on(self, conn: Connection) -> Iterator[Tx]:
        try:
            yield Tx(self, conn)
        except BaseException:
            end_transaction(conn, commit=False)
            raise
        end_transaction(conn, commit=True)

    def _begin_locked(self, conn: Connection, names: list[str]) -> None:
        """BEGIN and `pg_advisory_xact_lock` of each of `names` (in that order), sent as one
        simple-protocol query: its statements run in order, and the first that fails (a lock
        timeout) fails the transaction as a lock statement of its own would."""
        raw: Any = conn.connection.driver_connection
        pgconn = raw.pgconn
        if conn.in_transaction() or pgconn.transaction_status != _IDLE:
            for name in names:
                self._lock_execution(conn, name)
            return
        esc = Escaping(pgconn)
        # The key is a literal (escaped by libpq for this connection), not a parameter: the
        # simple protocol takes several statements only without parameters.
        locks = b"".join(b"; SELECT pg_advisory_xact_lock(hashtextextended(" + esc.escape_literal(
            f"execution:{name}".encode()) + b", 0))" for name in names)
        query = raw._get_tx_start_command() + locks  # BEGIN with the connection's options, as psycopg's
        try:
            with raw.lock:
                pgconn.send_query(query)
                results = raw.wait(generators.execute(pgconn))
            for res in results:
                if res.status == _FATAL:
                    raise psycopg.errors.error_from_result(res, encoding=pgconn._encoding)
        except psycopg.Error as exc:
            conn._handle_dbapi_exception(exc, query.decode(), None, None, None)

    def upsert(self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str]) -> None:
        stmt = pg_insert(table).values(**values)
        keys = set(key)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(keys), set_={k: stmt.excluded[k] for k in values if k not in keys}
        )
        conn.execute(stmt)


    def due_dispatch_ids(self, conn: Connection, now: datetime, limit: int) -> list[str]:
        # SKIP LOCKED: replicas claiming at the same moment take disjoint rows instead of queueing.
        q = self.due_dispatch_query(now, limit).with_for_update(skip_locked=True)
        return [r[0] for r in conn.execute(q).all()]

    def due_by_agent(self, conn: Connection, now: datetime, limit: int, skip_agents: Collection[str],
                     skip_ids: Collection[str], lock: bool = True) -> list[tuple[str, str]]:
        # SKIP LOCKED as above, of the dispatch rows only: the executions read for their agent
        # stay unlocked.
        return super().due_by_agent(conn, now, limit, skip_agents, skip_ids, lock=lock)

    @contextmanager
    def leader(self, name: str) -> Iterator[bool]:
        # Session-level try-lock on a dedicated connection: one replica runs the tick, others skip.
        with self.engine.connect() as conn:
            got = bool(conn.execute(_TRY_LOCK, {"k": name}).scalar())
            conn.commit()
            try:
                yield got
            finally:
                if got:
                    conn.execute(_UNLOCK, {"k": name})
                    conn.commit()
