"""Rate-limit fixtures: the real Redis (skip or fail like PostgreSQL), a limiter per storage, and
a unique key namespace per test so runs on a shared server never collide."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from kernel.ratelimit import LimitsLimiter
from tests.conftest import _unavailable

REDIS_URL = os.environ.get("REGENT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The real server's URL, after one PING; skips (or fails under REGENT_REQUIRE_SERVICES=1)."""
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
        client.close()
    except Exception as exc:  # pragma: no cover - depends on the machine
        _unavailable("Redis", exc)
    return REDIS_URL


@pytest.fixture
def namespace() -> str:
    return f"regent-test-{uuid.uuid4().hex[:12]}"


def _forget(url: str, namespace: str) -> None:
    """Delete this test's keys (limits prefixes every key with `LIMITS:`)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        keys = list(client.scan_iter(match=f"LIMITS:{namespace}/*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def redis_namespace(redis_url: str, namespace: str) -> Iterator[str]:
    """This test's namespace on the real Redis; its keys are deleted afterwards."""
    yield namespace
    _forget(redis_url, namespace)


@pytest.fixture
def redis_limiter(redis_url: str, redis_namespace: str) -> Iterator[LimitsLimiter]:
    with LimitsLimiter(redis_url, namespace=redis_namespace) as lim:
        yield lim


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def limiter(request: pytest.FixtureRequest, namespace: str) -> Iterator[LimitsLimiter]:
    """One limiter contract: every test using this runs on `memory://` and on the real Redis."""
    if request.param == "memory":
        with LimitsLimiter("memory://", namespace=namespace) as lim:
            yield lim
    else:
        yield request.getfixturevalue("redis_limiter")
