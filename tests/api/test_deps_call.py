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

from kernel.api import threads
from kernel.api.threads import Lane, call
from kernel.bootstrap import build_runtime, default_core_threads
from kernel.config import Settings

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
        while not started.is_set():
            await asyncio.sleep(0.005)
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
    release = threading.Event()

    def stuck() -> str:
        release.wait(5)
        return "stuck"

    def quick() -> str:
        return threading.current_thread().name

    async def scenario() -> tuple[str, float]:
        slow = asyncio.create_task(lane.call(stuck))
        await asyncio.sleep(0.01)  # the lane thread is on `stuck` now
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
    release, ran = threading.Event(), threading.Event()

    async def scenario() -> None:
        blocker = asyncio.create_task(lane.call(release.wait, 5))
        await asyncio.sleep(0.01)
        queued = asyncio.create_task(lane.call(ran.set))
        await asyncio.sleep(0.01)
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
