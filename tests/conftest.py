"""Shared fixtures: real SQLite files, the real PostgreSQL server, a real HTTP server on loopback.

PostgreSQL and Redis tests skip with a reason when the server is unreachable, unless
REGENT_REQUIRE_SERVICES=1 (CI), where they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from kernel.api.app import create_app
from kernel.clock import ManualClock
from kernel.core.agents import register_agent
from kernel.core.dispatch import claim_due
from kernel.core.executions import create_execution
from kernel.core.kernel import Kernel
from kernel.policy.resolver import BundleResolver
from kernel.store import SqlStore, open_store
from kernel.store import tables as t
from kernel.store.migrations import migrate
from kernel.store.postgres import driver_url
from tests.support import AgentClient, ServerThread

# httpx's module-level calls (httpx.get, httpx.post, …) share one default Timeout of 5 s. Under the
# suite's own parallel load (make test runs it in several processes) a Rego bundle's compile in the
# load gate can take longer than that, so the tests' plain calls get 30 s; the kernel's own clients
# name their timeouts and are not affected.
_httpx_default = httpx._config.DEFAULT_TIMEOUT_CONFIG
_httpx_default.connect = _httpx_default.read = _httpx_default.write = _httpx_default.pool = 30.0

PG_URL = os.environ.get("REGENT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE = os.environ.get("REGENT_REQUIRE_SERVICES") == "1"


def _unavailable(what: str, exc: Exception) -> None:
    msg = f"{what} unreachable ({type(exc).__name__}: {exc}); set REGENT_TEST_POSTGRES_URL / REGENT_TEST_REDIS_URL"
    if REQUIRE:
        pytest.fail(msg + " — mandatory because REGENT_REQUIRE_SERVICES=1")
    pytest.skip(msg)


@contextlib.contextmanager
def scratch_pg_database(prefix: str, *, migrated: bool = True) -> Iterator[str]:
    """A new database on the real server (URL), dropped afterwards; skipped (or, with
    REGENT_REQUIRE_SERVICES=1, failed) when the server is unreachable."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        admin = create_engine(driver_url(PG_URL), isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # pragma: no cover - depends on the machine
        _unavailable("PostgreSQL", exc)
    url = f"{PG_URL.rsplit('/', 1)[0]}/{name}"
    try:
        if migrated:
            store = open_store(url)
            migrate(store)
            store.close()
        yield url
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh database on the real server for this test session, dropped afterwards."""
    with scratch_pg_database("regent_test") as url:
        yield url


def _truncate(store: SqlStore) -> None:
    names = ", ".join(tbl.name for tbl in reversed(t.metadata.sorted_tables) if tbl.name != "regent_schema_version")
    with store.engine.begin() as c:
        c.execute(text(f"TRUNCATE {names} CASCADE"))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    """One store contract: every test using this runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        s = open_store(f"sqlite:///{tmp_path}/regent.db")
        migrate(s)
    else:
        url = request.getfixturevalue("pg_database")
        s = open_store(url)
        _truncate(s)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path: Any) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path}/regent.db")
    migrate(s)
    yield s
    s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kernel(store: SqlStore, clock: ManualClock) -> Kernel:
    return Kernel(store=store, clock=clock)


@pytest.fixture
def governed(kernel: Kernel) -> Iterator[Kernel]:
    """The kernel deciding by its agents' stored bundles (the bundle resolver), as a server does."""
    resolver = BundleResolver(kernel.store)
    kernel.policy = resolver
    yield kernel
    resolver.close()


class Running:
    """An execution that has been claimed: ready for agent calls under its lease."""

    def __init__(self, kernel: Kernel, agent_id: str = "shell", secret: str = "s3cret"):
        self.kernel = kernel
        self.agent_id = agent_id
        self.secret = secret
        register_agent(kernel, agent_id, "http://127.0.0.1:9/webhook", secret, None, keep_policy=True)

    def start(self, input: Any = None) -> tuple[str, str, int]:
        e, _ = create_execution(self.kernel, self.agent_id, input)
        claims = [c for c in claim_due(self.kernel, 100) if c.execution_id == e.id]
        assert claims, "the new execution's dispatch should be claimable"
        return e.id, claims[0].dispatch_id, claims[0].attempt


@pytest.fixture
def running(kernel: Kernel) -> Running:
    return Running(kernel)


@pytest.fixture
def server(kernel: Kernel) -> Iterator[ServerThread]:
    """The kernel served over real HTTP on loopback (dev auth: anonymous clients allowed)."""
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture
def agent_client(server: ServerThread, running: Running) -> Iterator[AgentClient]:
    c = AgentClient(server.url, running.agent_id, running.secret)
    yield c
    c.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The browser tests run last: while Playwright's sync API is open its event loop counts as
    running on the main thread, so a test after them that calls asyncio.run() would fail."""
    items.sort(key=lambda item: "tests/console/" in item.nodeid.replace("\\", "/"))
