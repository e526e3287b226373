"""/metrics shows each replica's deliveries: outcomes, what is in flight per agent, and the
agents whose breaker is open (kernel/api/metrics.py DispatchCollector over a running dispatcher)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kernel.api.metrics import DispatchCollector
from kernel.core import executions
from kernel.core.agents import register_agent
from kernel.core.kernel import Kernel
from kernel.dispatcher import Dispatcher, DispatcherThread
from kernel.store import SqlStore
from reliability.blackhole import Webhook
from tests.support import free_port


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_show_outcomes_in_flight_agents_and_open_breakers(store: SqlStore) -> None:
    k = Kernel(store=store)
    register_agent(k, "down", f"http://127.0.0.1:{free_port()}/w", "s", None, keep_policy=True)
    with Webhook(answer=False) as hole:
        register_agent(k, "hole", hole.url, "s", None, keep_policy=True)
        for i in range(3):
            executions.create_execution(k, "down", {"i": i})
            executions.create_execution(k, "hole", {"i": i})
        thread = DispatcherThread(lambda: Dispatcher(k, concurrency=8, timeout=30, poll_interval=0.05,
                                                     breaker_failures=3, breaker_reset=60))
        registry = CollectorRegistry()
        registry.register(DispatchCollector(thread.stats))

        async def main() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            await thread.start()
            try:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    got = samples(registry)
                    if got.get(("regent_dispatch_breakers_open", ())) == 1 and \
                            got.get(("regent_dispatch_agent_in_flight", (("agent_id", "hole"),))) == 3:
                        return got
                    await asyncio.sleep(0.05)
                return samples(registry)
            finally:
                hole.recover()  # the held deliveries answer, so the stop need not wait them out
                await thread.stop()

        got = asyncio.run(main())
    assert got[("regent_dispatch_deliveries_total", (("outcome", "connection"),))] == 3, got
    assert got[("regent_dispatch_breaker_open", (("agent_id", "down"),))] == 1
    assert got[("regent_dispatch_breaker_opened_total", ())] == 1
    assert got[("regent_dispatch_agent_in_flight", (("agent_id", "hole"),))] == 3
    assert got[("regent_dispatch_in_flight", ())] == 3
