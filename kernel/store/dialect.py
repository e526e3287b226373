"""What a transaction (`Tx`) asks of its store (the few statements that differ by dialect), and
what `Tx`'s query mixins ask of `Tx`."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine import Connection

from kernel.store.codec import DecodedInputs


class Dialect(Protocol):
    """Implemented by `SqlStore` (base.py) and its per-dialect subclasses."""

    inputs: DecodedInputs
    dialect: str  # "sqlite" or "postgresql"

    def upsert(self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str]) -> None: ...

    def insert_new(self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str]) -> bool:
        """Insert unless a row with the same key exists; whether a row was inserted."""
        ...

    def upsert_max(
        self, conn: Connection, table: Any, values: dict[str, Any], key: Iterable[str], column: str
    ) -> None: ...

    def due_dispatch_ids(self, conn: Connection, now: datetime, limit: int) -> list[str]: ...

    def due_by_agent(self, conn: Connection, now: datetime, limit: int, skip_agents: Collection[str],
                     skip_ids: Collection[str], lock: bool = False) -> list[tuple[str, str]]: ...


class TxPart:
    """The base of `Tx`'s query mixins (sql_dispatch.py, sql_steps.py and the others): what they
    use of `Tx`, which supplies it (sql.py)."""

    if TYPE_CHECKING:
        store: Dialect

        @property
        def conn(self) -> Connection: ...

        @property
        def w(self) -> Connection: ...
