"""Two kernel replicas on one real PostgreSQL, each served over HTTP with its LISTEN/NOTIFY broker:
a subscriber on replica B receives, in seq order, the deltas an agent publishes on replica A, and a
subscriber on B that never reads does not slow A's producer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from kernel.store import open_store
from kernel.stream.postgres import PostgresBroker, postgres_stream_hook
from tests.conftest import Running, _truncate
from tests.support import AgentClient, ServerThread

pytestmark = pytest.mark.postgres


@pytest.fixture
def replicas(pg_database: str) -> Iterator[tuple[Kernel, ServerThread, ServerThread]]:
    stores = [open_store(pg_database) for _ in range(2)]
    _truncate(stores[0])
    kernels = [Kernel(store=s, replica_id=f"r{i}") for i, s in enumerate(stores)]
    apps = [create_app(k, dev=True, lifespan_hooks=[postgres_stream_hook(pg_database)]) for k in kernels]
    for app in apps:
        app.state.stream_keepalive_seconds = 0.5
    with ServerThread(apps[0]) as a, ServerThread(apps[1]) as b:
        assert isinstance(apps[1].state.stream_broker, PostgresBroker)
        yield kernels[0], a, b
    for s in stores:
        s.close()


def _subscribe(url: str, eid: str, want: int, seen: list[dict[str, Any]], ready: threading.Event) -> None:
    with httpx.stream("GET", f"{url}/v0/executions/{eid}/stream", timeout=15) as r:
        for line in r.iter_lines():
            if line == ": ok":
                ready.set()
            elif line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if len(seen) >= want:
                    return


def test_a_subscriber_on_b_receives_deltas_published_on_a_in_seq_order(
    replicas: tuple[Kernel, ServerThread, ServerThread],
) -> None:
    k, a, b = replicas
    running = Running(k)
    eid, did, att = running.start()
    agent = AgentClient(a.url, running.agent_id, running.secret).lease(did, att)
    sid = agent.submit(eid, "llm", {"q": 1}, kind="llm_call").json()["step_id"]

    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    t = threading.Thread(target=_subscribe, args=(b.url, eid, 20, seen, ready), daemon=True)
    t.start()
    assert ready.wait(10), "the subscriber on B never got its ': ok'"
    for seq in range(20):
        r = agent.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": seq, "data": f"tok{seq} "})
        assert r.status_code == 204, r.text
    t.join(15)
    assert [m["seq"] for m in seen] == list(range(20))
    assert all(m["step_id"] == sid and m["data"] == f"tok{m['seq']} " for m in seen)


def test_data_with_a_lone_surrogate_and_nul_crosses_replicas_unchanged(
    replicas: tuple[Kernel, ServerThread, ServerThread],
) -> None:
    k, a, b = replicas
    running = Running(k)
    eid, did, att = running.start()
    agent = AgentClient(a.url, running.agent_id, running.secret).lease(did, att)
    sid = agent.submit(eid, "llm", {"q": 1}, kind="llm_call").json()["step_id"]
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    t = threading.Thread(target=_subscribe, args=(b.url, eid, 1, seen, ready), daemon=True)
    t.start()
    assert ready.wait(10), "the subscriber on B never got its ': ok'"
    data = "caf\udce9 \ud800 \x00"
    r = agent.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": 0, "data": data})
    assert r.status_code == 204, r.text
    t.join(15)
    assert [m["data"] for m in seen] == [data]


def test_a_stalled_subscriber_on_b_does_not_slow_the_producer_on_a(
    replicas: tuple[Kernel, ServerThread, ServerThread],
) -> None:
    k, a, b = replicas
    running = Running(k)
    eid, did, att = running.start()
    agent = AgentClient(a.url, running.agent_id, running.secret).lease(did, att)
    sid = agent.submit(eid, "llm", {"q": 2}, kind="llm_call").json()["step_id"]

    def publish(n: int, base: int) -> float:
        t0 = time.perf_counter()
        for seq in range(base, base + n):
            r = agent.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream",
                              {"seq": seq, "data": "x" * 1750})
            assert r.status_code == 204
        return (time.perf_counter() - t0) / n

    publish(20, 0)  # warm up
    alone = publish(100, 20)
    # A subscriber on B that reads its ': ok' and then nothing: its 64-delta buffer fills and drops.
    with httpx.stream("GET", f"{b.url}/v0/executions/{eid}/stream", timeout=15) as stalled:
        next(stalled.iter_lines())
        with_stalled = publish(200, 120)
    assert with_stalled < alone * 3 + 0.005, (alone, with_stalled)
