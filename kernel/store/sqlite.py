"""SQLite, the embedded default. One kernel process per file; every quirk has its reason here."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from sqlalchemy import create_engine, event, func
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import DBAPIError

from kernel.errors import ConfigError
from kernel.store.base import SqlStore, end_transaction
from kernel.store.sql import Tx

# SQLite's messages for a file that cannot be written or read right now (sqlite3 has no error codes
# before 3.11's sqlite_errorcode, and these texts are stable across SQLite versions).
_UNAVAILABLE = {
    "database or disk is full": "the disk holding the database is full",
    "disk i/o error": "a disk I/O error on the database file",
    "unable to open database file": "the database file cannot be opened",
    "attempt to write a readonly database": "the database file is read-only",
    "database is locked": "the database file is locked",
}


class SqliteStore(SqlStore):
    dialect = "sqlite"
    insert = staticmethod(sqlite_insert)
    greatest = func.max

    def __init__(self, url: str, *, synchronous: str = "full", busy_timeout_ms: int = 5000):
        parsed = make_url(url)
        path = parsed.database
        if not path or path == ":memory:":
            raise ConfigError("SQLite needs a file: sqlite:///path/to/regent.db")
        self.path = os.path.abspath(path)
        if synchronous.lower() not in ("full", "normal", "extra"):
            raise ConfigError(f"REGENT_SQLITE_SYNCHRONOUS must be full, normal or extra, not {synchronous!r}")
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._lock_fd = self._claim_file(self.path)
        engine = create_engine(
            f"sqlite:///{self.path}",
            connect_args={"check_same_thread": False},
            pool_size=16,
            max_overflow=48,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Autocommit at the driver so that BEGIN is ours to emit (pysqlite's implicit
            # transactions would otherwise defer the write lock and break SAVEPOINT semantics).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            # WAL: readers never block the writer, and a commit is one append to the log.
            cur.execute("PRAGMA journal_mode=WAL")
            # FULL: a terminal event must survive a power cut; NORMAL is a documented opt-in.
            cur.execute(f"PRAGMA synchronous={synchronous.upper()}")
            # Wait instead of failing with SQLITE_BUSY when a checkpoint holds the file briefly.
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            # Off by default in SQLite; our cascades and the agent reference depend on it.
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # IMMEDIATE takes the write lock at BEGIN, so a transaction that reads and then
            # writes can never hit SQLITE_BUSY_SNAPSHOT halfway through.
            # A Core statement run inside `transaction()` joins the transaction it opened on the
            # driver, so SQLAlchemy's own begin then emits nothing.
            if conn.connection.driver_connection.in_transaction:  # type: ignore[union-attr]
                return
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        # One writer at a time inside the process: SQLite serialises writers anyway, and a Python
        # lock queues them fairly instead of spinning in the busy handler.
        self._write_lock = threading.Lock()
        self._locks: dict[str, list[Any]] = {}
        self._locks_guard = threading.Lock()
        super().__init__(engine, url)

    @staticmethod
    def _claim_file(path: str) -> int:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"another regent process is already serving {path}; SQLite allows one kernel per "
                "file (use PostgreSQL for several replicas)"
            ) from None
        return fd

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Connection]:
        with self._connection() as conn, conn.begin():
            yield conn

    @contextmanager
    def transaction(self, lock: str | None = None, session: str | None = None) -> Iterator[Tx]:
        """Reads run on a snapshot; the first write switches to a BEGIN IMMEDIATE transaction.

        The per-execution lock is an in-process keyed lock held for the whole use case, so a slow
        policy evaluation between the reads and the writes holds up only its own execution, not
        every writer of the file. Because every mutation of an execution takes that lock, what the
        snapshot said about the execution is still true when the writes begin.

        BEGIN and COMMIT go straight to the driver: on a step round trip SQLAlchemy's transaction
        bookkeeping cost more than all the statements together. The commit happens before the
        write lock is released.
        """
        with ExitStack() as stack:
            if session is not None:  # execution ids are UUIDs: the prefix keeps the keys apart
                stack.enter_context(self._keyed_lock(f"session:{session}"))
            if lock is not None:
                stack.enter_context(self._keyed_lock(lock))
            conn = stack.enter_context(self._connection())
            raw = conn.connection.driver_connection
            raw.execute("BEGIN")  # type: ignore[union-attr]

            def escalate() -> Connection:
                # The same connection switches to a write transaction: a transaction never holds
                # two pooled connections, so a full pool cannot deadlock against the write lock.
                end_transaction(conn, commit=True)
                stack.enter_context(self._write_lock)
                raw.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
                return conn

            try:
                yield Tx(self, conn, escalate, lock_more=lambda eid: stack.enter_context(self._keyed_lock(eid)))
            except BaseException:
                end_transaction(conn, commit=False)
                raise
            end_transaction(conn, commit=True)

    @contextmanager
    def _keyed_lock(self, key: str) -> Iterator[None]:
        with self._locks_guard:
            entry = self._locks.get(key)
            if entry is None:
                entry = self._locks[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._locks_guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def unavailable_reason(self, exc: BaseException) -> str | None:
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, sqlite3.OperationalError):
            text = str(orig).lower()
            for needle, reason in _UNAVAILABLE.items():
                if needle in text:
                    return reason
        return super().unavailable_reason(exc)

    def upsert(self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str]) -> None:
        stmt = sqlite_insert(table).values(**values)
        keys = set(key)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(keys),
            set_={k: stmt.excluded[k] for k in values if k not in keys},
        )
        conn.execute(stmt)


    def close(self) -> None:
        super().close()
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
        except OSError:
            pass
