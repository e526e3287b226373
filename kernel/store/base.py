"""`SqlStore`: opens the transactions every use case runs in, on a cache of open Connections.

Dialect modules subclass it with the engine, the per-execution lock, upserts and the dispatch
claim; `Tx` (sql.py) holds the queries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine, bindparam, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from kernel.domain import DispatchStatus
from kernel.errors import StoreConflict, StoreUnavailable
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.prepared import PreparedCache, driver
from kernel.store.sql import Tx


class CommitGroups(Protocol):
    """The group-commit hook a lane thread drives (kernel/lane.py): a store that can hold a
    thread's write transaction open across use cases and commit them together implements it
    (SQLite, `SqliteStore.commit_groups`)."""

    def attach(self) -> None: ...
    def start(self, token: Any) -> None: ...
    def is_open(self) -> bool: ...
    def pending(self, token: Any) -> bool: ...
    def failure(self, token: Any) -> BaseException | None: ...
    def flush(self) -> None: ...


class SqlStore:
    """Base for the dialect stores. `transaction(lock=…)` is the one way to mutate."""

    dialect = "sql"

    # How long an idle Connection may sit in the cache and still be handed out without going back
    # through the pool (whose pre-ping would notice a server restart); None: no limit.
    idle_fresh_seconds: float | None = None

    # The dialect's INSERT (with on_conflict_do_update) and its two-argument maximum function.
    insert: Any = None
    greatest: Any = None

    def __init__(self, engine: Engine, url: str):
        self.engine = engine
        self.url = url
        self._upsert_max = _upsert_max_cache(type(self).insert, type(self).greatest)
        self._insert_new = _insert_new_cache(type(self).insert)
        # Connections kept open between transactions (LIFO, at most _IDLE_MAX): checking a
        # Connection out of the pool and back cost more than a step's reads.
        self._idle: list[tuple[Connection, float]] = []
        # Large execution inputs, decoded once for the step path (see codec.DecodedInputs).
        self.inputs = codec.DecodedInputs()

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A SQLAlchemy Connection for one transaction, reused from the idle cache when there is
        a fresh one. A Connection that was invalidated (its driver connection lost), closed, or
        left inside a transaction is not kept."""
        conn = None
        while self._idle:
            try:
                cached, since = self._idle.pop()
            except IndexError:  # another thread took the last one
                break
            fresh = self.idle_fresh_seconds
            if fresh is None or time.monotonic() - since <= fresh:
                conn = cached
                break
            cached.close()  # stale: back to the pool, whose checkout pre-pings
        try:
            if conn is None:
                conn = self.engine.connect()
        except DBAPIError as exc:
            why = self.unavailable_reason(exc) or "cannot connect to the database"
            raise StoreUnavailable(f"store unavailable: {why}") from exc
        broken = False
        try:
            yield conn
        except Exception as exc:
            # A database that cannot be reached or written (a lost connection, a full disk) is a
            # 503 the client can retry, not an internal error; anything else stays what it is.
            # (The hot path runs driver statements and commits, so driver errors arrive here too.)
            # A broken constraint becomes the kernel's StoreConflict: the core never sees SQLAlchemy.
            reason = self.unavailable_reason(exc)
            if reason is None:
                conflict = self.conflict(exc)
                if conflict is not None:
                    raise conflict from exc
                raise
            broken = True  # its transaction state is unknown: never hand it out again
            raise StoreUnavailable(f"store unavailable: {reason}") from exc
        finally:
            if broken:
                try:
                    conn.close()
                except Exception:
                    conn.invalidate()
            elif (conn.invalidated or conn.closed or conn.in_transaction() or len(self._idle) >= _IDLE_MAX
                    or _driver_in_transaction(conn)):
                conn.close()
            else:
                self._idle.append((conn, time.monotonic()))

    # Dialect hooks -----------------------------------------------------------------------
    def unavailable_reason(self, exc: BaseException) -> str | None:
        """Why the database cannot serve right now (said without SQL or parameters: they may
        hold agent input), or None when `exc` is some other fault."""
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return "the database connection was lost"
        return None

    def conflict(self, exc: BaseException) -> StoreConflict | None:
        """The kernel's error for a driver's integrity error (a unique key taken, a referenced row
        gone), or None when `exc` is some other fault."""
        if not isinstance(exc, IntegrityError):
            return None
        return StoreConflict(f"store conflict: {self.conflict_reason(exc)}")

    def conflict_reason(self, exc: IntegrityError) -> str:
        """Which constraint the write broke, said without SQL or values (they may hold agent input)."""
        return "a write broke a uniqueness or reference constraint"

    def _lock_execution(self, conn: Connection, execution_id: str) -> None:
        raise NotImplementedError

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Connection]:
        """A transaction on a cached Connection, ended at the driver (see `end_transaction`)."""
        with self._connection() as conn:
            try:
                yield conn
            except BaseException:
                end_transaction(conn, commit=False)
                raise
            end_transaction(conn, commit=True)

    def upsert(self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str]) -> None:
        raise NotImplementedError

    def insert_new(self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str]) -> bool:
        """INSERT … ON CONFLICT (key) DO NOTHING; whether a row was inserted (by RETURNING: the
        driver's rowcount is -1 here on PostgreSQL)."""
        return self._insert_new.get((table.name, tuple(values), tuple(key))).first(conn, values) is not None

    def upsert_max(
        self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str], column: str
    ) -> None:
        """INSERT … ON CONFLICT (key) DO UPDATE SET column = the larger of the two (prepared)."""
        self._upsert_max.get((table.name, tuple(values), tuple(key), column)).run(conn, values)

    @staticmethod
    def due_dispatch_query(now: datetime, limit: int) -> Any:
        """Pending or failed rows whose next attempt is due, oldest due first."""
        c = t.dispatches.c
        return (
            select(c.id)
            .where(
                or_(c.status == DispatchStatus.PENDING.value, c.status == DispatchStatus.FAILED.value),
                c.next_attempt_at <= now,
            )
            .order_by(c.next_attempt_at, c.id)
            .limit(limit)
        )

    def due_dispatch_ids(self, conn: Connection, now: datetime, limit: int) -> list[str]:
        return [r[0] for r in conn.execute(self.due_dispatch_query(now, limit)).all()]

    @staticmethod
    def due_by_agent_query(now: datetime, limit: int, skip_agents: Collection[str], skip_ids: Collection[str],
                           lock: bool = False) -> Any:
        """Due rows, oldest due first, leaving out the rows in `skip_ids`: (dispatch id, agent id)
        without the agents in `skip_agents` (their share of deliveries is taken), or, when there
        are none, (dispatch id, execution id); `lock`: FOR UPDATE SKIP LOCKED of the dispatch rows
        (PostgreSQL)."""
        c, e = t.dispatches.c, t.executions.c
        due = (or_(c.status == DispatchStatus.PENDING.value, c.status == DispatchStatus.FAILED.value),
               c.next_attempt_at <= now)
        if skip_agents:
            # Leaving agents out needs every due row's agent: one primary-key lookup per due row
            # before the sort (behind 10 000 rows of one left-out agent on SQLite, 11 ms against
            # 5 ms for the query below), so the dispatcher runs it at most once per poll.
            q = (select(c.id, e.agent_id).select_from(t.dispatches.join(t.executions, e.id == c.execution_id))
                 .where(*due, e.agent_id.not_in(sorted(skip_agents))))
            if skip_ids:
                q = q.where(c.id.not_in(sorted(skip_ids)))
            q = q.order_by(c.next_attempt_at, c.id).limit(limit)
            return q.with_for_update(skip_locked=True, of=t.dispatches) if lock else q
        # Otherwise the oldest rows, and then the agents of those rows only (`due_by_agent`).
        q = select(c.id, c.execution_id).where(*due)
        if skip_ids:
            q = q.where(c.id.not_in(sorted(skip_ids)))
        q = q.order_by(c.next_attempt_at, c.id).limit(limit)
        return q.with_for_update(skip_locked=True) if lock else q

    def due_by_agent(self, conn: Connection, now: datetime, limit: int, skip_agents: Collection[str],
                     skip_ids: Collection[str], lock: bool = False) -> list[tuple[str, str]]:
        rows = conn.execute(self.due_by_agent_query(now, limit, skip_agents, skip_ids, lock)).all()
        if skip_agents:
            return [(r[0], r[1]) for r in rows]
        e = t.executions.c
        agents: dict[str, str] = {}
        if rows:
            for eid, agent in conn.execute(select(e.id, e.agent_id).where(e.id.in_({r[1] for r in rows}))).all():
                agents[eid] = agent
        return [(r[0], agents[r[1]]) for r in rows if r[1] in agents]

    @contextmanager
    def leader(self, name: str) -> Iterator[bool]:
        """Singleton work: yields True on the replica that holds the leader lock this tick."""
        yield True

    # Public ------------------------------------------------------------------------------
    @contextmanager
    def transaction(self, lock: str | None = None, session: str | None = None,
                    write: bool = False) -> Iterator[Tx]:
        """A write transaction; `lock` names an execution whose mutations it serialises, `session`
        a session whose admission it serialises (taken first: session, then executions).
        `write=True` says the use case writes and evaluates nothing slow before it does: SQLite
        then takes its write lock at BEGIN (no read snapshot first); here it changes nothing."""
        with self._begin(write=True) as conn:
            if session is not None:
                self._lock_execution(conn, f"session:{session}")
            if lock is not None:
                self._lock_execution(conn, lock)
            yield Tx(self, conn, lock_more=lambda eid: self._lock_execution(conn, eid))

    @contextmanager
    def autocommit(self) -> Iterator[Tx]:
        """A use case of exactly one statement, committed when it has run. On PostgreSQL it runs
        without BEGIN and COMMIT (postgres.py); here it is `transaction()`."""
        with self.transaction() as tx:
            yield tx

    @contextmanager
    def read(self) -> Iterator[Tx]:
        """A read-only transaction (a consistent snapshot)."""
        with self._begin(write=False) as conn:
            yield Tx(self, conn)

    def commit_groups(self) -> CommitGroups | None:
        """The handle a lane thread groups its commits through; None: this store commits each
        transaction on its own."""
        return None

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run `fn` once what this thread's last transaction wrote has committed: now, unless
        the thread groups its commits (SQLite's lane, `SqliteStore.commit_groups`) and that
        transaction waits in its open group."""
        fn()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[0].close()
        self.engine.dispose()


_IDLE_MAX = 8
_UPSERT_MAX_CACHES: dict[tuple[Any, Any], PreparedCache] = {}


def _upsert_max_cache(insert: Any, greatest: Any) -> PreparedCache:
    """One cache per dialect of `INSERT … ON CONFLICT (key) DO UPDATE SET column =
    greatest(column, excluded.column)`, keyed by (table, columns, key, column)."""
    cache = _UPSERT_MAX_CACHES.get((insert, greatest))
    if cache is None:
        def build(spec: tuple[str, tuple[str, ...], tuple[str, ...], str]) -> Any:
            name, cols, key, column = spec
            table = t.metadata.tables[name]
            stmt = insert(table).values({c: bindparam(c) for c in cols})
            return stmt.on_conflict_do_update(
                index_elements=list(key), set_={column: greatest(table.c[column], stmt.excluded[column])}
            )

        cache = _UPSERT_MAX_CACHES.setdefault((insert, greatest), PreparedCache(build))
    return cache


_INSERT_NEW_CACHES: dict[Any, PreparedCache] = {}


def _insert_new_cache(insert: Any) -> PreparedCache:
    """One cache per dialect of `INSERT … ON CONFLICT (key) DO NOTHING RETURNING key[0]`, keyed
    by (table, columns, key). Built per call it cost more CPU than the statement's round trip
    (the shared replay guard runs one per signed mutation on PostgreSQL)."""
    cache = _INSERT_NEW_CACHES.get(insert)
    if cache is None:
        def build(spec: tuple[str, tuple[str, ...], tuple[str, ...]]) -> Any:
            name, cols, key = spec
            table = t.metadata.tables[name]
            return (insert(table).values({c: bindparam(c) for c in cols})
                    .on_conflict_do_nothing(index_elements=list(key)).returning(table.c[key[0]]))

        cache = _INSERT_NEW_CACHES.setdefault(insert, PreparedCache(build))
    return cache


def _driver_in_transaction(conn: Connection) -> bool:
    return _raw_in_transaction(driver(conn))


def _raw_in_transaction(raw: Any) -> bool:
    status = getattr(raw, "in_transaction", None)  # sqlite3
    if status is None:  # psycopg: transaction_status is IDLE (0) outside a transaction
        return int(raw.info.transaction_status) != 0
    return bool(status)


def end_transaction(conn: Connection, *, commit: bool) -> None:
    """Commit or roll back the transaction open on `conn`.

    Prepared statements run on the driver cursor, which joins (or, on psycopg, implicitly opens)
    the driver's transaction without SQLAlchemy knowing; a Core statement run through the
    Connection makes SQLAlchemy's transaction the one to end. Either way the driver's
    transaction ends here, and driver errors come back as `sqlalchemy.exc.*`.
    """
    if conn.in_transaction():
        if commit:
            conn.commit()
        else:
            conn.rollback()
        return
    raw: Any = driver(conn)
    if not _raw_in_transaction(raw):
        return
    try:
        if commit:
            raw.commit()
        else:
            raw.rollback()
    except conn.dialect.loaded_dbapi.Error as exc:
        conn._handle_dbapi_exception(exc, "COMMIT" if commit else "ROLLBACK", None, None, None)


__all__ = ["SqlStore", "Tx"]
