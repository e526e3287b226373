"""Each agent's and each host's share of a replica's delivery slots, and each agent's circuit
breaker: what the dispatcher may claim, and when a host is full, who waits.

A webhook that accepts TCP and never answers held every slot for a whole delivery timeout: with
200 executions queued for such an agent, another agent's deliveries came 23 s late
(tests/core/test_dispatch_fairness.py). Now an agent has at most `agent_limit` deliveries in
flight, a host (scheme, host, port) at most `host_limit`, and after `breaker_failures` failed
deliveries in a row an agent is not delivered to for `breaker_reset` seconds (doubling up to
`breaker_max`), then one probe delivery decides: a 2xx closes the breaker, a failure opens it
again. Its executions stay queued meanwhile, their attempts unspent.

One event loop (the dispatcher's) changes it; `stats()` may be read from any thread.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kernel.core.dispatch import Shares

# Agents whose host and breaker are remembered while they have nothing in flight; past it the
# idle entries are forgotten (a forgotten host is learnt again at its next delivery).
MAX_REMEMBERED = 10_000


def host_key(url: str) -> str:
    """scheme://host:port of a webhook URL (the port made explicit), the unit of the host bound."""
    try:
        u = urlsplit(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        return f"{u.scheme}://{(u.hostname or '').lower()}:{port}"
    except ValueError:
        return url[:200]


@dataclass
class Breaker:
    failures: int = 0  # failed deliveries in a row
    open_until: float | None = None  # monotonic seconds; None: closed
    period: float = 0.0  # the last open period (each failed probe doubles it)


class DeliveryGate:
    def __init__(self, *, agent_limit: int, host_limit: int, breaker_failures: int = 5,
                 breaker_reset: float = 5.0, breaker_max: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic):
        if agent_limit < 1 or host_limit < 1:
            raise ValueError("the agent and host delivery limits must be at least 1")
        self.agent_limit = agent_limit
        self.host_limit = host_limit
        self.breaker_failures = max(1, breaker_failures)
        self.breaker_reset = breaker_reset
        self.breaker_max = max(breaker_max, breaker_reset)
        self.monotonic = monotonic
        self.agents: dict[str, int] = {}  # agent id → deliveries in flight
        self.hosts: dict[str, int] = {}  # host → deliveries holding a slot of it
        self.host_of: dict[str, str] = {}  # agent id → its webhook's host, as last delivered
        self.breakers: dict[str, Breaker] = {}
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self.breaker_opened = 0  # times any breaker opened (a failed probe counts again)
        self.host_waits = 0  # deliveries that waited for a slot of their host

    # -- what may be claimed -------------------------------------------------------------------
    def shares(self) -> Shares:
        """Room per agent for the next claim: the agent's bound less what it has in flight, its
        host's room when the host is known to be full, 0 while its breaker is open, one probe
        when the open period has passed."""
        room: dict[str, int] = {agent: self.agent_limit - n for agent, n in self.agents.items()}
        full = {h for h, n in self.hosts.items() if n >= self.host_limit}
        if full:
            for agent, host in self.host_of.items():
                if host in full:
                    room[agent] = 0
        now = self.monotonic()
        for agent, b in self.breakers.items():
            if b.open_until is not None:
                probe = 0 if now < b.open_until else 1 - self.agents.get(agent, 0)
                room[agent] = min(room.get(agent, self.agent_limit), probe)
        return Shares(default=min(self.agent_limit, self.host_limit), room=room)

    def is_open(self, agent_id: str) -> bool:
        b = self.breakers.get(agent_id)
        return b is not None and b.open_until is not None

    # -- a delivery's life ---------------------------------------------------------------------
    def started(self, agent_id: str, host: str) -> None:
        self.agents[agent_id] = self.agents.get(agent_id, 0) + 1
        self.host_of[agent_id] = host
        if len(self.host_of) > MAX_REMEMBERED:
            self._forget_idle()

    async def host_slot(self, host: str) -> None:
        """Take a slot of `host`, waiting (first come, first served) while it is full."""
        if self.hosts.get(host, 0) < self.host_limit:
            self.hosts[host] = self.hosts.get(host, 0) + 1
            return
        self.host_waits += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(host, deque()).append(fut)
        try:
            await fut  # the slot is handed over by `release_host`, count unchanged
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release_host(host)  # handed over as we were cancelled: pass it on
            else:
                fut.cancel()
            raise

    def release_host(self, host: str) -> None:
        waiters = self._waiters.get(host)
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._waiters.pop(host, None)
        n = self.hosts.get(host, 0) - 1
        if n > 0:
            self.hosts[host] = n
        else:
            self.hosts.pop(host, None)

    def finished(self, agent_id: str, ok: bool | None) -> float | None:
        """A delivery of `agent_id` ended: acked (True), failed (False) or cut short (None, no
        verdict). Returns the open period in seconds when this failure opened the agent's
        breaker, else None."""
        n = self.agents.get(agent_id, 0) - 1
        if n > 0:
            self.agents[agent_id] = n
        else:
            self.agents.pop(agent_id, None)
        if ok is None:
            return None
        if ok:
            self.breakers.pop(agent_id, None)
            return None
        b = self.breakers.setdefault(agent_id, Breaker())
        b.failures += 1
        now = self.monotonic()
        if b.open_until is not None:
            if now < b.open_until:
                return None  # a delivery started before it opened: it is open already
            b.period = min(b.period * 2, self.breaker_max)  # the probe failed
        elif b.failures >= self.breaker_failures:
            b.period = self.breaker_reset
        else:
            return None
        b.open_until = now + b.period
        self.breaker_opened += 1
        return b.period

    def _forget_idle(self) -> None:
        for agent in [a for a in self.host_of if a not in self.agents and a not in self.breakers]:
            del self.host_of[agent]

    # -- for /metrics ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A snapshot (copies, so another thread may read it while the loop changes the gate)."""
        agents = dict(self.agents)
        hosts = dict(self.hosts)
        breakers = dict(self.breakers)
        return {
            "in_flight": sum(agents.values()),
            "agents": agents,
            "agents_full": sum(1 for n in agents.values() if n >= self.agent_limit),
            "hosts_full": sum(1 for n in hosts.values() if n >= self.host_limit),
            "breakers_open": sorted(a for a, b in breakers.items() if b.open_until is not None),
            "breaker_opened": self.breaker_opened,
            "host_waits": self.host_waits,
        }
