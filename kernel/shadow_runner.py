"""The shadow runner: judges observed steps against each agent's shadow bundle on a thread of its
own, after the answers have gone out, and writes the tallies and disagreements in batches.

The step path only does `wants` (a dict lookup) and `observe` (a non-blocking queue put). Nothing
here holds a transaction open while a shadow evaluates: judging happens outside the store, and
each flush is one short write per shadow.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

from kernel.core import shadow as core
from kernel.core.kernel import Kernel
from kernel.core.ports import ShadowObservation
from kernel.core.shadow import Batch, Judgement, ShadowPolicy
from kernel.domain.decision import ShadowRef

log = logging.getLogger("kernel.shadow")

_BATCH = 256  # observations taken off the queue per pass
# After a pass that found fewer than _BATCH, wait this long for more to gather: the thread then
# wakes about 50 times a second under load instead of once per step (each wake-up takes the GIL
# from the threads answering steps). Judging is after the answer anyway; this delays only the report.
_GATHER_SECONDS = 0.02
# The breaker: a shadow that faults this many times in a row is not evaluated for a pause that
# starts at _PAUSE_SECONDS and doubles up to _MAX_PAUSE_SECONDS while it keeps faulting; the steps
# meanwhile are counted as `skipped`. A crashing shadow would otherwise cost a worker process per
# step, and the CPU to start them is shared with the active path.
_BREAKER_FAULTS = 3
_PAUSE_SECONDS = 5.0
_MAX_PAUSE_SECONDS = 300.0


class ShadowRunner:
    """Implements the core's `ShadowObserver`."""

    def __init__(self, kernel: Kernel, policy: ShadowPolicy, *, queue_size: int = 10_000,
                 flush_interval: float = 0.5, refresh_interval: float = 1.0):
        self.kernel = kernel
        self.policy = policy
        self.flush_interval = flush_interval
        self.refresh_interval = refresh_interval
        # Each observation with the shadow it was observed under; None is close() waking the thread.
        self._queue: queue.Queue[tuple[ShadowRef, ShadowObservation] | None] = queue.Queue(maxsize=queue_size)
        self._refs: dict[str, ShadowRef] = {}
        self._lock = threading.Lock()
        self._dropped: dict[int, Batch] = {}
        self._outstanding = 0  # observed and queued, not yet written (or skipped)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._breaker: dict[int, tuple[int, float, float]] = {}  # id → (faults in a row, paused until, pause)
        self.judged = 0
        self.dropped = 0
        self.skipped = 0
        self.faults = 0

    # -- ShadowObserver ---------------------------------------------------------------------
    def wants(self, agent_id: str) -> bool:
        return agent_id in self._refs

    def observe(self, obs: ShadowObservation) -> None:
        # The shadow is read now, not when the thread gets to the step: a step observed while the
        # shadow ran is its to judge even if it is promoted or cleared before the judging (looked
        # up then, such a step was counted nowhere; seen in CI when a promote came right after one).
        ref = self._refs.get(obs.inp.agent_id)
        if ref is None:
            return  # cleared since the step path's `wants`
        with self._lock:
            self._outstanding += 1
        try:
            self._queue.put_nowait((ref, obs))
        except queue.Full:
            with self._lock:
                self._outstanding -= 1
                self._dropped.setdefault(ref.id, Batch()).drop(obs.outcome)
                self.dropped += 1

    def reload(self) -> None:
        try:
            refs = core.shadowing_refs(self.kernel)
        except Exception:
            log.exception("could not read the shadow bundles; keeping the previous list")
            return
        self._refs = {r.agent_id: r for r in refs}
        forget = getattr(self.policy, "forget_except", None)
        if forget is not None:
            forget({r.id for r in refs})

    def backlog(self) -> int:
        return self._outstanding

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.reload()
        self._thread = threading.Thread(target=self._run, name="regent-shadow", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after judging what is queued (within `timeout`) and writing it."""
        self._stop.set()
        with contextlib.suppress(queue.Full):  # a full queue: the thread is awake anyway
            self._queue.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout)
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until everything observed so far is recorded (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self.backlog() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.backlog() == 0

    # -- the loop ---------------------------------------------------------------------------
    def _prepare(self) -> None:
        """On this thread, never on a request's: compile new shadows and start their engine."""
        prepare = getattr(self.policy, "prepare", None)
        if prepare is not None:
            try:
                prepare(list(self._refs.values()))
            except Exception:
                log.exception("could not prepare the shadow bundles; they compile on first use")

    def _run(self) -> None:
        batches: dict[int, Batch] = {}
        taken = 0  # observations taken off the queue since the last flush
        self._prepare()
        last_flush = last_refresh = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            if stopping:
                wait = 0.0
            elif taken:  # judgements waiting for their flush
                wait = 0.05
            else:  # nothing pending: an observation (or close) wakes the thread; else the next refresh
                wait = max(0.05, last_refresh + self.refresh_interval - time.monotonic())
            items = self._take(wait)
            taken += len(items)
            for ref, obs in items:
                batch = batches.setdefault(ref.id, Batch())
                if self._suspended(ref.id):
                    batch.skip(obs.outcome)
                    self.skipped += 1
                    continue
                j = self._judge(ref, obs)
                batch.add(j)
                self._note(ref, j)
            now = time.monotonic()
            # Under load, one write per shadow every flush_interval; when steps stop coming (a whole
            # wait found the queue empty), sooner. On SQLite each write waits for, and holds up,
            # the steps' writer, so a busy kernel must not pay one every pass.
            idle = not items
            due = now - last_flush >= (self.flush_interval / 5 if idle else self.flush_interval)
            if taken and (stopping or due):
                self._flush(batches, taken)
                batches, taken = {}, 0
                last_flush = now
            if now - last_refresh >= self.refresh_interval:
                self.reload()
                self._prepare()
                last_refresh = now
            if stopping and not items:
                self._flush(batches, taken)
                return
            if items and len(items) < _BATCH and not stopping:
                self._stop.wait(_GATHER_SECONDS)

    def _take(self, wait: float) -> list[tuple[ShadowRef, ShadowObservation]]:
        try:
            first = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            return []
        items = [first] if first is not None else []  # None: close() waking the thread
        while len(items) < _BATCH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                items.append(item)
        return items

    def _suspended(self, shadow_id: int) -> bool:
        state = self._breaker.get(shadow_id)
        return state is not None and state[1] > time.monotonic()

    def _note(self, ref: ShadowRef, j: Judgement) -> None:
        """Count consecutive faults per shadow; trip the breaker at _BREAKER_FAULTS."""
        faults, until, pause = self._breaker.get(ref.id, (0, 0.0, 0.0))
        if j.error is None:
            self._breaker.pop(ref.id, None)
            return
        faults += 1
        if faults >= _BREAKER_FAULTS:
            pause = min(pause * 2, _MAX_PAUSE_SECONDS) if pause else _PAUSE_SECONDS
            until = time.monotonic() + pause
            faults = 0
            log.warning("shadow %d of agent %s faulted %d times in a row (last: %s); not evaluated for %gs",
                        ref.id, ref.agent_id, _BREAKER_FAULTS, j.error, pause)
        self._breaker[ref.id] = (faults, until, pause)

    def _judge(self, ref: ShadowRef, obs: ShadowObservation) -> Judgement:
        try:
            j = core.judge(self.kernel, self.policy, ref, obs)
        except Exception as exc:  # never lose the thread to one step
            log.exception("shadow judgement failed (agent %s, step %s)", ref.agent_id, obs.step_id)
            j = Judgement(obs, ref, None, "eval-error", f"{type(exc).__name__}: {exc}")
        self.judged += 1
        if j.error is not None:
            self.faults += 1
        return j

    def _flush(self, batches: dict[int, Batch], taken: int) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, {}
        for sid, b in dropped.items():
            mine = batches.setdefault(sid, Batch())
            for key, n in b.tallies.items():
                mine.tallies[key] = mine.tallies.get(key, 0) + n
        try:
            core.record(self.kernel, batches)
        except Exception:
            n = sum(len(b) for b in batches.values())
            log.exception("could not record %d shadow judgements; they are lost", n)
        with self._lock:
            self._outstanding -= taken
