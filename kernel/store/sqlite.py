"""SQLite, the embedded default. One kernel process per file; every quirk has its reason here."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from sqlalchemy import create_engine, event, func
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError

from kernel.errors import ConfigError, StoreUnavailable
from kernel.store.base import CommitGroups, SqlStore, end_transaction
from kernel.store.prepared import driver
from kernel.store.sql import Tx

log = logging.getLogger(__name__)

# SQLite's messages for a file that cannot be written or read right now (sqlite3 has no error codes
# before 3.11's sqlite_errorcode, and these texts are stable across SQLite versions).
_UNAVAILABLE = {
    "database or disk is full": "the disk holding the database is full",
    "disk i/o error": "a disk I/O error on the database file",
    "unable to open database file": "the database file cannot be opened",
    "attempt to write a readonly database": "the database file is read-only",
    "database is locked": "the database file is locked",
}


class _KeyedLock:
    """One use of a keyed lock (`SqliteStore._keyed_lock`): the entry {key: [lock, users]} lives
    while anyone holds or waits for it. A plain class rather than a generator context manager:
    the step path takes two a round trip."""

    __slots__ = ("blocking", "entry", "got", "guard", "key", "locks")

    def __init__(self, locks: dict[str, list[Any]], guard: threading.Lock, key: str, blocking: bool):
        self.locks, self.guard, self.key, self.blocking = locks, guard, key, blocking
        self.got = False

    def __enter__(self) -> bool:
        with self.guard:
            entry = self.locks.get(self.key)
            if entry is None:
                entry = self.locks[self.key] = [threading.Lock(), 0]
            entry[1] += 1
        self.entry = entry
        try:
            self.got = entry[0].acquire(self.blocking)
        except BaseException:
            self._leave()
            raise
        return self.got

    def __exit__(self, *exc: object) -> None:
        try:
            if self.got:
                self.entry[0].release()
        finally:
            self._leave()

    def _leave(self) -> None:
        with self.guard:
            entry = self.entry
            entry[1] -= 1
            if entry[1] == 0:
                del self.locks[self.key]


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
        # The open commit group of each thread that groups its commits (see `commit_groups`).
        self._grouping = threading.local()
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
        g = self._group()
        if g is not None and g.conn is not None:
            # A read on a thread whose commit group is open sees what the group wrote (its own
            # use case's writes among them), so its answer waits for the group's commit too.
            g.members.add(g.token)
            yield g.conn
            return
        with self._connection() as conn, conn.begin():
            yield conn

    # -- group commit -----------------------------------------------------------------------
    def commit_groups(self) -> SqliteCommitGroups:
        """The handle a lane thread groups its commits through (kernel/lane.py)."""
        return SqliteCommitGroups(self)

    def _group(self) -> _Group | None:
        return getattr(self._grouping, "group", None)

    def after_commit(self, fn: Callable[[], None]) -> None:
        g = self._group()
        if g is not None and g.conn is not None and g.token in g.members:
            g.after.append(fn)
        else:
            fn()

    def _try_keys(self, g: _Group, keys: list[str]) -> bool:
        """Take every keyed lock without waiting, held by the group until it commits; False (and
        none taken) when another holder has one, or the group itself does (the same execution
        again in one group: the second must see the first committed)."""
        with ExitStack() as taken:
            for key in keys:
                if not taken.enter_context(self._keyed_lock(key, blocking=False)):
                    return False
            assert g.stack is not None
            g.stack.enter_context(taken.pop_all())
        return True

    @contextmanager
    def _joined(self, g: _Group) -> Iterator[Tx]:
        """A transaction inside the open group: a savepoint on its connection."""
        conn = g.conn
        assert conn is not None
        raw: Any = driver(conn)
        g.members.add(g.token)
        g.savepoints += 1
        name = f"regent_g{g.savepoints}"
        try:
            raw.execute(f"SAVEPOINT {name}")
            try:
                yield Tx(self, conn)
            except BaseException:
                if raw.in_transaction:
                    raw.execute(f"ROLLBACK TO {name}")
                    raw.execute(f"RELEASE {name}")
                raise
            raw.execute(f"RELEASE {name}")
        except Exception as exc:
            conflict = self.conflict(exc)
            if not raw.in_transaction or self.unavailable_reason(exc) is not None:
                # SQLite ended the group's transaction itself (an I/O error, a full disk): what
                # the group wrote is gone, so every use case in it fails.
                g.discard(conflict or exc)
            reason = self.unavailable_reason(exc)
            if reason is None:
                if conflict is not None:  # as `_connection` does outside a group
                    raise conflict from exc
                raise
            raise StoreUnavailable(f"store unavailable: {reason}") from exc

    @contextmanager
    def transaction(self, lock: str | None = None, session: str | None = None,
                    write: bool = False) -> Iterator[Tx]:
        """Reads run on a snapshot; the first write switches to a BEGIN IMMEDIATE transaction.

        The per-execution lock is an in-process keyed lock held for the whole use case, so a slow
        policy evaluation between the reads and the writes holds up only its own execution, not
        every writer of the file. Because every mutation of an execution takes that lock, what the
        snapshot said about the execution is still true when the writes begin.

        `write=True`: a use case with nothing slow between its reads and its writes (a step's
        outcome) begins as BEGIN IMMEDIATE under the write lock at once, without the read snapshot
        and its COMMIT first; it cannot take more locks (`Tx.lock_execution`), which would be
        taken with the write lock held.

        BEGIN and COMMIT go straight to the driver: on a step round trip SQLAlchemy's transaction
        bookkeeping cost more than all the statements together. The commit happens before the
        write lock is released.
        """
        g = self._group()
        if g is not None and g.conn is not None:
            keys = [lock] if lock is not None else []
            if session is None and self._try_keys(g, keys):
                with self._joined(g) as tx:
                    yield tx
                return
            # A lock someone holds (waiting for it with the write lock held could deadlock
            # against its holder), or a session admission (which takes more locks as it goes):
            # commit the group first, then begin as usual.
            g.flush()
        with ExitStack() as stack:
            if session is not None:  # execution ids are UUIDs: the prefix keeps the keys apart
                stack.enter_context(self._keyed_lock(f"session:{session}"))
            if lock is not None:
                stack.enter_context(self._keyed_lock(lock))
            conn = stack.enter_context(self._connection())
            raw = driver(conn)
            if write:
                # Nothing slow before the writes: the write lock at BEGIN, no read snapshot first.
                # No more locks either: they would be taken with the write lock held.
                stack.enter_context(self._write_lock)
                raw.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
                wrote = True
                tx = Tx(self, conn)
            else:
                raw.execute("BEGIN")  # type: ignore[union-attr]
                wrote = False

                def escalate() -> Connection:
                    # The same connection switches to a write transaction: a transaction never holds
                    # two pooled connections, so a full pool cannot deadlock against the write lock.
                    nonlocal wrote
                    end_transaction(conn, commit=True)
                    stack.enter_context(self._write_lock)
                    raw.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
                    wrote = True
                    return conn

                tx = Tx(self, conn, escalate, lock_more=lambda eid: self._lock_more(stack, eid))
            try:
                yield tx
            except BaseException:
                end_transaction(conn, commit=False)
                raise
            if g is not None and wrote:
                # On a grouping thread the commit waits: the group keeps the transaction, its
                # connection, the write lock and the execution locks until it commits.
                g.open(stack.pop_all(), conn)
                return
            end_transaction(conn, commit=True)

    def _lock_more(self, stack: ExitStack, key: str) -> None:
        stack.enter_context(self._keyed_lock(key))

    def _keyed_lock(self, key: str, blocking: bool = True) -> _KeyedLock:
        """Hold the lock of `key` for the block; with blocking=False, yields whether it was free."""
        return _KeyedLock(self._locks, self._locks_guard, key, blocking)

    def unavailable_reason(self, exc: BaseException) -> str | None:
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, sqlite3.OperationalError):
            text = str(orig).lower()
            for needle, reason in _UNAVAILABLE.items():
                if needle in text:
                    return reason
        return super().unavailable_reason(exc)

    def conflict_reason(self, exc: IntegrityError) -> str:
        # sqlite3 names the constraint and its columns ("UNIQUE constraint failed: steps.step_id",
        # "FOREIGN KEY constraint failed"), never the values.
        orig = exc.orig
        return str(orig) if isinstance(orig, sqlite3.IntegrityError) else super().conflict_reason(exc)

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


class _Group:
    """One thread's open commit group: the write transaction several use cases ran in, with what
    it holds (connection, write lock, execution locks) and what waits for its commit."""

    def __init__(self) -> None:
        self.conn: Connection | None = None  # None: no group open
        self.stack: ExitStack | None = None
        self.token: Any = None  # the use case running now (the lane's job)
        self.members: set[Any] = set()  # use cases whose writes or reads are in the open group
        self.after: list[Callable[[], None]] = []  # after_commit callbacks of the open group
        self.failed: dict[Any, BaseException] = {}  # use cases whose group failed to commit
        self.savepoints = 0

    def open(self, stack: ExitStack, conn: Connection) -> None:
        self.stack, self.conn = stack, conn
        self.members.add(self.token)

    def _close(self) -> tuple[ExitStack, Connection, set[Any], list[Callable[[], None]]]:
        assert self.stack is not None and self.conn is not None
        out = (self.stack, self.conn, self.members, self.after)
        self.stack, self.conn, self.members, self.after, self.savepoints = None, None, set(), [], 0
        return out

    def flush(self) -> None:
        """Commit the open group (one fsync for all of it), release what it holds, then run its
        after-commit callbacks; when the commit fails, every member fails with that error."""
        if self.conn is None:
            return
        stack, conn, members, after = self._close()
        try:
            with stack:  # the connection's context turns a lost database into StoreUnavailable
                try:
                    end_transaction(conn, commit=True)
                except BaseException:
                    # A failed COMMIT can leave the transaction open, and SQLAlchemy, which did
                    # not open it, would hand the connection back to the pool unreset.
                    with contextlib.suppress(Exception):
                        conn.connection.driver_connection.rollback()  # type: ignore[union-attr]
                    with contextlib.suppress(Exception):
                        conn.rollback()  # and SQLAlchemy's own state, if it had joined
                    raise
        except BaseException as exc:
            for m in members:
                self.failed.setdefault(m, exc)
            return
        for fn in after:
            try:
                fn()
            except Exception:
                log.exception("an after-commit callback failed")

    def discard(self, exc: BaseException) -> None:
        """The group's transaction is gone: fail its members, drop the connection."""
        if self.conn is None:
            return
        stack, _conn, members, _after = self._close()
        for m in members:
            self.failed.setdefault(m, exc)
        # The connection's context re-raises (translated); the members have the error already.
        with contextlib.suppress(BaseException):
            stack.__exit__(type(exc), exc, exc.__traceback__)


class SqliteCommitGroups(CommitGroups):
    """Group commit for the threads that run use cases back to back (the lane).

    A thread that has called `attach` keeps its write transaction open after a use case ends:
    the next use cases it runs join it as savepoints, and `flush` commits them all with one
    fsync. Nothing is weaker: a use case's answer is released only once the commit that holds
    its writes has returned (`pending`), and a failed commit fails every use case in it
    (`failure`). Other threads see the group's writes when it commits, as any transaction's.
    """

    def __init__(self, store: SqliteStore):
        self.store = store

    def attach(self) -> None:
        self.store._grouping.group = _Group()

    def _g(self) -> _Group:
        g = self.store._group()
        assert g is not None, "attach() first"
        return g

    def start(self, token: Any) -> None:
        """The use case `token` runs now on this thread (None: none)."""
        self._g().token = token

    def is_open(self) -> bool:
        return self._g().conn is not None

    def pending(self, token: Any) -> bool:
        """Does `token`'s answer wait for the open group's commit?"""
        g = self._g()
        return g.conn is not None and token in g.members

    def failure(self, token: Any) -> BaseException | None:
        """The error of the commit that held `token`'s writes, if it failed (taken once)."""
        return self._g().failed.pop(token, None)

    def flush(self) -> None:
        self._g().flush()
