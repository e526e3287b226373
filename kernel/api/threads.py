"""The one thread hop of a request: blocking core use cases run on the kernel's executor."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# The use cases' threads. A plain executor hop costs about half of anyio's (measured 46 vs 79 µs
# of CPU per call), and a step round trip makes two. 40 threads, as Starlette's default limiter.
_POOL = ThreadPoolExecutor(max_workers=40, thread_name_prefix="regent-core")


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a (blocking) core use case on the thread pool.

    Like Starlette's `run_in_threadpool`, a use case that has started runs to its end (and its
    transaction commits or rolls back) before a cancellation of the request reaches the caller.
    """
    ctx = contextvars.copy_context()
    fut = asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(ctx.run, fn, *args, **kwargs))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise
