"""Outbound webhooks (rebuno-v0 §6.2–6.4): claim due dispatches, POST each one signed to its agent,
record the verdict; a lease reaper returns expired in-flight rows to the queue.

The core use cases are blocking (they run transactions), so every one runs off the event loop:
in the serving process on the API's lane, ahead of the requests' calls (`run_blocking`), rather
than on a thread of its own that raced a busy lane for SQLite's write lock and lost nearly every
time (7 deliveries/s under 280 creates/s). The loop itself only waits on HTTP and timers, on an
event loop of its own (`DispatcherThread`). One call reads the due rows, calls of `CLAIM_CHUNK` of
them claim them side by side, and verdicts are recorded in batches after the webhook answered, so
a delivery holds its slot only while it is on the wire.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio.to_thread
import httpx

from kernel.core.dispatch import Claim, claim_ids, due_ids, reap_expired_leases, record_delivery
from kernel.core.kernel import Kernel
from kernel.delivery_gate import DeliveryGate, host_key
from kernel.domain import Agent
from kernel.signing import webhook_signature

log = logging.getLogger("kernel.dispatcher")

USER_AGENT = "regent/0.1.0"
MAX_REAP_INTERVAL = 2.0
# Rows claimed per call, and verdicts recorded per call: short calls keep the lane's other users
# waiting briefly.
CLAIM_CHUNK = 8
RECORD_CHUNK = 16
MAX_RECORDERS = 4  # record calls queued at once (PostgreSQL's lane runs them side by side)
# An agent's answer body is not used: this much is read so its connection can carry the next
# delivery; past it the connection is closed instead.
MAX_ANSWER_BYTES = 64 * 1024
# A failed delivery's `error` in its dispatch.failed event is cut to this length (an exception's
# text may quote what the agent registered).
MAX_DETAIL_CHARS = 300


# A delivery's outcome, as /metrics counts it.
OUTCOMES = ("acked", "status", "timeout", "connection", "error", "agent_missing")


def outcome_of(ok: bool, detail: str | None) -> str:
    if ok:
        return "acked"
    if detail and detail.startswith("HTTP "):
        return "status"
    if detail and detail.startswith("timeout"):
        return "timeout"
    return "connection"


def failure_detail(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS - 1] + "…"


def webhook_body(claim: Claim) -> bytes:
    """The webhook body, fields in Rebuno's order; a whole-second lease prints as an integer."""
    lease = float(claim.lease_timeout_seconds)
    return json.dumps(
        {
            "execution_id": claim.execution_id,
            "dispatch_id": claim.dispatch_id,
            "dispatch_attempt": claim.attempt,
            "lease_timeout_seconds": int(lease) if lease.is_integer() else lease,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def webhook_headers(claim: Claim, secret: str, body: bytes, replica_id: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Rebuno-Signature": webhook_signature(secret, body),
        "Rebuno-Execution-Id": claim.execution_id,
        # Not part of the contract: names the replica that delivered, for logs on the agent side.
        "User-Agent": f"{USER_AGENT} ({replica_id})",
    }


def reap_interval(default_lease_seconds: float) -> float:
    """§6.4: every min(2 s, default lease / 4)."""
    return max(0.05, min(MAX_REAP_INTERVAL, default_lease_seconds / 4))


def _claim_with_agents(k: Kernel, ids: list[str]) -> list[tuple[Claim, Agent | None]]:
    claims = claim_ids(k, ids)
    if not claims:
        return []
    try:
        with k.store.read() as tx:
            return [(c, tx.get_agent(c.agent_id)) for c in claims]
    except Exception:
        log.exception("reading the agents of %d claimed dispatches failed; reading them one by one", len(claims))
    out: list[tuple[Claim, Agent | None]] = []
    for c in claims:  # an unreadable agent row fails its own delivery, not the whole batch
        try:
            with k.store.read() as tx:
                out.append((c, tx.get_agent(c.agent_id)))
        except Exception:
            log.exception("reading agent %r for dispatch %s failed", c.agent_id, c.dispatch_id)
            out.append((c, None))
    return out


class Dispatcher:
    """One per replica. `start()` launches the delivery loop and the reaper; `stop()` ends both,
    letting deliveries already on the wire finish (bounded by `stop_grace`).

    `agent_concurrency` and `host_concurrency` (unset: half of `concurrency`, at least 1) bound
    the deliveries in flight per agent and per webhook host; `breaker_failures` failed deliveries
    in a row pause an agent for `breaker_reset` seconds, doubling up to the kernel's
    `dispatch_max_delay` (kernel/delivery_gate.py)."""

    def __init__(
        self,
        kernel: Kernel,
        *,
        concurrency: int = 8,
        timeout: float = 30.0,
        poll_interval: float = 0.25,
        reap_every: float | None = None,
        stop_grace: float = 10.0,
        http: httpx.AsyncClient | None = None,
        run_blocking: Callable[..., Awaitable[Any]] | None = None,
        agent_concurrency: int | None = None,
        host_concurrency: int | None = None,
        breaker_failures: int = 5,
        breaker_reset: float = 5.0,
    ):
        if concurrency < 1:
            raise ValueError("dispatch concurrency must be at least 1")
        share = max(1, concurrency // 2)
        self.gate = DeliveryGate(agent_limit=min(agent_concurrency or share, concurrency),
                                 host_limit=min(host_concurrency or share, concurrency),
                                 breaker_failures=breaker_failures, breaker_reset=breaker_reset,
                                 breaker_max=kernel.dispatch_max_delay)
        self.kernel = kernel
        self.concurrency = concurrency
        self.timeout = timeout
        self.poll_interval = max(poll_interval, 0.001)
        self.reap_every = reap_every if reap_every is not None else reap_interval(kernel.dispatch_lease_timeout)
        self.stop_grace = stop_grace
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(
            follow_redirects=False,  # a 3xx is not an ack
            limits=httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency),
        )
        self._run_on = run_blocking
        self._active: set[asyncio.Task[None]] = set()
        # Verdicts of deliveries that left the wire, waiting to be recorded (in batches).
        self._verdicts: list[Verdict] = []
        self._recording: set[asyncio.Task[None]] = set()
        self._recorders = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.delivered = 0  # deliveries attempted by this replica (acked or failed)
        self.outcomes: Counter[str] = Counter()  # by outcome (OUTCOMES), for /metrics
        self._searched_empty = float("-inf")  # when reading past full agents last found nothing

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self._run_blocking(reap_expired_leases, self.kernel)  # once at start-up (§6.4)
        self._tasks = [
            asyncio.create_task(self._deliver_loop(), name="regent-dispatch"),
            asyncio.create_task(self._every(self.reap_every, self.reap_once), name="regent-reaper"),
        ]

    async def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        # The loops see the flag at their next turn; a claim already running on its thread is
        # allowed to finish so that what it claimed is delivered rather than left in flight.
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=self.stop_grace)
            for t in late:
                t.cancel()
        if self._active:
            # Deliveries on the wire get to finish and record their verdict; a delivery cut
            # short leaves its row in flight, and the reaper of any replica returns it later.
            _, pending = await asyncio.wait(set(self._active), timeout=self.stop_grace)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        await self._flush_verdicts()
        if self._own_http:
            await self._http.aclose()

    # -- one step each (also what tests drive) ---------------------------------------------
    async def claim_and_deliver(self) -> int:
        """Claim up to the idle worker count and start delivering; returns how many started."""
        idle = self.concurrency - len(self._active)
        if idle <= 0:
            return 0
        shares = self.gate.shares()
        full = any(room <= 0 for room in shares.room.values())
        # Reading past the agents whose share is taken costs a lookup per due row: after one such
        # read found nothing, the next waits for the poll interval (a wake after each delivery
        # would repeat it hundreds of times a second behind a long queue).
        search = full and time.monotonic() - self._searched_empty >= self.poll_interval
        ids = await self._run_blocking(due_ids, self.kernel, idle, shares, search)
        if not ids:
            if search:
                self._searched_empty = time.monotonic()
            return 0
        # Disjoint chunks, claimed in parallel where the lane has threads for it (PostgreSQL), one
        # after the other on SQLite's one; each chunk's rows go on the wire as soon as it is claimed.
        pending = {asyncio.ensure_future(self._run_blocking(_claim_with_agents, self.kernel, ids[i:i + CLAIM_CHUNK]))
                   for i in range(0, len(ids), CLAIM_CHUNK)}
        started = 0
        failed: BaseException | None = None
        while pending:
            # Every call's claims are delivered, whichever fails: a claimed row must not be left in flight.
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for call in done:
                exc = call.exception()
                if exc is not None:
                    failed = failed or exc
                    continue
                for claim, agent in call.result():
                    if not (claim.discarded or claim.exhausted):
                        # Counted now, not when the task first runs: the next claim, before any
                        # await, must see this agent's share as taken.
                        self.gate.started(claim.agent_id, host_key(agent.webhook_url) if agent else "")
                    task = asyncio.create_task(self._deliver(claim, agent))
                    self._active.add(task)
                    task.add_done_callback(self._done)
                    started += 1
        if failed is not None:
            if not started:
                raise failed
            log.error("a claim call failed; the other calls' claims are being delivered", exc_info=failed)
        return started

    async def reap_once(self) -> int:
        n: int = await self._run_blocking(reap_expired_leases, self.kernel)
        if n:
            log.info("returned %d expired lease(s) to the queue", n)
            self._wake.set()
        return n

    async def drain(self) -> None:
        """Wait for every delivery already started and its verdict recorded (tests)."""
        if self._active:
            await asyncio.wait(set(self._active))
        await self._flush_verdicts()

    # -- internals -------------------------------------------------------------------------
    def _done(self, task: asyncio.Task[None]) -> None:
        self._active.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery task failed", exc_info=task.exception())

    async def _deliver_loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self._wake.clear()
            wait = self.poll_interval
            try:
                started = await self.claim_and_deliver()
                failures = 0
            except Exception:
                # The store is unreachable or failing: back off (up to 5 s) instead of spinning.
                failures = min(failures + 1, 16)
                wait = min(self.poll_interval * 2**failures, 5.0)
                log.exception("claiming dispatches failed; retrying in %.2fs", wait)
                started = 0
            if started and len(self._active) < self.concurrency:
                continue  # more may be due right now: claim again before sleeping
            with contextlib.suppress(TimeoutError):
                # Sleep until the poll interval passes, a worker frees up, or a reap happens.
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _every(self, interval: float, fn: Callable[[], Awaitable[Any]]) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=interval)
            if self._stopping.is_set():
                return
            try:
                await fn()
            except Exception:
                log.exception("%s failed; it runs again next interval", getattr(fn, "__name__", fn))

    async def _deliver(self, claim: Claim, agent: Agent | None) -> None:
        if claim.discarded or claim.exhausted:
            return  # the claim itself recorded what happened; nothing goes on the wire
        self.delivered += 1
        host = host_key(agent.webhook_url) if agent is not None else ""
        ok, detail = False, None
        try:
            if agent is None:
                detail, outcome = f"agent {claim.agent_id!r} not found", "agent_missing"
            else:
                ok, detail = await self._post(claim, agent, host)
                outcome = outcome_of(ok, detail)
        except Exception as exc:
            # Whatever failed on the way out (a URL the client refuses, a header it cannot send, a
            # fault of ours) is a failed delivery like a timeout: recorded and retried after
            # back-off. Unrecorded, the row stayed in flight for the agent's whole lease (up to a day).
            detail, outcome = failure_detail(exc), "error"
            log.error("delivery of %s attempt %d to %s raised", claim.execution_id, claim.attempt,
                      claim.agent_id, exc_info=exc)
        except BaseException:
            self.gate.finished(claim.agent_id, None)  # cut short (stop): the reaper re-queues the row
            raise
        paused = self.gate.finished(claim.agent_id, ok)
        self.outcomes[outcome] += 1
        if not ok:
            log.warning("delivery of %s attempt %d to %s failed: %s", claim.execution_id, claim.attempt,
                        claim.agent_id, detail)
        if paused is not None:
            log.warning("agent %s: %d failed deliveries in a row; none is sent to it for %gs, then one probe "
                        "(its executions stay queued)", claim.agent_id, self.gate.breakers[claim.agent_id].failures,
                        paused)
        self._verdicts.append(Verdict(claim, ok, detail, paused))
        if self._recorders < MAX_RECORDERS:
            self._recorders += 1
            task = asyncio.create_task(self._record_verdicts())
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)

    async def _record_verdicts(self) -> None:
        """Record pending verdicts, up to RECORD_CHUNK per call (each its own transaction), until
        none are left. The count of running recorders drops in the same step that finds the list
        empty, so a verdict appended afterwards always starts a recorder of its own."""
        try:
            while self._verdicts:
                batch, self._verdicts = self._verdicts[:RECORD_CHUNK], self._verdicts[RECORD_CHUNK:]
                try:
                    await self._run_blocking(_record_all, self.kernel, batch)
                except Exception:
                    # The rows stay in flight; their leases run out and the reaper re-queues them.
                    log.exception("recording %d delivery verdicts failed", len(batch))
        finally:
            self._recorders -= 1

    async def _flush_verdicts(self) -> None:
        while self._recording or self._verdicts:
            if self._recording:
                await asyncio.wait(set(self._recording))
            elif self._verdicts:
                self._recorders += 1
                await self._record_verdicts()

    async def _post(self, claim: Claim, agent: Agent, host: str) -> tuple[bool, str | None]:
        """One delivery, bounded as a whole by `timeout` (httpx's own timeouts are per read: a
        webhook trickling its headers, or a body that never ends, would hold a worker forever),
        the wait for a slot of the agent's host included. The answer's status is the verdict; its
        body is read up to MAX_ANSWER_BYTES, no more."""
        body = webhook_body(claim)
        headers = webhook_headers(claim, agent.secret, body, self.kernel.replica_id)
        status: int | None = None
        slot = False
        try:
            async with asyncio.timeout(self.timeout):
                await self.gate.host_slot(host)
                slot = True
                async with self._http.stream("POST", agent.webhook_url, content=body, headers=headers,
                                             timeout=self.timeout) as resp:
                    status = resp.status_code
                    read = 0
                    async for chunk in resp.aiter_raw():
                        read += len(chunk)
                        if read > MAX_ANSWER_BYTES:
                            break  # leaving the block closes this connection rather than reading on
        except (TimeoutError, httpx.TimeoutException):
            if status is None:
                return False, f"timeout after {self.timeout:g}s" + ("" if slot else " waiting for a slot of its host")
        except httpx.HTTPError as exc:
            if status is None:
                return False, failure_detail(exc)
        finally:
            if slot:
                self.gate.release_host(host)
        if 200 <= status < 300:
            return True, None
        return False, f"HTTP {status}"

    async def _run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._run_on is not None:
            return await self._run_on(fn, *args)
        return await anyio.to_thread.run_sync(fn, *args)


class Verdict(NamedTuple):
    claim: Claim
    ok: bool
    detail: str | None
    paused: float | None  # this failure opened the agent's breaker for so many seconds


def _record_all(k: Kernel, batch: list[Verdict]) -> None:
    for claim, ok, detail, paused in batch:
        try:
            record_delivery(k, claim, ok, detail, breaker_open_seconds=paused)
        except Exception:
            # This row stays in flight; its lease runs out and the reaper re-queues it.
            log.exception("recording the delivery verdict for %s failed", claim.execution_id)


class DispatcherThread:
    """A Dispatcher on an event loop and thread of its own, as the serving process runs it.

    On the API's event loop, every await of a delivery (each step of the webhook POST, each
    claim's answer) waited for a full turn of a loop kept busy by the requests: under 50 creating
    clients a loopback POST took 200–500 ms and a 2 ms claim 300 ms to come back, so webhooks went
    out at 8/s against 280 creates/s. On its own loop it waits only for the GIL.
    """

    def __init__(self, make: Callable[[], Dispatcher]):
        self._make = make
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.dispatcher: Dispatcher | None = None

    async def start(self) -> None:
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self.dispatcher = self._make()
                loop.run_until_complete(self.dispatcher.start())
            except BaseException as exc:
                ready.set_exception(exc)
                loop.close()
                return
            ready.set_result(None)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name="regent-dispatch", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(ready)

    async def stop(self) -> None:
        loop, d, thread = self._loop, self.dispatcher, self._thread
        if loop is None or d is None or thread is None or loop.is_closed():
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(d.stop(), loop))
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 10.0)

    @property
    def delivered(self) -> int:
        return self.dispatcher.delivered if self.dispatcher is not None else 0

    def stats(self) -> dict[str, Any] | None:
        """The delivery gate's figures and the outcome counts, for /metrics (any thread)."""
        d = self.dispatcher
        if d is None:
            return None
        return {**d.gate.stats(), "outcomes": dict(d.outcomes)}
