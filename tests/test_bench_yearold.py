"""bench/yearold.py builds a store as the kernel would have written it: checked on a small one.

The oracle for the ids is the standard library's `uuid` (version, variant, the 48-bit Unix
milliseconds) against the row's own `created_at`; for the order, the kernel's executions list,
which pages newest first by id because the kernel's ids are UUIDv7.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bench import yearold
from kernel.store import open_store
from kernel.store.postgres import driver_url
from tests.conftest import scratch_pg_database

N, EXPIRED = 2_000, 100  # two forks (every 1000th execution)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def built(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "yearold.db"
        yearold._build_sqlite(path, N, EXPIRED)
        yield f"sqlite:///{path}"
    else:
        with scratch_pg_database("regent_yearold_test", migrated=False) as url:
            yearold._build_postgres(url, N, EXPIRED)
            yield url


def _rows(url: str, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    eng = create_engine(driver_url(url) if url.startswith("postgresql") else url)
    try:
        with eng.connect() as c:
            return [tuple(r) for r in c.execute(text(sql))]
    finally:
        eng.dispose()


def _aware(v: object) -> datetime:
    d = v if isinstance(v, datetime) else datetime.fromisoformat(str(v))
    return d if d.tzinfo else d.replace(tzinfo=UTC)


def test_execution_ids_are_uuid7_of_their_creation_time(built: str) -> None:
    rows = _rows(built, "SELECT id, created_at FROM executions")
    assert len(rows) == N and len({r[0] for r in rows}) == N
    for eid, created in rows:
        u = uuid.UUID(eid)
        assert (u.version, u.variant, str(u)) == (7, uuid.RFC_4122, eid)
        ms = u.int >> 80
        assert datetime.fromtimestamp(ms / 1000, UTC) == _aware(created)
    ages = sorted(yearold.NOW - _aware(c) for _, c in rows)
    assert ages[0] >= timedelta(hours=1) and ages[-1] <= timedelta(days=430)
    assert sum(a > timedelta(days=yearold.RETENTION_DAYS) for a in ages) == EXPIRED


def test_the_kernel_lists_them_newest_first_and_forks_point_to_the_one_created_before(built: str) -> None:
    store = open_store(built)
    try:
        with store.read() as tx:
            listed = tx.list_executions(None, None, None, N)
    finally:
        store.close()
    assert [e.created_at for e in listed] == sorted((e.created_at for e in listed), reverse=True)
    by_time = [r[0] for r in _rows(built, "SELECT id FROM executions ORDER BY created_at, id")]
    forks = _rows(built, "SELECT id, forked_from FROM executions WHERE forked_from IS NOT NULL")
    assert len(forks) == 2
    for child, parent in forks:
        assert by_time.index(parent) == by_time.index(child) - 1


def test_one_decision_in_20_is_a_denial_and_one_execution_in_100_has_an_approval(built: str) -> None:
    # The "denied" reads page real rows (shapes 1 and 2 held none).
    decisions = dict(_rows(built, "SELECT decision, count(*) FROM decisions GROUP BY decision"))
    total = sum(decisions.values())
    assert total == sum(k % 3 + 1 for k in range(1, N + 1))  # one per step
    assert 0.03 * total <= decisions.get("denied", 0) <= 0.07 * total, decisions
    approvals = _rows(built, "SELECT count(*) FROM approvals")[0][0]
    assert 0.005 * N <= approvals <= 0.015 * N  # every 100th (SQLite by rowid, PostgreSQL by random bits)
