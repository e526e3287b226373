"""SQLite: many concurrent write transactions on different executions never exhaust the pool
(a transaction holds one pooled connection, reads and writes alike)."""

from __future__ import annotations

import threading

from kernel.core.agents import register_agent
from kernel.core.executions import create_execution
from kernel.core.kernel import Kernel
from kernel.store import SqlStore


def test_more_concurrent_writers_than_pooled_connections_all_finish(sqlite_store: SqlStore) -> None:
    k = Kernel(store=sqlite_store)
    register_agent(k, "a", "http://127.0.0.1:9/w", "s", None)
    done: list[int] = []
    lock = threading.Lock()

    def go() -> None:
        for _ in range(3):
            create_execution(k, "a", None)
        with lock:
            done.append(1)

    threads = [threading.Thread(target=go) for _ in range(100)]  # pool is 16 + 48
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 100
    with sqlite_store.read() as tx:
        assert len(tx.list_executions("a", None, None, 1000)) == 300


def test_a_write_transaction_holds_the_write_lock_from_its_begin(sqlite_store: SqlStore) -> None:
    """`transaction(write=True)` (a step's outcome) begins as BEGIN IMMEDIATE under the writer lock,
    with no read snapshot first; it takes no more keyed locks (they would wait with the write lock
    held). A plain transaction takes the write lock only at its first write."""
    import pytest

    from kernel.store.sqlite import SqliteStore

    assert isinstance(sqlite_store, SqliteStore)
    k = Kernel(store=sqlite_store)
    register_agent(k, "a", "http://127.0.0.1:9/w", "s", None)
    e, _ = create_execution(k, "a", None)
    with sqlite_store.transaction(lock=e.id) as tx:
        assert not sqlite_store._write_lock.locked()
        tx.get_execution(e.id)
        assert not sqlite_store._write_lock.locked()
    with sqlite_store.transaction(lock=e.id, write=True) as tx:
        assert sqlite_store._write_lock.locked()
        assert tx.conn.connection.driver_connection.in_transaction  # type: ignore[union-attr]
        assert tx.get_execution(e.id) is not None
        with pytest.raises(RuntimeError):
            tx.lock_execution("another")
    assert not sqlite_store._write_lock.locked()
