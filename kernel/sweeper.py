"""Background sweep loops: run the leader-gated passes of `core/sweeps.py` on their intervals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from kernel.core import sweeps
from kernel.core.kernel import Kernel

log = logging.getLogger("kernel.sweeper")


class Sweeper:
    """The cleanup sweep (approval expiry, retention) every `cleanup_interval`, and the deadline
    sweep every `deadline_check_interval` (0 folds deadlines into the cleanup sweep). An interval
    of 0 for cleanup turns that loop off. The decision journal is moved into the decisions table
    every `decision_flush_interval` (and once more on stop). Every replica runs the loops; only the
    leader works."""

    def __init__(self, kernel: Kernel, *, leader_key: str, cleanup_interval: float,
                 deadline_check_interval: float, decision_flush_interval: float = 1.0):
        self.kernel = kernel
        self.leader_key = leader_key
        self.cleanup_interval = cleanup_interval
        self.deadline_check_interval = deadline_check_interval
        self.decision_flush_interval = decision_flush_interval
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        fold = self.deadline_check_interval <= 0
        if self.cleanup_interval > 0:
            self._tasks.append(asyncio.create_task(
                self._every(self.cleanup_interval, self._cleanup, fold, run_first=True), name="regent-cleanup"))
        if not fold:
            self._tasks.append(asyncio.create_task(
                self._every(self.deadline_check_interval, self._deadlines, run_first=True), name="regent-deadlines"))
        if self.decision_flush_interval > 0:
            self._tasks.append(asyncio.create_task(
                self._every(self.decision_flush_interval, self._flush_decisions), name="regent-decision-journal"))

    async def stop(self) -> None:
        self._stopping.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=10.0)
            for t in late:
                t.cancel()
        if self.decision_flush_interval > 0:
            try:  # what the last interval wrote, so a clean stop leaves the journal empty
                await anyio.to_thread.run_sync(self._flush_decisions)
            except Exception:
                log.exception("the decision journal's last flush failed; the next start moves it")

    def _flush_decisions(self) -> None:
        sweeps.decision_journal_sweep(self.kernel, self.leader_key)

    def _cleanup(self, include_deadlines: bool) -> None:
        r = sweeps.cleanup_sweep(self.kernel, self.leader_key, include_deadlines=include_deadlines)
        if r is not None and (r.approvals_expired or r.executions_deleted or r.deadlines_cancelled
                              or r.decisions_deleted or r.disagreements_deleted or r.sessions_repaired):
            log.info("cleanup: %d approval(s) expired, %d execution(s) deleted, %d past deadline cancelled, "
                     "%d decision record(s) and %d shadow disagreement(s) past retention deleted, "
                     "%d session/parent admission(s) repaired",
                     r.approvals_expired, r.executions_deleted, r.deadlines_cancelled, r.decisions_deleted,
                     r.disagreements_deleted, r.sessions_repaired)

    def _deadlines(self) -> None:
        n = sweeps.deadline_sweep(self.kernel, self.leader_key)
        if n:
            log.info("cancelled %d execution(s) past their deadline", n)

    async def _every(self, interval: float, fn: Callable[..., Any], *args: Any, run_first: bool = False) -> None:
        first = run_first
        while not self._stopping.is_set():
            if not first:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=interval)
                if self._stopping.is_set():
                    return
            first = False
            try:
                await anyio.to_thread.run_sync(fn, *args)
            except Exception:
                log.exception("sweep %s failed; it runs again next interval", fn.__name__)
