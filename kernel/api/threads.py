"""The one thread hop of a request: blocking core use cases run on the kernel's lane.

Under the GIL, short CPU-bound use cases spread over many threads cost far more than the same
use cases run back to back on one thread: every hand-off between threads is a futex wake, a GIL
hand-over and a cold cache. On a 2-CPU box the same 8-client round-trip load cost 4.4–5.3 ms of
server CPU per round trip spread over a 40-thread pool and 3.3–3.7 ms on one thread (bench/README.md).

So a call queues for the lane: a few hot threads (`REGENT_CORE_THREADS`: one on SQLite, four on
PostgreSQL) taking calls from one queue. A call still waiting when no lane thread has taken a call
for `STUCK_AFTER` (every one is on a slow call: a policy evaluation near its timeout, a rate
limiter waiting on its server, a lock held by another replica) is handed to the overflow pool
instead, so a slow use case holds up the others for no longer than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# How long the lane may go without taking a call before the calls queued behind go to the pool.
# A step's use case takes about 1 ms of CPU; 10 ms is well past that and well below what a client
# would notice.
STUCK_AFTER = 0.010
# Overflow threads, as Starlette's default limiter.
OVERFLOW_THREADS = 40


class _Job:
    __slots__ = ("_claim", "fn", "fut", "loop")

    def __init__(self, fn: Callable[[], Any], fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop):
        self.fn = fn
        self.fut = fut
        self.loop = loop
        self._claim = threading.Lock()

    def claim(self) -> bool:
        """True for exactly one caller: the lane, the overflow pool or the cancelling request."""
        return self._claim.acquire(blocking=False)

    def run(self) -> None:
        if not self.claim():
            return
        try:
            result: Any = self.fn()
            exc: BaseException | None = None
        except BaseException as e:  # handed to the awaiting request, as run_in_executor does
            result, exc = None, e
        # RuntimeError: the request's event loop has closed, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_settle, self.fut, result, exc)


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class Lane:
    """Hot threads for blocking calls, spilling to a pool when all of them are stuck."""

    def __init__(self, threads: int = 1, stuck_after: float = STUCK_AFTER,
                 overflow_threads: int = OVERFLOW_THREADS, name: str = "regent-core"):
        self.threads = threads
        self.stuck_after = stuck_after
        self._name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._last_start = 0.0  # monotonic time a lane thread last took a call
        self._started = False
        self._start_lock = threading.Lock()
        self._overflow = ThreadPoolExecutor(max_workers=overflow_threads, thread_name_prefix=f"{name}-overflow")
        self.spilled = 0  # calls the overflow pool ran (for tests and the curious)

    def _ensure_threads(self) -> None:
        if self._started:
            return
        with self._start_lock:
            if not self._started:
                for i in range(self.threads):
                    threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True).start()
                self._started = True

    def _run(self) -> None:
        get = self._queue.get
        clock = time.monotonic
        while True:
            job = get()
            if job is None:  # close()
                return
            self._last_start = clock()
            job.run()

    def queued(self) -> int:
        """Calls waiting for a lane thread (approximate, as `Queue.qsize`)."""
        return self._queue.qsize()

    def close(self) -> None:
        """Stop the lane threads once the calls queued before this have run."""
        for _ in range(self.threads if self._started else 0):
            self._queue.put(None)
        self._overflow.shutdown(wait=False)

    def _check(self, job: _Job) -> None:
        """On the event loop, every `stuck_after` while the job waits: spill it if the lane is stuck."""
        if job.fut.done() or job._claim.locked():
            return
        # Still waiting, and no lane thread has taken a call for `stuck_after`: every one of them
        # is on a slow call.
        if time.monotonic() - self._last_start >= self.stuck_after:
            self.spilled += 1
            self._overflow.submit(job.run)
        else:
            job.loop.call_later(self.stuck_after, self._check, job)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a (blocking) core use case off the event loop and return its result.

        Like Starlette's `run_in_threadpool`, a use case that has started runs to its end (and its
        transaction commits or rolls back) before a cancellation of the request reaches the
        caller. One that has not started yet never starts.
        """
        self._ensure_threads()
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        job = _Job(functools.partial(ctx.run, fn, *args, **kwargs), loop.create_future(), loop)
        self._queue.put(job)
        loop.call_later(self.stuck_after, self._check, job)
        try:
            return await asyncio.shield(job.fut)  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            if not job.claim():  # already running (or done): let it finish first
                await asyncio.wait([job.fut])
                if not job.fut.cancelled():
                    job.fut.exception()  # retrieved: the request's cancellation is what propagates
            raise


_LANE = Lane()
_CONFIGURE = threading.Lock()


def configure(threads: int) -> None:
    """Set the number of lane threads (`REGENT_CORE_THREADS`); the serving process calls it once
    at start-up. The old lane, if any, stops after the calls already queued on it."""
    global _LANE
    if threads < 1:
        raise ValueError("the lane needs at least one thread")
    with _CONFIGURE:
        if _LANE.threads != threads:
            old, _LANE = _LANE, Lane(threads=threads)
            old.close()


def lane() -> Lane:
    return _LANE


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a (blocking) core use case on the kernel's lane (see `Lane.call`)."""
    return await _LANE.call(fn, *args, **kwargs)
