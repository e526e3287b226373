"""Storage: the backend is chosen by URL scheme (`sqlite:///…` or `postgresql://…`)."""

from __future__ import annotations

from kernel.errors import ConfigError
from kernel.store.base import SqlStore
from kernel.store.sql import Tx


def open_store(url: str, *, sqlite_synchronous: str = "full", pool_size: int = 10) -> SqlStore:
    if url.startswith("sqlite:"):
        from kernel.store.sqlite import SqliteStore

        return SqliteStore(url, synchronous=sqlite_synchronous)
    if url.startswith(("postgresql:", "postgres:", "postgresql+psycopg:")):
        from kernel.store.postgres import PostgresStore

        return PostgresStore(url, pool_size=pool_size)
    raise ConfigError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://…")


__all__ = ["SqlStore", "Tx", "open_store"]
