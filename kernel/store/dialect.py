"""What a transaction (`Tx`) asks of its store: the few statements that differ by dialect."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

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
