"""`call`: the one thread hop of a request, onto the lane. A started use case always runs to its end
before the request's cancellation reaches the caller, one not started never starts, context
variables cross the hop, and a call stuck on the lane does not hold up the calls behind it."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from pathlib import Path

import pytest

from kernel import lane as threads
from kernel.bootstrap import build_runtime, default_core_threads
from kernel.config import Settings
from kernel.lane import Lane, call
from tests.support import until

REQUEST = contextvars.ContextVar("request", default="none")


def test_a_cancelled_request_still_waits_for_its_use_case_to_finish() -> None:
    started, finished = threading.Event(), threading.Event()

    def use_case() -> str:
        started.set()
        time.sleep(0.2)
        finished.set()
        return "done"

    async def scenario() -> bool:
        task = asyncio.create_task(call(use_case))
        await until(started.is_set, "the use case to start")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return finished.is_set()  # the cancellation landed only after the use case ended
        return False

    assert asyncio.run(scenario()) is True


def test_context_variables_and_results_cross_the_hop() -> None:
    async def scenario() -> tuple[str, str]:
        REQUEST.set("req-1")
        return await call(lambda: REQUEST.get()), threading.current_thread().name

    value, loop_thread = asyncio.run(scenario())
    assert value == "req-1" and not loop_thread.startswith("regent-core")


# -- the lane --------------------------------------------------------------------------------------


def test_calls_run_back_to_back_on_the_lane_thread_in_order() -> None:
    lane = Lane(threads=1)
    seen: list[tuple[int, str]] = []

    def use_case(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 2

    async def scenario() -> list[int]:
        return list(await asyncio.gather(*(lane.call(use_case, i) for i in range(20))))

    try:
        assert asyncio.run(scenario()) == [i * 2 for i in range(20)]
    finally:
        lane.close()
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"regent-core-0"}
    assert lane.spilled == 0


def test_a_call_queued_behind_a_stuck_one_goes_to_the_overflow_pool() -> None:
    lane = Lane(threads=1, stuck_after=0.02)
    release, entered = threading.Event(), threading.Event()

    def stuck() -> str:
        entered.set()
        release.wait(5)
        return "stuck"

    def quick() -> str:
        return threading.current_thread().name

    async def scenario() -> tuple[str, float]:
        slow = asyncio.create_task(lane.call(stuck))
        await until(entered.is_set, "the lane thread to be on `stuck`")
        t0 = time.monotonic()
        name = await lane.call(quick)
        waited = time.monotonic() - t0
        release.set()
        assert await slow == "stuck"
        return name, waited

    try:
        name, waited = asyncio.run(scenario())
    finally:
        release.set()
        lane.close()
    assert name.startswith("regent-core-overflow")
    assert waited < 1.0  # not held until the stuck call ended (5 s)
    assert lane.spilled == 1


def test_a_call_cancelled_before_it_starts_never_runs() -> None:
    lane = Lane(threads=1, stuck_after=10.0)
    release, ran, entered = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(5)

    async def scenario() -> None:
        blocker = asyncio.create_task(lane.call(hold))
        await until(entered.is_set, "the lane thread to be on the blocker")
        queued = asyncio.create_task(lane.call(ran.set))
        await asyncio.sleep(0)  # one loop turn: the task's first step puts the call on the queue
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        await blocker
        await lane.call(lambda: None)  # everything queued after it has run

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        lane.close()
    assert not ran.is_set()


def test_errors_reach_the_caller() -> None:
    lane = Lane(threads=2)

    def boom() -> None:
        raise KeyError("nope")

    async def scenario() -> None:
        with pytest.raises(KeyError):
            await lane.call(boom)

    try:
        asyncio.run(scenario())
    finally:
        lane.close()


def test_configure_replaces_the_lane_and_refuses_zero() -> None:
    before = threads.lane()
    try:
        threads.configure(3)
        assert threads.lane().threads == 3
        assert asyncio.run(threads.call(lambda: 42)) == 42
        with pytest.raises(ValueError):
            threads.configure(0)
    finally:
        threads.configure(before.threads)


@pytest.mark.parametrize(("setting", "expected"), [(None, 1), (3, 3)])
def test_serving_on_sqlite_sizes_the_lane_from_the_settings(tmp_path: Path, setting: int | None,
                                                            expected: int) -> None:
    before = threads.lane().threads
    rt = build_runtime(Settings(db_url=f"sqlite:///{tmp_path}/k.db", core_threads=setting))
    try:
        assert threads.lane().threads == expected
    finally:
        rt.close()
        threads.configure(before)


def test_postgres_defaults_to_four_lane_threads() -> None:
    assert default_core_threads("postgresql") == 4 and default_core_threads("sqlite") == 1


def test_a_call_whose_event_loop_closed_does_not_stop_the_lane() -> None:
    lane = Lane(threads=1)
    ran = threading.Event()
    gone = asyncio.new_event_loop()
    job = threads._Job(ran.set, gone.create_future(), gone)
    gone.close()  # the request's loop ended before its call ran (a server shutting down)
    try:
        lane._ensure_threads()
        lane._queue.put(job)
        assert asyncio.run(lane.call(lambda: threading.current_thread().name)) == "regent-core-0"
        assert ran.is_set()
    finally:
        lane.close()


def test_a_call_that_goes_first_runs_before_those_queued_and_never_spills() -> None:
    """The dispatcher's claims and verdicts (kernel/dispatcher.py): ahead of the queue, and kept
    on the lane even when it looks stuck, since on the pool they would race it for SQLite's lock."""
    lane = Lane(threads=1, stuck_after=0.02)
    release, entered = threading.Event(), threading.Event()
    order: list[str] = []

    def blocker() -> None:
        entered.set()
        release.wait(5)

    def note(name: str) -> str:
        order.append(name)
        return threading.current_thread().name

    async def scenario() -> tuple[str, list[str]]:
        first = asyncio.create_task(lane.call(blocker))
        await until(entered.is_set, "the lane thread to be on `blocker`")
        queued = [asyncio.create_task(lane.call(note, f"queued-{i}")) for i in range(3)]
        await until(lambda: lane.spilled == 3, "the queued calls to spill (the lane looks stuck)")
        urgent = asyncio.create_task(lane.call_first(note, "urgent"))
        await asyncio.sleep(0)  # queued ahead now
        # A sentinel queued after it spills once its own stuck_after has passed, later than the
        # urgent call would have: when it has, the urgent one is still waiting for the lane.
        sentinel = asyncio.create_task(lane.call(note, "sentinel"))
        await until(lambda: lane.spilled == 4, "the sentinel to spill")
        # A spilled call runs on whichever thread takes it first: under load the pool's thread may
        # not have taken them yet when the blocker ends, so the lane would. Wait until they ran.
        await until(lambda: {"queued-0", "queued-1", "queued-2", "sentinel"} <= set(order),
                    "the spilled calls to run on the pool")
        assert not urgent.done()
        release.set()
        await first
        names = await asyncio.gather(*queued, sentinel)
        return await urgent, list(names)

    try:
        urgent_thread, spilled_threads = asyncio.run(scenario())
    finally:
        release.set()
        lane.close()
    assert urgent_thread == "regent-core-0"
    assert all(n.startswith("regent-core-overflow") for n in spilled_threads)
    assert lane.spilled == 4


def test_a_call_that_goes_first_overtakes_the_queue() -> None:
    lane = Lane(threads=1, stuck_after=10.0)
    release, entered = threading.Event(), threading.Event()
    order: list[str] = []

    def hold() -> None:
        entered.set()
        release.wait(5)

    async def scenario() -> None:
        blocker = asyncio.create_task(lane.call(hold))
        await until(entered.is_set, "the lane thread to be on the blocker")
        queued = [asyncio.create_task(lane.call(order.append, f"q{i}")) for i in range(3)]
        await asyncio.sleep(0)  # one loop turn: their first steps queue them, in order
        urgent = asyncio.create_task(lane.call_first(order.append, "urgent"))
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(blocker, urgent, *queued)

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        lane.close()
    assert order == ["urgent", "q0", "q1", "q2"]
    assert lane.spilled == 0


class _SlowCommits:
    """CommitGroups whose every call writes and whose commit takes 100 ms (a slow fsync)."""

    def __init__(self) -> None:
        self.open = False
        self.flushes = 0
        self.flushing = threading.Event()

    def attach(self) -> None: ...

    def start(self, token: object) -> None:
        if token is not None:
            self.open = True

    def is_open(self) -> bool:
        return self.open

    def pending(self, token: object) -> bool:
        return False

    def failure(self, token: object) -> BaseException | None:
        return None

    def flush(self) -> None:
        self.flushing.set()
        time.sleep(0.1)  # the slow commit under test
        self.flushes += 1
        self.open = False


def test_calls_queued_while_a_group_commits_do_not_spill() -> None:
    groups = _SlowCommits()
    lane = Lane(threads=1, stuck_after=0.02, groups=groups)

    async def scenario() -> list[str]:
        first = asyncio.create_task(lane.call(lambda: threading.current_thread().name))
        await until(groups.flushing.is_set, "its group to be committing (100 ms)")
        names = [asyncio.create_task(lane.call(lambda: threading.current_thread().name)) for _ in range(3)]
        return [await first, *[await n for n in names]]  # they waited ~70 ms, past stuck_after

    try:
        names = asyncio.run(scenario())
    finally:
        lane.close()
    assert set(names) == {"regent-core-0"}
    assert lane.spilled == 0 and groups.flushes >= 1
