"""Session admission across two kernels on one PostgreSQL: two `Kernel`s with stores (connection
pools) of their own, as two replicas have, creating into one session from two threads and ending
executions through either. At most one execution of the session is ever running or blocked, and
the queued ones are admitted in creation order."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from kernel.core import executions
from kernel.core.agents import register_agent
from kernel.core.dispatch import claim_due
from kernel.core.executions import Lineage
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.store import open_store
from kernel.store import tables as t
from tests.conftest import scratch_pg_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]


def _live(k: Kernel, session: str) -> int:
    c = t.executions.c
    with k.store.read() as tx:
        return int(tx.conn.execute(select(func.count()).select_from(t.executions).where(
            c.session == session, c.status.in_(("running", "blocked")))).scalar_one())


def test_two_kernels_admit_fifty_queued_executions_of_one_session_one_at_a_time_in_order() -> None:
    with scratch_pg_database("regent_sess") as url:
        a, b = Kernel(store=open_store(url), replica_id="a"), Kernel(store=open_store(url), replica_id="b")
        try:
            register_agent(a, "shell", "http://127.0.0.1:9/webhook", "s", None, keep_policy=True)
            lin = Lineage(session="shared")
            created: list[str] = []
            lock = threading.Lock()

            def create(k: Kernel, n: int) -> None:
                for i in range(n):
                    e, _ = executions.create_execution(k, "shell", {"by": k.replica_id, "i": i}, lineage=lin)
                    with lock:
                        created.append(e.id)

            threads = [threading.Thread(target=create, args=(k, 25)) for k in (a, b)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(120)
            assert len(created) == 50 and _live(a, "shared") == 1
            order = sorted(created)  # UUIDv7: creation order
            admitted: list[str] = []
            for i in range(50):
                k = (a, b)[i % 2]  # each end is recorded, and admits the next, on alternating replicas
                claims = claim_due(k, 10) or claim_due((a, b)[(i + 1) % 2], 10)
                assert len(claims) == 1, "exactly one execution of the session is dispatched"
                c = claims[0]
                admitted.append(c.execution_id)
                assert _live(a, "shared") == 1
                executions.finish_execution(k, Lease("shell", c.execution_id, c.dispatch_id, c.attempt), output=i)
            assert admitted == order
            assert _live(b, "shared") == 0
        finally:
            a.store.close()
            b.store.close()


def test_concurrent_ends_and_creates_on_two_kernels_never_run_two_of_a_session() -> None:
    with scratch_pg_database("regent_sess") as url:
        a, b = Kernel(store=open_store(url), replica_id="a"), Kernel(store=open_store(url), replica_id="b")
        try:
            register_agent(a, "shell", "http://127.0.0.1:9/webhook", "s", None, keep_policy=True)
            lin = Lineage(session="race")
            first, _ = executions.create_execution(a, "shell", 0, lineage=lin)
            c = next(c for c in claim_due(a, 10) if c.execution_id == first.id)
            errors: list[BaseException] = []

            def finish() -> None:
                try:
                    executions.finish_execution(a, Lease("shell", first.id, c.dispatch_id, c.attempt), output=0)
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            def create() -> None:
                try:
                    for i in range(10):
                        executions.create_execution(b, "shell", i, lineage=lin)
                except BaseException as exc:  # pragma: no cover
                    errors.append(exc)

            threads = [threading.Thread(target=finish), threading.Thread(target=create)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(120)
            assert not errors
            assert _live(a, "shared") == 0 and _live(a, "race") == 1
        finally:
            a.store.close()
            b.store.close()
