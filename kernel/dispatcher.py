"""Outbound webhooks (rebuno-v0 §6.2–6.4): claim due dispatches, POST each one signed to its agent,
record the verdict; a lease reaper returns expired in-flight rows to the queue.

The core use cases are blocking (they run transactions), so every one runs on a worker thread;
the loop itself only waits on HTTP and timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
import httpx

from kernel.core.dispatch import Claim, claim_due, reap_expired_leases, record_delivery
from kernel.core.kernel import Kernel
from kernel.domain import Agent
from kernel.signing import webhook_signature

log = logging.getLogger("kernel.dispatcher")

USER_AGENT = "regent/0.1.0"
MAX_REAP_INTERVAL = 2.0


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


def _claim_with_agents(k: Kernel, limit: int) -> list[tuple[Claim, Agent | None]]:
    claims = claim_due(k, limit)
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
    letting deliveries already on the wire finish (bounded by `stop_grace`)."""

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
    ):
        if concurrency < 1:
            raise ValueError("dispatch concurrency must be at least 1")
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
        self._active: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.delivered = 0  # deliveries attempted by this replica (acked or failed)

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
        if self._own_http:
            await self._http.aclose()

    # -- one step each (also what tests drive) ---------------------------------------------
    async def claim_and_deliver(self) -> int:
        """Claim up to the idle worker count and start delivering; returns how many started."""
        idle = self.concurrency - len(self._active)
        if idle <= 0:
            return 0
        batch = await self._run_blocking(_claim_with_agents, self.kernel, idle)
        for claim, agent in batch:
            task = asyncio.create_task(self._deliver(claim, agent))
            self._active.add(task)
            task.add_done_callback(self._done)
        return len(batch)

    async def reap_once(self) -> int:
        n: int = await self._run_blocking(reap_expired_leases, self.kernel)
        if n:
            log.info("returned %d expired lease(s) to the queue", n)
            self._wake.set()
        return n

    async def drain(self) -> None:
        """Wait for every delivery already started (tests)."""
        if self._active:
            await asyncio.wait(set(self._active))

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
        detail: str | None
        if agent is None:
            ok, detail = False, f"agent {claim.agent_id!r} not found"
        else:
            ok, detail = await self._post(claim, agent)
        if not ok:
            log.warning("delivery of %s attempt %d to %s failed: %s", claim.execution_id, claim.attempt,
                        claim.agent_id, detail)
        try:
            await self._run_blocking(record_delivery, self.kernel, claim, ok, detail)
        except Exception:
            # The row stays in flight; its lease runs out and the reaper re-queues it.
            log.exception("recording the delivery verdict for %s failed", claim.execution_id)

    async def _post(self, claim: Claim, agent: Agent) -> tuple[bool, str | None]:
        body = webhook_body(claim)
        headers = webhook_headers(claim, agent.secret, body, self.kernel.replica_id)
        try:
            resp = await self._http.post(agent.webhook_url, content=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException:
            return False, f"timeout after {self.timeout:g}s"
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if 200 <= resp.status_code < 300:
            return True, None
        return False, f"HTTP {resp.status_code}"

    @staticmethod
    async def _run_blocking(fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)
