"""`call`: the one thread hop of a request. A started use case always runs to its end before the
request's cancellation reaches the caller, and context variables cross the hop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

from kernel.api.threads import call

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
