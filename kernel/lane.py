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

On SQLite a step's submit or outcome that finds the kernel idle skips the hop altogether and runs
on the event loop (`call_hot`, `InlineGate`, below).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from kernel.store.base import CommitGroups

T = TypeVar("T")
P = ParamSpec("P")

# How long the lane may go without taking a call before the calls queued behind go to the pool.
# A step's use case takes about 1 ms of CPU, but on a loaded machine a call or a group's fsync
# routinely takes over 10 ms of wall time. At 10 ms, a flood of requests spilled onto the pool's
# 40 threads, whose SQLite writers then raced the lane for the write lock: the lane stalled for
# up to a second at a time, and webhook deliveries fell to 8/s under 280 creates/s (issue 18 §0;
# `regent bench --scenarios dispatch`). 100 ms still caps what a slow call holds up others.
STUCK_AFTER = 0.100
# Overflow threads, as Starlette's default limiter.
OVERFLOW_THREADS = 40
# A commit group ends after this many calls or this long after its first call ended, whichever
# comes first (or as soon as no call waits): a bound on how long a written answer waits.
GROUP_CALLS = 16
GROUP_SECONDS = 0.004


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
        outcome = self.execute()
        if outcome is not None:
            self.settle(*outcome)

    def execute(self) -> tuple[Any, BaseException | None] | None:
        """Run the call if nobody else has claimed it: (result, exception), or None."""
        if not self.claim():
            return None
        try:
            return self.fn(), None
        except BaseException as e:  # handed to the awaiting request, as run_in_executor does
            return None, e

    def settle(self, result: Any, exc: BaseException | None) -> None:
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
    """Hot threads for blocking calls, spilling to a pool when all of them are stuck.

    With `groups` (SQLite), each lane thread groups its commits: while more calls wait in the
    queue, the write transaction a call left open takes the next calls' transactions as well,
    and one commit (one fsync) ends them all, after at most `GROUP_CALLS` calls or
    `GROUP_SECONDS`. A call's answer is released only after the commit that holds its writes.
    """

    def __init__(self, threads: int = 1, stuck_after: float = STUCK_AFTER,
                 overflow_threads: int = OVERFLOW_THREADS, name: str = "regent-core",
                 groups: CommitGroups | None = None):
        self.threads = threads
        self.groups = groups
        self.stuck_after = stuck_after
        self._name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Calls that go before everything queued (`call_first`): each is also put on the
        # queue, to wake a waiting thread; met there again, it has run and is skipped (`execute`).
        self._front: collections.deque[_Job] = collections.deque()
        self._last_start = 0.0  # monotonic time a lane thread last took a call (or ended a commit)
        self._flushing = False  # a lane thread is committing a group
        self._started = False
        self._start_lock = threading.Lock()
        self._overflow = ThreadPoolExecutor(max_workers=overflow_threads, thread_name_prefix=f"{name}-overflow")
        self.spilled = 0  # calls the overflow pool ran (for tests and the curious)
        # A grouping lane thread has a call or an open group (`_run_grouped`): read by `idle`.
        self.busy = False
        # When a hot call may run on the event loop instead (`call_hot`); None: never.
        self.inline: InlineGate | None = None

    def idle(self) -> bool:
        """No call queued or running on the lane and no commit group open (a grouping lane: SQLite)."""
        return self.groups is not None and not self.busy and not self._front and self._queue.empty()

    def _ensure_threads(self) -> None:
        if self._started:
            return
        with self._start_lock:
            if not self._started:
                for i in range(self.threads):
                    threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True).start()
                self._started = True

    def _run(self) -> None:
        if self.groups is not None:
            self._run_grouped(self.groups)
            return
        get, front = self._queue.get, self._front
        clock = time.monotonic
        while True:
            job = front.popleft() if front else get()
            if job is None:  # close()
                return
            self._last_start = clock()
            job.run()

    def _run_grouped(self, groups: CommitGroups) -> None:
        groups.attach()
        get, empty, front = self._queue.get, self._queue.empty, self._front
        clock = time.monotonic
        held: list[tuple[_Job, Any, BaseException | None]] = []  # ran; answer not released yet
        opened = 0.0  # when the open group's first call ended
        while True:
            job: _Job | None
            if front:
                job = front.popleft()
            else:
                if empty():
                    self.busy = False  # nothing held, no group open: about to wait for a call
                job = get()
            self.busy = True
            if job is None:  # close()
                groups.flush()
                self._release(groups, held)
                return
            self._last_start = clock()
            groups.start(job)
            outcome = job.execute()
            groups.start(None)
            if outcome is not None:
                held.append((job, *outcome))
            if groups.is_open():
                if not opened:
                    opened = clock()
                if not empty() and len(held) < GROUP_CALLS and clock() - opened < GROUP_SECONDS:
                    self._release(groups, held)  # those that wrote nothing (or whose group committed)
                    continue
                self._flush(groups)
            opened = 0.0
            self._release(groups, held)

    def _flush(self, groups: CommitGroups) -> None:
        """Commit the open group. The commit (an fsync, often over 10 ms on a busy disk) is the
        lane at work, not stuck on a slow call: queued calls must not spill meanwhile. Spilled,
        they only race this thread for SQLite's write lock, and under a flood of requests that
        stalled the lane (and the dispatcher's claims with it) for up to a second at a time."""
        self._flushing = True
        try:
            groups.flush()
        finally:
            self._flushing = False
            self._last_start = time.monotonic()

    @staticmethod
    def _release(groups: CommitGroups, held: list[tuple[_Job, Any, BaseException | None]]) -> None:
        """Answer every held call whose writes have committed (or failed to)."""
        keep = []
        for entry in held:
            job, result, exc = entry
            if groups.pending(job):
                keep.append(entry)
                continue
            failed = groups.failure(job)
            if failed is not None:
                job.settle(None, failed)
            else:
                job.settle(result, exc)
        held[:] = keep

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
        if not self._flushing and time.monotonic() - self._last_start >= self.stuck_after:
            self.spilled += 1
            self._overflow.submit(job.run)
        else:
            job.loop.call_later(self.stuck_after, self._check, job)

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        """Run a (blocking) core use case off the event loop and return its result (`_submit`)."""
        return self._submit(fn, args, kwargs, first=False)

    def call_first(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        """`call`, before every call already queued (`_submit`)."""
        return self._submit(fn, args, kwargs, first=True)

    async def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], first: bool) -> T:
        """Run a (blocking) core use case off the event loop and return its result; with `first`,
        before every call already queued, and never on the overflow pool (the dispatcher's claims
        and verdicts: under a flood of requests, work already accepted is delivered before more is
        taken in).

        Like Starlette's `run_in_threadpool`, a use case that has started runs to its end (and its
        transaction commits or rolls back) before a cancellation of the request reaches the
        caller. One that has not started yet never starts.
        """
        self._ensure_threads()
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        job = _Job(functools.partial(ctx.run, fn, *args, **kwargs), loop.create_future(), loop)
        if first:
            self._front.append(job)
        self._queue.put(job)
        if not first:
            # A call that goes first never spills: on the overflow pool it would race the lane
            # for SQLite's write lock, and lose (kernel/dispatcher.py). It waits one call at most.
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


def configure(threads: int, groups: CommitGroups | None = None) -> Lane:
    """Set the number of lane threads (`REGENT_CORE_THREADS`) and the store whose commits they
    group (SQLite, `REGENT_SQLITE_GROUP_COMMIT`); the serving process calls it once at start-up
    (kernel/bootstrap.py, which keeps the lane on its Runtime). The old lane, if any, stops after
    the calls already queued on it; its inline gate carries over. Returns the lane now in use."""
    global _LANE
    if threads < 1:
        raise ValueError("the lane needs at least one thread")
    with _CONFIGURE:
        if _LANE.threads != threads or _LANE.groups is not groups:
            old, _LANE = _LANE, Lane(threads=threads, groups=groups)
            _LANE.inline = old.inline
            old.close()
        return _LANE


def lane() -> Lane:
    return _LANE


# A check the request's next `call` runs first, in the same lane job (`before_next_call`).
_BEFORE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("regent_before_call",
                                                                                    default=None)


def before_next_call(check: Callable[[], None]) -> None:
    """Have this request's next `call` run `check` on the lane first, in the same job: the use case
    runs only if `check` returns, and the request takes one hop to the lane instead of two (the
    shared replay guard on PostgreSQL, kernel/api/auth.py). A request that makes no call never
    runs it."""
    _BEFORE.set(check)


def _checked(check: Callable[[], None], fn: Callable[[], T]) -> T:
    check()
    return fn()


async def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a (blocking) core use case on the kernel's lane (see `Lane.call`)."""
    check = _BEFORE.get()
    if check is not None:
        _BEFORE.set(None)
        return await _LANE.call(_checked, check, functools.partial(fn, *args, **kwargs))
    return await _LANE.call(fn, *args, **kwargs)


# -- calls on the event loop ------------------------------------------------------------------
#
# On SQLite, a step call handed to the lane and back costs two thread wake-ups, and on an idle
# kernel (one agent stepping: the common case) the sleeping lane thread's wake-up and then the
# event loop's are most of a round trip's latency and a quarter of its CPU (bench/README.md, "A
# step on an idle kernel"). So a hot call (a step's submit or outcome) that finds the kernel
# idle runs on the event loop itself: its use case, its commit and its fsync, while nothing else
# is waiting to be served. Idle: the lane has no call and no open commit group, and the server
# holds no request but this one (long-lived streams aside). Under load calls go to the lane as
# before, where concurrent commits share one fsync.
#
# A call that blocks the loop for long (a slow disk, a Rego evaluation near its timeout, a rate
# limiter waiting on its server) holds up what arrives meanwhile; one slower than INLINE_SLOW
# sends every call to the lane for INLINE_PAUSE, so a slow dependency costs the loop at most
# one such call a pause.
INLINE_SLOW = 0.010
INLINE_PAUSE = 1.0


class InlineGate:
    """When a hot call may run on the event loop (`call_hot`); installed by the server that knows
    its requests in flight (kernel/cli/server.py)."""

    def __init__(self, in_flight: Callable[[], int], slow_after: float = INLINE_SLOW, pause: float = INLINE_PAUSE):
        self.in_flight = in_flight  # requests the server holds, the caller's own included
        self.slow_after = slow_after
        self.pause = pause
        self.long_lived = 0  # of those, the event streams held open (`long_lived`): not waiting on the lane
        self.paused_until = 0.0
        self.ran = 0  # calls run on the loop (for /metrics, tests and the curious)
        self.slow = 0  # of which slower than `slow_after`

    def open(self) -> bool:
        return self.in_flight() - self.long_lived <= 1 and time.monotonic() >= self.paused_until

    def run(self, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            return contextvars.copy_context().run(fn)  # as on the lane: the use case's context is its own
        finally:
            ended = time.monotonic()
            self.ran += 1
            if ended - started > self.slow_after:
                self.slow += 1
                self.paused_until = ended + self.pause


def install_inline(gate: InlineGate | None) -> None:
    """Let hot calls run on the event loop when the kernel is idle (None: never)."""
    _LANE.inline = gate


def inline_gate() -> InlineGate | None:
    return _LANE.inline


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Around a response held open (an event stream): its request is not one a call would hold up."""
    gate = _LANE.inline
    if gate is not None:
        gate.long_lived += 1
    try:
        yield
    finally:
        if gate is not None:
            gate.long_lived -= 1


# A task whose hot calls go to the lane even on an idle kernel (`off_loop`).
_OFF_LOOP: contextvars.ContextVar[bool] = contextvars.ContextVar("regent_off_loop", default=False)


def off_loop() -> None:
    """Send this task's hot calls to the lane even when the kernel is idle: work done while its
    request's answer is on its way back, which a call on the event loop would hold up until its
    commit's fsync is over (the MCP gateway in the kernel's process records a step's outcome while
    it answers the client: recorded on the loop, the answer waited and a tools/call took 0.5 ms
    more at p50 on SQLite, bench/journal/2026-12-05-mcp-gateway.md)."""
    _OFF_LOOP.set(True)


async def call_hot(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`call` for a step's submit or outcome: on the event loop itself when the kernel is idle
    (`InlineGate`), else on the lane."""
    lane = _LANE
    gate = lane.inline
    if gate is None or _OFF_LOOP.get() or not lane.idle() or not gate.open():
        return await call(fn, *args, **kwargs)
    check = _BEFORE.get()
    work = functools.partial(fn, *args, **kwargs)
    if check is not None:
        _BEFORE.set(None)
        work = functools.partial(_checked, check, work)
    return gate.run(work)


async def call_first(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a (blocking) core use case on the kernel's lane before every call already queued."""
    return await _LANE.call_first(fn, *args, **kwargs)
