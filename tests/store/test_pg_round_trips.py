"""PostgreSQL's cheaper transaction starts: BEGIN and the first advisory locks sent as one query,
and one-statement use cases (the shared replay guard) run in autocommit. The locks must be the
ones a lock statement of its own takes (same keys, held to COMMIT), an error must fail the
transaction as before, and a Connection must go back to the cache as it was."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from kernel.store import open_store
from kernel.store.migrations import migrate
from kernel.store.postgres import PostgresStore, driver_url

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def pg(pg_database: str) -> Iterator[PostgresStore]:
    store = open_store(pg_database)
    assert isinstance(store, PostgresStore)
    migrate(store)
    yield store
    store.close()


def _free(url: str, key: str) -> bool:
    """Whether another session can take the advisory lock of `key` right now."""
    eng = create_engine(driver_url(url))
    try:
        with eng.connect() as c:
            got = bool(c.execute(text("SELECT pg_try_advisory_xact_lock(hashtextextended(:k, 0))"),
                                 {"k": key}).scalar())
            c.rollback()
            return got
    finally:
        eng.dispose()


def test_begin_and_locks_in_one_query_hold_the_same_keys_until_commit(pg: PostgresStore, pg_database: str) -> None:
    with pg.transaction(lock="e-1", session="s-1") as tx:
        raw = tx.conn.connection.driver_connection
        assert raw is not None and raw.info.transaction_status != 0  # inside the transaction already
        assert not _free(pg_database, "execution:e-1")
        assert not _free(pg_database, "execution:session:s-1")
        tx.lock_execution("e-2")  # a later lock is a statement of its own, as before
        assert not _free(pg_database, "execution:e-2")
    assert _free(pg_database, "execution:e-1") and _free(pg_database, "execution:session:s-1")


def test_a_lock_name_is_a_literal_not_sql(pg: PostgresStore, pg_database: str) -> None:
    name = "it's'; SELECT pg_sleep(5); --\\"
    with pg.transaction(lock=name):
        assert not _free(pg_database, f"execution:{name}")
    assert _free(pg_database, f"execution:{name}")


def test_a_failed_transaction_with_its_locks_leaves_the_connection_clean(pg: PostgresStore, pg_database: str) -> None:
    with pytest.raises(DBAPIError), pg.transaction(lock="e-3") as tx:
        tx.conn.exec_driver_sql("SELECT 1/0")
    assert _free(pg_database, "execution:e-3")
    for _ in range(3):
        with pg.transaction(lock="e-3") as tx:
            assert tx.conn.exec_driver_sql("SELECT 1").scalar_one() == 1


def test_autocommit_commits_the_statement_as_it_runs_and_hands_back_a_transactional_connection(
        pg: PostgresStore) -> None:
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    with pg.autocommit() as tx:
        assert tx.record_request_signature("a", 1, "sig", expires)
        raw = tx.conn.connection.driver_connection
        assert raw is not None and raw.info.transaction_status == 0  # no transaction: committed
    with pg.autocommit() as tx:
        assert not tx.record_request_signature("a", 1, "sig", expires)  # a repeat
    # The cached Connection is transactional again: a failed use case leaves nothing behind.
    with pytest.raises(RuntimeError), pg.transaction() as tx:
        assert not tx.conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
        tx.record_request_signature("a", 2, "sig", expires)
        raise RuntimeError("failed after writing")
    with pg.autocommit() as tx:
        assert tx.record_request_signature("a", 2, "sig", expires)  # the rolled-back row is not there


def test_autocommit_statement_error_keeps_the_connection_usable(pg: PostgresStore) -> None:
    with pytest.raises(DBAPIError), pg.autocommit() as tx:
        tx.conn.exec_driver_sql("SELECT 1/0")
    for _ in range(3):
        with pg.transaction(lock="e-4") as tx:
            assert tx.conn.exec_driver_sql("SELECT 1").scalar_one() == 1
            assert not tx.conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
