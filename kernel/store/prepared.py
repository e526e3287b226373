"""Prepared Core statements: built once, compiled once per dialect, run on the driver cursor.

The step hot path runs about a dozen statements per request. Building a Core statement per call
costs ~90 µs and even a prebuilt one ~40 µs through `Connection.execute` (cache-key generation,
result-proxy set-up), against ~4 µs for the same SQL on the driver cursor. A `Prepared` keeps the
Core statement as the single source of the SQL — the tables, the dialect's compiler, its type
processors — and does the per-dialect work once:

- the SQL string and the order of its parameters, from the dialect's compiler;
- each parameter's bind processor and each result column's result processor, from the column
  types (so `UTCDateTime` round-trips exactly as it does through `Connection.execute`).

Execution goes to the DBAPI connection under the SQLAlchemy `Connection`, inside the transaction
that connection has open, so locking, BEGIN IMMEDIATE escalation and commit stay where they are.
Statements with expanding parameters (`IN` lists) are not supported: spell constant lists with
`literal_column`, as `sql.py` does.
"""

from __future__ import annotations

import contextlib
import threading
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import ClauseElement

_Proc = Callable[[Any], Any] | None


class _Plan:
    __slots__ = ("has_results", "keep_cursor", "names", "params", "plan", "positional", "results", "row", "sql")

    def __init__(self, stmt: ClauseElement, dialect: Dialect):
        compiled: Any = stmt.compile(dialect=dialect)  # a SQLCompiler (positiontup, binds, processors)
        # psycopg reads a result whole at execute, so one cursor kept with the driver connection
        # serves every statement of it. An sqlite3 cursor keeps its statement (and a read snapshot)
        # open until its rows are all read, or it is closed or reused: there one cursor is kept per
        # Connection too, and every statement's rows are read to the end (`_execute`), so none is
        # left open between statements or past a COMMIT.
        self.keep_cursor = dialect.name != "sqlite"
        self.sql: str = compiled.string
        self.positional: bool = bool(compiled.positional)
        self.names: tuple[str, ...] = tuple(compiled.positiontup or ()) if self.positional else tuple(compiled.binds)
        defaults: dict[str, Any] = {k: v for k, v in compiled.params.items() if v is not None}
        binds: dict[str, Callable[[Any], Any]] = dict(compiled._bind_processors)
        # Per parameter, in order: (name, its bind processor or None, its default).
        self.plan: tuple[tuple[str, _Proc, Any], ...] = tuple(
            (n, binds.get(n), defaults.get(n)) for n in self.names
        )
        columns: Sequence[Any] = ()
        if getattr(stmt, "_returning", ()):
            columns = stmt._returning  # type: ignore[attr-defined]
        elif hasattr(stmt, "selected_columns"):
            columns = stmt.selected_columns  # type: ignore[attr-defined]
        self.has_results = bool(columns)
        keys = [getattr(c, "key", None) or getattr(c, "name", None) or f"c{i}" for i, c in enumerate(columns)]
        self.row = namedtuple("Row", keys, rename=True) if columns else None  # type: ignore[misc]
        procs: list[_Proc] = [c.type._cached_result_processor(dialect, None) for c in columns]
        self.results: list[tuple[int, Callable[[Any], Any]]] | None = (
            [(i, p) for i, p in enumerate(procs) if p is not None] or None
        )

        self.params: Callable[[dict[str, Any]], Any] = _binder(self.plan, self.positional)

    def row_of(self, r: Any) -> Any:
        make = self.row
        assert make is not None
        procs = self.results
        if procs is None:
            return make(*r)
        vals = list(r)
        for i, p in procs:
            vals[i] = p(vals[i])
        return make(*vals)

    def rows(self, raw: list[Any]) -> list[Any]:
        make = self.row
        assert make is not None
        procs = self.results
        if procs is None:
            return [make(*r) for r in raw]
        out = []
        for r in raw:
            vals = list(r)
            for i, p in procs:
                vals[i] = p(vals[i])
            out.append(make(*vals))
        return out


def _binder(plan: tuple[tuple[str, _Proc, Any], ...], positional: bool) -> Callable[[dict[str, Any]], Any]:
    """The function that turns a dict of values into the driver's parameters, in order, each
    through its bind processor: generated once per plan as one expression (a list or a dict
    display), which costs a fraction of a loop over the plan per statement."""
    ns: dict[str, Any] = {}
    items = []
    for i, (name, proc, default) in enumerate(plan):
        ns[f"d{i}"] = default
        value = f"get({name!r}, d{i})" if default is not None else f"get({name!r})"
        if proc is not None:
            ns[f"p{i}"] = proc
            value = f"p{i}({value})"
        items.append(value if positional else f"{name!r}: {value}")
    body = f"[{', '.join(items)}]" if positional else f"{{{', '.join(items)}}}"
    exec(f"def bind(values):\n    get = values.get\n    return {body}\n", ns)  # the names come from the compiler
    return ns["bind"]  # type: ignore[no-any-return]


def driver(conn: Connection) -> Any:
    """The driver connection under `conn` (sqlite3's or psycopg's), kept on the Connection while
    the pool's connection under it stays the same: through `conn.connection.driver_connection`
    it is four property calls, and the hot path asks for it about two dozen times a round trip."""
    return _kept(conn, "_regent_driver", _driver_of)


def _driver_of(conn: Connection) -> Any:
    return conn.connection.driver_connection


def _kept(conn: Connection, attr: str, make: Callable[[Connection], Any]) -> Any:
    """`make(conn)`, kept in the Connection's `attr` for as long as the pool's driver connection
    under it is the same one (a Connection invalidated and reconnected gets a new one)."""
    fairy = conn._dbapi_connection
    dbapi = None if fairy is None else fairy.dbapi_connection
    cached = conn.__dict__.get(attr)
    if cached is not None and cached[0] is dbapi and dbapi is not None:
        return cached[1]
    value = make(conn)
    fairy = conn._dbapi_connection
    conn.__dict__[attr] = (None if fairy is None else fairy.dbapi_connection, value)
    return value


def _cursor(conn: Connection) -> Any:
    """The driver connection's cursor for prepared statements, made once and kept with the
    connection (`info` lives as long as the driver connection): on psycopg a new cursor per
    statement cost about as much as binding its parameters (PostgreSQL only, see `_Plan`)."""
    info = conn.connection.info
    cur = info.get("regent_cursor")
    if cur is None:
        cur = info["regent_cursor"] = driver(conn).cursor()
    return cur


def _sqlite_cursor(conn: Connection) -> Any:
    """SQLite: the cursor prepared statements run on, made once per driver connection and kept on
    the Connection as `driver` keeps the driver connection (a cursor per statement, made and
    closed, cost more than binding the statement's parameters)."""
    return _kept(conn, "_regent_cursor", _new_cursor)


def _new_cursor(conn: Connection) -> Any:
    return driver(conn).cursor()


def _forget_cursor(conn: Connection) -> None:
    """After a driver error the next statement gets a fresh cursor."""
    cur = conn.connection.info.pop("regent_cursor", None)
    if cur is not None:
        with contextlib.suppress(Exception):  # the connection may be gone; its error is raised next
            cur.close()


def _forget_sqlite_cursor(conn: Connection) -> None:
    cached = conn.__dict__.pop("_regent_cursor", None)
    if cached is not None:
        with contextlib.suppress(Exception):
            cached[1].close()


_NO_PARAMS: dict[str, Any] = {}


class Prepared:
    """One Core statement with bind parameters; `run`/`first`/`all`/`scalar` take a dict of them."""

    __slots__ = ("_lock", "_plans", "stmt")

    def __init__(self, stmt: ClauseElement):
        self.stmt = stmt
        self._plans: dict[str, _Plan] = {}
        self._lock = threading.Lock()

    def _plan(self, conn: Connection) -> _Plan:
        dialect = conn.dialect
        plan = self._plans.get(dialect.name)
        if plan is None:
            with self._lock:
                plan = self._plans.get(dialect.name)
                if plan is None:
                    plan = self._plans[dialect.name] = _Plan(self.stmt, dialect)
        return plan

    def _execute(self, conn: Connection, params: Any, fetch: str, many: bool = False) -> Any:
        plan = self._plans.get(conn.dialect.name) or self._plan(conn)
        args = [plan.params(r) for r in params] if many else plan.params(params or _NO_PARAMS)
        keep = plan.keep_cursor
        cur = _cursor(conn) if keep else _sqlite_cursor(conn)
        try:
            if many:
                cur.executemany(plan.sql, args)
            else:
                cur.execute(plan.sql, args)
            if fetch == "rowcount":
                n = int(cur.rowcount)
                if plan.has_results and not keep:
                    cur.fetchall()  # RETURNING rows nobody reads: the statement ends here
                return n
            if fetch == "one":
                if keep:
                    raw = cur.fetchone()
                    return None if raw is None else plan.row_of(raw)
                # sqlite3: read to the end, which resets the statement (the hot path's `first`
                # statements read one row by key).
                found = cur.fetchall()
                return plan.row_of(found[0]) if found else None
            if fetch == "all":
                return plan.rows(cur.fetchall())
            return None
        except conn.dialect.loaded_dbapi.Error as exc:
            # The same path Connection.execute takes: wrapped as sqlalchemy.exc.*, and a
            # connection that was lost is invalidated so the pool does not hand it out again.
            if keep:
                _forget_cursor(conn)
            else:
                _forget_sqlite_cursor(conn)
            conn._handle_dbapi_exception(exc, plan.sql, args, cur, None)

    def run(self, conn: Connection, params: dict[str, Any] | None = None) -> int:
        """Execute; returns the driver's rowcount."""
        return int(self._execute(conn, params, "rowcount"))

    def many(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        self._execute(conn, rows, "none", many=True)

    def all(self, conn: Connection, params: dict[str, Any] | None = None) -> list[Any]:
        return list(self._execute(conn, params, "all"))

    def first(self, conn: Connection, params: dict[str, Any] | None = None) -> Any:
        return self._execute(conn, params, "one")

    def scalar(self, conn: Connection, params: dict[str, Any] | None = None) -> Any:
        row = self.first(conn, params)
        return None if row is None else row[0]


class PreparedCache:
    """Prepared statements made on demand from a key (e.g. the set of columns an UPDATE sets)."""

    def __init__(self, build: Callable[..., ClauseElement]):
        self._build = build
        self._items: dict[Any, Prepared] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> Prepared:
        p = self._items.get(key)
        if p is None:
            with self._lock:
                p = self._items.get(key)
                if p is None:
                    if len(self._items) > 256:  # keys come from code, not input; a bound anyway
                        self._items.clear()
                    p = self._items[key] = Prepared(self._build(key))
        return p


__all__ = ["Prepared", "PreparedCache"]
