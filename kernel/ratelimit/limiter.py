"""`LimitsLimiter`: the core's `Limiter` backed by the `limits` async API (moving window)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import time
import urllib.parse
from collections.abc import Coroutine
from typing import Any, TypeVar

from limits import RateLimitItemPerSecond
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import ConfigurationError
from limits.storage import storage_from_string

from kernel.domain import LimitOutcome, RateLimitSpec
from kernel.errors import ConfigError

T = TypeVar("T")

# Our URI scheme → the `limits` async storage scheme. Anything else is a configuration error.
_SCHEMES = {
    "memory": "async+memory",
    "redis": "async+redis",
    "rediss": "async+rediss",
    "redis+unix": "async+redis+unix",
}
_REDIS_SCHEMES = frozenset(v for k, v in _SCHEMES.items() if k != "memory")
_MIN_WAIT_SECONDS = 0.001  # a refused call never reports "no wait": the core would guess instead


def redacted(uri: str) -> str:
    """The URI without its password, for messages."""
    scheme, sep, rest = uri.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at:
        return uri
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def async_storage_uri(uri: str) -> str:
    """`memory://` → `async+memory://`, `redis://…` → `async+redis://…`; raises ConfigError."""
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(
            f"rate limit storage {redacted(uri)!r} is not a URI (use memory:// or redis://host:6379/0)"
        )
    if scheme in _SCHEMES.values():
        return f"{scheme}://{rest}"
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"rate limit storage scheme {scheme!r} is not supported (use one of: {', '.join(_SCHEMES)})"
        )
    return f"{_SCHEMES[scheme]}://{rest}"


def window_seconds(spec: RateLimitSpec) -> int:
    """The window in whole seconds: `limits` counts in seconds, so round up, at least 1 s."""
    return max(1, math.ceil(spec.window_seconds))


def rate_limit_item(spec: RateLimitSpec, namespace: str) -> RateLimitItemPerSecond:
    """`max_calls` per `window_seconds(spec)`; the namespace prefixes every storage key."""
    return RateLimitItemPerSecond(spec.max_calls, window_seconds(spec), namespace=namespace)


class LimitsLimiter:
    """At most `max_calls` admitted in any `window` for one bucket key, shared by every replica that
    points at the same storage.

    The core is synchronous and runs in many threads; the `limits` async storage runs on one event
    loop owned by this object, in its own daemon thread. Every call is bounded by
    `timeout_seconds`; a storage fault or a timeout is an error outcome, never an exception.
    """

    def __init__(self, storage_uri: str, *, namespace: str = "regent", timeout_seconds: float = 1.0):
        self.storage_uri = storage_uri
        self.namespace = namespace
        self.timeout_seconds = timeout_seconds
        uri = async_storage_uri(storage_uri)
        options: dict[str, float] = {}
        if urllib.parse.urlparse(uri).scheme in _REDIS_SCHEMES:
            # Fail a dead or black-holed server inside our own deadline, not the client's default.
            options = {"connect_timeout": timeout_seconds, "stream_timeout": timeout_seconds}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="regent-ratelimit", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            # Built on the loop thread: the storage's locks, timers and connections belong to it.
            self._strategy = self._run(self._open(uri, options), timeout=10.0)
        except (ConfigurationError, NotImplementedError, ValueError) as exc:
            self.close()
            raise ConfigError(f"rate limit storage {redacted(storage_uri)!r}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    @staticmethod
    async def _open(uri: str, options: dict[str, float]) -> MovingWindowRateLimiter:
        # Constructing a Redis storage does not connect: a kernel starts even while Redis is down.
        return MovingWindowRateLimiter(storage_from_string(uri, **options))

    def hit(self, key: str, spec: RateLimitSpec) -> LimitOutcome:
        if not spec.active:
            return LimitOutcome(admitted=True)
        if self._closed:
            return LimitOutcome(admitted=False, error="rate limiter is closed")
        try:
            return self._run(self._hit(key, rate_limit_item(spec, self.namespace)), self.timeout_seconds)
        except concurrent.futures.TimeoutError:
            return LimitOutcome(admitted=False, error=f"rate limiter timed out after {self.timeout_seconds:g}s")
        except Exception as exc:  # any storage fault (Redis down, reset, script error)
            return LimitOutcome(admitted=False, error=f"{type(exc).__name__}: {exc}")

    async def _hit(self, key: str, item: RateLimitItemPerSecond) -> LimitOutcome:
        if await self._strategy.hit(item, key):
            return LimitOutcome(admitted=True)
        # Moving window: the reset time is when the oldest call in the window leaves it, i.e. when
        # one call is available again.
        stats = await self._strategy.get_window_stats(item, key)
        return LimitOutcome(admitted=False, wait_seconds=max(stats.reset_time - time.time(), _MIN_WAIT_SECONDS))

    def peek(self, key: str, spec: RateLimitSpec) -> LimitOutcome:
        """Would `hit` admit a call now? Consumes nothing (a shadow bundle's rate limit)."""
        if not spec.active:
            return LimitOutcome(admitted=True)
        if self._closed:
            return LimitOutcome(admitted=False, error="rate limiter is closed")
        try:
            return self._run(self._peek(key, rate_limit_item(spec, self.namespace)), self.timeout_seconds)
        except concurrent.futures.TimeoutError:
            return LimitOutcome(admitted=False, error=f"rate limiter timed out after {self.timeout_seconds:g}s")
        except Exception as exc:
            return LimitOutcome(admitted=False, error=f"{type(exc).__name__}: {exc}")

    async def _peek(self, key: str, item: RateLimitItemPerSecond) -> LimitOutcome:
        if await self._strategy.test(item, key):
            return LimitOutcome(admitted=True)
        stats = await self._strategy.get_window_stats(item, key)
        return LimitOutcome(admitted=False, wait_seconds=max(stats.reset_time - time.time(), _MIN_WAIT_SECONDS))

    def clear(self, key: str, spec: RateLimitSpec) -> None:
        """Forget one bucket (tests and operators); raises on storage faults."""
        self._run(self._strategy.clear(rate_limit_item(spec, self.namespace), key), self.timeout_seconds)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # do not let abandoned calls pile up on the loop
            raise

    def close(self) -> None:
        """Drop connections, stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # best effort: the thread is a daemon either way
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shutdown(self) -> None:
        strategy = getattr(self, "_strategy", None)
        bridge = getattr(getattr(strategy, "storage", None), "bridge", None)
        if bridge is not None:
            # limits has no close(); the Redis client's pool is the only thing holding sockets.
            pool = getattr(bridge.get_connection(), "connection_pool", None)
            if pool is not None:
                pool.disconnect()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> LimitsLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
