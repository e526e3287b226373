"""Each agent's share of delivery slots, its circuit breaker, and what happens to a delivery
that fails for any reason: the claim reads past a full agent's queue, a failure of any cause
(a URL the client refuses, an exception inside the delivery) is a recorded `dispatch.failed`
with back-off, and an agent whose deliveries keep failing is paused, its executions waiting."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest

from kernel.core import executions
from kernel.core.agents import register_agent
from kernel.core.dispatch import Shares, due_ids
from kernel.core.kernel import Kernel
from kernel.delivery_gate import DeliveryGate, host_key
from kernel.dispatcher import Dispatcher
from kernel.domain import Agent, DispatchStatus

SECRET = "gate-secret"


def events(k: Kernel, eid: str, typ: str) -> list[dict[str, Any]]:
    with k.store.read() as tx:
        return [e.payload for e in tx.list_events(eid, 0, 1000) if e.type == typ]


def deliver_once(k: Kernel, **options: Any) -> Dispatcher:
    async def main() -> Dispatcher:
        d = Dispatcher(k, poll_interval=0.01, **options)
        try:
            await d.claim_and_deliver()
            await d.drain()
        finally:
            await d.stop()
        return d

    return asyncio.run(main())


# -- claiming --------------------------------------------------------------------------------
def test_the_claim_reads_past_an_agent_whose_share_is_taken(kernel: Kernel) -> None:
    register_agent(kernel, "bh", "http://127.0.0.1:9/w", SECRET, None, keep_policy=True)
    register_agent(kernel, "ok", "http://127.0.0.1:9/v", SECRET, None, keep_policy=True)
    for i in range(200):
        executions.create_execution(kernel, "bh", {"i": i})
    kernel.clock.advance(1)  # type: ignore[attr-defined]
    healthy = executions.create_execution(kernel, "ok", {})[0].id
    ids = due_ids(kernel, 16, Shares(default=16, room={"bh": 0}))
    with kernel.store.read() as tx:
        assert [tx.get_dispatch(i).execution_id for i in ids] == [healthy]  # type: ignore[union-attr]


def test_without_search_the_claim_reads_only_the_oldest_rows(kernel: Kernel) -> None:
    # What the dispatcher asks between two reads past a full agent (at most one per poll).
    register_agent(kernel, "bh", "http://127.0.0.1:9/w", SECRET, None, keep_policy=True)
    register_agent(kernel, "ok", "http://127.0.0.1:9/v", SECRET, None, keep_policy=True)
    for i in range(20):
        executions.create_execution(kernel, "bh", {"i": i})
    kernel.clock.advance(1)  # type: ignore[attr-defined]
    executions.create_execution(kernel, "ok", {})
    assert due_ids(kernel, 16, Shares(default=16, room={"bh": 0}), search=False) == []
    assert len(due_ids(kernel, 16, Shares(default=16, room={"bh": 0}), search=True)) == 1


def test_one_claim_takes_at_most_each_agents_share_and_fills_up_with_the_others(kernel: Kernel) -> None:
    for agent in ("a", "b"):
        register_agent(kernel, agent, f"http://127.0.0.1:9/{agent}", SECRET, None, keep_policy=True)
    for i in range(30):
        executions.create_execution(kernel, "a", {"i": i})
    kernel.clock.advance(1)  # type: ignore[attr-defined]
    for i in range(30):
        executions.create_execution(kernel, "b", {"i": i})
    ids = due_ids(kernel, 16, Shares(default=5, room={"b": 3}))
    with kernel.store.read() as tx:
        agents = [tx.get_execution(tx.get_dispatch(i).execution_id).agent_id for i in ids]  # type: ignore[union-attr]
    assert sorted(agents) == ["a"] * 5 + ["b"] * 3


# -- failures of any cause -----------------------------------------------------------------------
def test_a_stored_url_the_client_refuses_is_a_recorded_failure_with_backoff(kernel: Kernel) -> None:
    # An agent registered before URLs were bounded: every delivery raised InvalidURL inside the
    # delivery task, no dispatch.failed was written, and the row waited out its whole lease.
    now = kernel.clock.now()
    with kernel.store.transaction() as tx:
        tx.upsert_agent(Agent(id="long", webhook_url="http://127.0.0.1:9/w?" + "a" * 70_000, secret=SECRET,
                              registered_at=now))
    eid = executions.create_execution(kernel, "long", {})[0].id
    d = deliver_once(kernel)
    [failed] = events(kernel, eid, "dispatch.failed")
    assert failed["error"].startswith("InvalidURL"), failed
    assert len(failed["error"]) <= 300
    with kernel.store.read() as tx:
        row = tx.get_dispatch(failed["dispatch_id"])
    assert row is not None and row.status == DispatchStatus.FAILED and row.locked_by is None
    assert now + timedelta(seconds=1) <= row.next_attempt_at < now + timedelta(seconds=1.25)
    assert d.outcomes["error"] == 1


class Boom(httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise RuntimeError("a fault inside the delivery")


def test_any_exception_inside_a_delivery_is_a_recorded_failure(kernel: Kernel) -> None:
    register_agent(kernel, "a", "http://127.0.0.1:9/w", SECRET, None, keep_policy=True)
    eid = executions.create_execution(kernel, "a", {})[0].id
    http = httpx.AsyncClient(transport=Boom())
    deliver_once(kernel, http=http)
    assert [p["error"] for p in events(kernel, eid, "dispatch.failed")] == ["RuntimeError: a fault inside the delivery"]


def test_the_failure_that_opens_a_breaker_says_so_and_the_agent_is_sent_nothing_meanwhile(kernel: Kernel) -> None:
    register_agent(kernel, "a", "http://127.0.0.1:9/w", SECRET, None, keep_policy=True)
    ids = [executions.create_execution(kernel, "a", {"i": i})[0].id for i in range(4)]

    async def main() -> tuple[int, int]:
        d = Dispatcher(kernel, http=httpx.AsyncClient(transport=Boom()), breaker_failures=2, breaker_reset=30)
        try:
            first = await d.claim_and_deliver()
            await d.drain()
            kernel.clock.advance(120)  # type: ignore[attr-defined]  # every row due again; the breaker is on real time
            second = await d.claim_and_deliver()
            await d.drain()
        finally:
            await d.stop()
        return first, second

    assert asyncio.run(main()) == (4, 0)
    failed = [p for eid in ids for p in events(kernel, eid, "dispatch.failed")]
    assert len(failed) == 4
    assert [p.get("breaker_open_seconds") for p in failed].count(30) == 1


# -- the gate itself (a manual monotonic clock) ------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_breaker_opens_after_failures_in_a_row_then_lets_one_probe_through() -> None:
    clock = Clock()
    g = DeliveryGate(agent_limit=4, host_limit=8, breaker_failures=3, breaker_reset=5, breaker_max=12, monotonic=clock)
    for _ in range(3):
        g.started("a", "h")
    assert g.shares().of("a") == 1
    assert [g.finished("a", False) for _ in range(3)] == [None, None, 5]
    assert g.shares().of("a") == 0 and g.is_open("a")
    clock.t += 5
    assert g.shares().of("a") == 1  # one probe
    g.started("a", "h")
    assert g.shares().of("a") == 0
    assert g.finished("a", False) == 10  # the probe failed: open twice as long
    clock.t += 10
    g.started("a", "h")
    assert g.finished("a", False) == 12  # capped
    clock.t += 12
    g.started("a", "h")
    assert g.finished("a", True) is None
    assert not g.is_open("a") and g.shares().of("a") == 4
    assert g.stats()["breaker_opened"] == 3


def test_a_success_between_failures_keeps_the_breaker_closed() -> None:
    g = DeliveryGate(agent_limit=4, host_limit=8, breaker_failures=2, monotonic=Clock())
    for ok in (False, True, False, True, False):
        g.started("a", "h")
        assert g.finished("a", ok) is None
    assert not g.is_open("a")


def test_a_full_host_takes_the_room_of_every_agent_on_it() -> None:
    g = DeliveryGate(agent_limit=4, host_limit=2, monotonic=Clock())
    g.started("a", "h")
    g.started("b", "h")
    g.started("c", "other")

    async def take() -> None:
        await g.host_slot("h")
        await g.host_slot("h")

    asyncio.run(take())
    shares = g.shares()
    assert (shares.of("a"), shares.of("b"), shares.of("c"), shares.of("new")) == (0, 0, 3, 2)


def test_a_delivery_waits_for_a_slot_of_its_host_first_come_first_served() -> None:
    g = DeliveryGate(agent_limit=4, host_limit=1, monotonic=Clock())
    order: list[int] = []

    async def main() -> None:
        await g.host_slot("h")

        async def wait(i: int) -> None:
            await g.host_slot("h")
            order.append(i)
            g.release_host("h")

        tasks = [asyncio.create_task(wait(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert order == [] and g.stats()["host_waits"] == 3
        g.release_host("h")
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == [0, 1, 2] and g.hosts == {}


@pytest.mark.parametrize(("url", "key"), [("http://A.example/w", "http://a.example:80"),
                                          ("https://a.example:8443/x?y", "https://a.example:8443"),
                                          ("http://[::1]/w", "http://::1:80")])
def test_the_host_bound_is_per_scheme_host_and_port(url: str, key: str) -> None:
    assert host_key(url) == key
