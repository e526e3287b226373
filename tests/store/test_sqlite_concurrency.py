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
