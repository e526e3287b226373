"""LimitsLimiter against `memory://` and the real Redis: counts, waits, faults, concurrency."""

from __future__ import annotations

import socket
import threading
import time
import types
from collections.abc import Iterator

import pytest

import kernel.ratelimit.limiter as limiter_module
from kernel.domain import RateLimitSpec
from kernel.errors import ConfigError
from kernel.ratelimit import LimitsLimiter, async_storage_uri, window_seconds
from tests.ratelimit.proxy import TcpProxy
from tests.support import free_port

SPEC = RateLimitSpec(max_calls=5, window_seconds=60)


def test_limiter_admits_max_calls_then_refuses(limiter: LimitsLimiter) -> None:
    outcomes = [limiter.hit("rule:exec:e1", SPEC) for _ in range(8)]
    assert [o.admitted for o in outcomes] == [True] * 5 + [False] * 3
    assert all(o.error is None for o in outcomes)


def test_refused_hit_reports_the_wait_until_the_oldest_call_leaves_the_window(limiter: LimitsLimiter) -> None:
    spec = RateLimitSpec(max_calls=2, window_seconds=30)
    started = time.time()
    assert limiter.hit("k", spec).admitted and limiter.hit("k", spec).admitted
    refused = limiter.hit("k", spec)
    elapsed = time.time() - started
    assert not refused.admitted
    assert 30 - elapsed - 0.05 <= refused.wait_seconds <= 30


def test_buckets_are_independent_per_key(limiter: LimitsLimiter) -> None:
    one = RateLimitSpec(max_calls=1, window_seconds=60)
    assert limiter.hit("r:exec:a", one).admitted
    assert not limiter.hit("r:exec:a", one).admitted
    assert limiter.hit("r:exec:b", one).admitted
    assert limiter.hit("other:exec:a", one).admitted


@pytest.fixture
def shifted_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Move `limits`' and our wall clock forward without sleeping (a per-module `time` stand-in)."""
    import limits.aio.storage.memory as memory
    import limits.aio.storage.redis.coredis as coredis_bridge

    offset = [0.0]
    fake = types.SimpleNamespace(time=lambda: time.time() + offset[0])
    for module in (memory, coredis_bridge, limiter_module):
        monkeypatch.setattr(module, "time", fake)
    yield offset


def test_a_call_is_admitted_again_once_the_oldest_leaves_the_window(
    limiter: LimitsLimiter, shifted_time: list[float]
) -> None:
    spec = RateLimitSpec(max_calls=2, window_seconds=10)
    assert limiter.hit("k", spec).admitted
    shifted_time[0] = 4.0
    assert limiter.hit("k", spec).admitted
    refused = limiter.hit("k", spec)
    assert not refused.admitted and 5.5 <= refused.wait_seconds <= 6.0  # the first call leaves at 10 s
    shifted_time[0] = 10.5
    assert limiter.hit("k", spec).admitted  # one slot back, not a whole fresh window
    assert not limiter.hit("k", spec).admitted


def test_concurrent_hits_admit_exactly_max_calls(limiter: LimitsLimiter) -> None:
    spec = RateLimitSpec(max_calls=20, window_seconds=60, per_what="global")
    barrier = threading.Barrier(100)
    admitted: list[bool] = []
    lock = threading.Lock()

    def go() -> None:
        barrier.wait(10)
        ok = limiter.hit("cap:global", spec).admitted
        with lock:
            admitted.append(ok)

    threads = [threading.Thread(target=go) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(admitted) == 100 and admitted.count(True) == 20


@pytest.mark.parametrize(
    ("window", "whole"), [(0.2, 1), (1.0, 1), (1.5, 2), (59.01, 60)], ids=["sub-second", "one", "fraction", "near-minute"]
)
def test_fractional_windows_round_up_to_whole_seconds(window: float, whole: int) -> None:
    assert window_seconds(RateLimitSpec(max_calls=1, window_seconds=window)) == whole


def test_inactive_spec_is_admitted_without_asking_the_storage() -> None:
    with LimitsLimiter(f"redis://127.0.0.1:{free_port()}/0") as dead:
        assert dead.hit("k", RateLimitSpec(max_calls=0, window_seconds=60)).admitted
        assert dead.hit("k", RateLimitSpec(max_calls=3, window_seconds=0)).admitted


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("memory://", "async+memory://"),
        ("redis://127.0.0.1:6379/0", "async+redis://127.0.0.1:6379/0"),
        ("rediss://u:p@cache:6380/1", "async+rediss://u:p@cache:6380/1"),
        ("async+redis://h:1", "async+redis://h:1"),
    ],
    ids=["memory", "redis", "rediss", "already-async"],
)
def test_storage_uri_maps_to_the_async_scheme(uri: str, expected: str) -> None:
    assert async_storage_uri(uri) == expected


@pytest.mark.parametrize(
    "uri", ["postgres://db/x", "memcached://h:11211", "redis-cluster", ""], ids=["postgres", "memcached", "no-scheme", "empty"]
)
def test_unsupported_storage_fails_at_construction(uri: str) -> None:
    with pytest.raises(ConfigError, match="rate limit storage"):
        LimitsLimiter(uri)


def test_config_error_does_not_print_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        LimitsLimiter("bogus://user:hunter2@h:1")
    assert "hunter2" not in str(info.value)


def test_unreachable_redis_is_an_error_outcome_not_an_exception() -> None:
    with LimitsLimiter(f"redis://127.0.0.1:{free_port()}/0") as dead:
        started = time.monotonic()
        outcome = dead.hit("k", SPEC)
        assert time.monotonic() - started < 1.5
    assert not outcome.admitted and outcome.error and "ConnectionError" in outcome.error


def test_a_server_that_never_answers_times_out_within_the_bound() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts connections (kernel backlog) and never speaks
    try:
        with LimitsLimiter(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout_seconds=0.3) as lim:
            started = time.monotonic()
            outcome = lim.hit("k", SPEC)
            took = time.monotonic() - started
    finally:
        silent.close()
    assert not outcome.admitted and outcome.error
    assert took < 1.0


@pytest.mark.redis
def test_redis_going_away_mid_run_errors_then_recovers_with_its_buckets(redis_url: str, redis_namespace: str) -> None:
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    proxy = TcpProxy(host, int(port)).start()
    spec = RateLimitSpec(max_calls=3, window_seconds=60)
    try:
        with LimitsLimiter(proxy.url, namespace=redis_namespace, timeout_seconds=0.5) as lim:
            assert [lim.hit("k", spec).admitted for _ in range(2)] == [True, True]
            proxy.stop()
            down = [lim.hit("k", spec) for _ in range(3)]
            assert all(not o.admitted and o.error for o in down)
            proxy.start()
            # Reconnecting may outlast one call's 0.5 s on a loaded machine (a timeout is an error
            # outcome: fail closed); wait for the limiter to reach Redis again with peeks, which
            # take nothing from the bucket (a CI run at load 2-3 timed out the first hit).
            deadline = time.monotonic() + 10
            while lim.peek("k", spec).error and time.monotonic() < deadline:
                time.sleep(0.1)
            back = [lim.hit("k", spec) for _ in range(2)]
    finally:
        proxy.stop()
    # The bucket lived in Redis all along: one call left, then refused (not a fresh bucket).
    assert [(o.admitted, o.error) for o in back] == [(True, None), (False, None)]


def test_close_stops_the_loop_thread_and_later_hits_are_errors() -> None:
    lim = LimitsLimiter("memory://")
    assert lim.hit("k", SPEC).admitted
    lim.close()
    lim.close()  # idempotent
    assert not any(t.name == "regent-ratelimit" and t.is_alive() for t in threading.enumerate())
    outcome = lim.hit("k", SPEC)
    assert not outcome.admitted and outcome.error == "rate limiter is closed"
