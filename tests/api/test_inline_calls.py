"""Step calls on the event loop when the kernel is idle (kernel/lane.py `call_hot`), over
real HTTP against a real SQLite file, with the server wired as `regent serve` wires it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel import lane as threads
from kernel.api.app import create_app
from kernel.cli.server import install_inline
from kernel.core.kernel import Kernel
from kernel.domain import StepStatus
from kernel.store import SqlStore
from kernel.store.sqlite import SqliteStore
from tests.conftest import Running
from tests.support import AgentClient, ServerThread


@pytest.fixture
def served(sqlite_store: SqlStore) -> Iterator[tuple[ServerThread, Kernel, threads.InlineGate]]:
    """A kernel on SQLite with its lane grouping commits and the inline gate installed."""
    assert isinstance(sqlite_store, SqliteStore)
    kernel = Kernel(store=sqlite_store)
    threads.configure(1, sqlite_store.commit_groups())
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    srv = ServerThread(app)
    install_inline(srv.server)
    gate = threads.inline_gate()
    assert gate is not None
    try:
        with srv:
            yield srv, kernel, gate
    finally:
        threads.install_inline(None)
        threads.configure(1, None)


def _round_trips(client: AgentClient, eid: str, n: int, tag: str) -> list[str]:
    ids = []
    for i in range(n):
        r = client.submit(eid, "shell.run", {"cmd": f"{tag}-{i}"})
        assert r.status_code == 200 and r.json()["decision"] == "proceed", r.text
        sid = r.json()["step_id"]
        done = client.complete_step(eid, sid, {"out": i})
        assert done.status_code == 200 and done.json()["decision"] == "recorded", done.text
        ids.append(sid)
    return ids


def test_a_sequential_agent_s_step_calls_run_on_the_event_loop_and_are_recorded(
        served: tuple[ServerThread, Kernel, threads.InlineGate]) -> None:
    srv, kernel, gate = served
    gate.slow_after = 60.0  # a busy CI disk's fsync may take tens of ms: the guard has its own test
    running = Running(kernel)
    eid, did, att = running.start()
    with AgentClient(srv.url, running.agent_id, running.secret) as client:
        client.lease(did, att)
        ids = _round_trips(client, eid, 10, "seq")
        # The same step again is a replay, answered the same way on the loop.
        again = client.submit(eid, "shell.run", {"cmd": "seq-0"})
    assert again.json()["decision"] in ("proceed", "replay")  # a new occurrence or the recorded one
    # Every submit and outcome ran on the loop: nothing else was in flight, the lane was idle.
    assert (gate.ran, gate.slow) == (21, 0)
    with kernel.store.read() as tx:
        steps = {s.step_id: s for s in tx.list_steps(eid)}
    assert all(steps[sid].status == StepStatus.SUCCEEDED and steps[sid].result == {"out": i}
               for i, sid in enumerate(ids))
    m = httpx.get(f"{srv.url}/metrics").text
    assert "regent_lane_inline_total 21.0" in m and "regent_lane_inline_slow_total 0.0" in m


def test_concurrent_step_calls_go_to_the_lane_and_all_are_recorded(
        served: tuple[ServerThread, Kernel, threads.InlineGate]) -> None:
    srv, kernel, gate = served
    running = Running(kernel)
    workers, per = 8, 15
    leases = [running.start() for _ in range(workers)]
    failures: list[Any] = []

    def work(i: int) -> None:
        eid, did, att = leases[i]
        try:
            with AgentClient(srv.url, running.agent_id, running.secret) as client:
                _round_trips(client.lease(did, att), eid, per, f"w{i}")
        except BaseException as exc:  # reported below, on the test's thread
            failures.append(exc)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    assert not failures, failures
    total = workers * per * 2
    # Requests that arrived together found one another in flight and queued for the lane, where
    # their commits could share an fsync; each execution's history is whole either way.
    assert gate.ran < total
    with kernel.store.read() as tx:
        for eid, _, _ in leases:
            steps = tx.list_steps(eid)
            assert len(steps) == per and all(s.status == StepStatus.SUCCEEDED for s in steps)
            seqs = [e.event_seq for e in tx.list_events(eid, 0, 1000)]
            assert seqs == list(range(1, len(seqs) + 1))


def test_a_slow_call_on_the_loop_sends_the_next_calls_to_the_lane(
        served: tuple[ServerThread, Kernel, threads.InlineGate]) -> None:
    srv, kernel, gate = served
    gate.slow_after, gate.pause = 0.0, 60.0  # every call counts as slow; the pause outlasts the test
    running = Running(kernel)
    eid, did, att = running.start()
    with AgentClient(srv.url, running.agent_id, running.secret) as client:
        _round_trips(client.lease(did, att), eid, 3, "slow")
    assert (gate.ran, gate.slow) == (1, 1)  # the first, then the lane for the pause
    assert gate.paused_until > time.monotonic()


def test_an_open_event_stream_does_not_keep_step_calls_off_the_loop(
        served: tuple[ServerThread, Kernel, threads.InlineGate]) -> None:
    srv, kernel, gate = served
    gate.slow_after = 60.0  # as above: only the stream is under test here
    running = Running(kernel)
    eid, did, att = running.start()
    with httpx.Client(base_url=srv.url, timeout=10, headers={"Authorization": "Bearer boot-token"}) as watcher, \
            watcher.stream("GET", f"/v0/executions/{eid}/stream") as events:
        assert events.status_code == 200
        lines = events.iter_lines()
        assert next(lines) == ": ok"  # subscribed: the stream's request stays in flight from here
        assert gate.long_lived == 1
        with AgentClient(srv.url, running.agent_id, running.secret) as client:
            _round_trips(client.lease(did, att), eid, 3, "watched")
        assert (gate.ran, gate.slow) == (6, 0)


def test_the_lane_is_idle_only_with_no_call_and_no_open_group(sqlite_store: SqlStore) -> None:
    assert isinstance(sqlite_store, SqliteStore)
    lane = threads.Lane(threads=1, groups=sqlite_store.commit_groups())
    assert not threads.Lane().idle()  # a lane that groups no commits (PostgreSQL) never lends the loop
    release, started = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        return "done"

    async def scenario() -> None:
        import asyncio

        assert lane.idle()
        task = asyncio.ensure_future(lane.call(slow))
        await asyncio.sleep(0)
        assert await asyncio.to_thread(started.wait, 10)
        assert not lane.idle()  # a call running
        release.set()
        assert await task == "done"
        deadline = time.monotonic() + 10
        while not lane.idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert lane.idle()

    import asyncio

    try:
        asyncio.run(scenario())
    finally:
        lane.close()
