"""The live stream side channel over real HTTP (rebuno-v0 §10): in-order fan-out, the 7000-byte
cap, step checks, and a stalled subscriber that never slows the producer."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from kernel.stream import InProcessBroker
from tests.conftest import Running
from tests.support import AgentClient, ServerThread, wait_until


@pytest.fixture
def served(kernel: Kernel) -> Iterator[ServerThread]:
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    app.state.stream_keepalive_seconds = 0.2
    with ServerThread(app) as srv:
        yield srv


def _executing_step(running: Running, url: str) -> tuple[AgentClient, str, str]:
    eid, did, att = running.start()
    c = AgentClient(url, running.agent_id, running.secret).lease(did, att)
    sid = c.submit(eid, "tool", {"x": 1}).json()["step_id"]
    return c, eid, sid


def _collect(url: str, eid: str, want: int, seen: list[dict[str, Any]], ready: threading.Event,
             frames: list[str]) -> None:
    with httpx.stream("GET", f"{url}/v0/executions/{eid}/stream", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            frames.append(line)
            if line == ": ok":
                ready.set()
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if len(seen) >= want:
                    return


def test_subscriber_receives_deltas_in_seq_order(served: ServerThread, running: Running) -> None:
    c, eid, sid = _executing_step(running, served.url)
    seen: list[dict[str, Any]] = []
    frames: list[str] = []
    ready = threading.Event()
    t = threading.Thread(target=_collect, args=(served.url, eid, 5, seen, ready, frames), daemon=True)
    t.start()
    assert ready.wait(10)
    wait_until(lambda: ": keep-alive" in frames, "a keep-alive frame")
    for seq in range(5):
        r = c.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": seq, "data": f"d{seq}"})
        assert r.status_code == 204
    t.join(10)
    assert [(m["step_id"], m["seq"], m["data"]) for m in seen] == [(sid, i, f"d{i}") for i in range(5)]
    assert ": keep-alive" in frames


def test_delta_over_7000_bytes_is_400(served: ServerThread, running: Running) -> None:
    c, eid, sid = _executing_step(running, served.url)
    ok = c.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": 0, "data": "é" * 3500})
    assert ok.status_code == 204
    r = c.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": 1, "data": "é" * 3501})
    assert r.status_code == 400 and r.json()["code"] == "validation_error"


def test_delta_for_a_finished_step_is_409_and_unknown_step_404(served: ServerThread, running: Running) -> None:
    c, eid, sid = _executing_step(running, served.url)
    c.complete_step(eid, sid, {"ok": True})
    r = c.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": 0, "data": "x"})
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    r = c.request("POST", f"/v0/executions/{eid}/steps/{'0' * 64}/stream", {"seq": 0, "data": "x"})
    assert r.status_code == 404


def test_consumer_of_unknown_execution_is_404(served: ServerThread) -> None:
    r = httpx.get(f"{served.url}/v0/executions/01920000-0000-7000-8000-000000000001/stream", timeout=10)
    assert r.status_code == 404


def test_full_subscriber_buffer_drops_instead_of_blocking() -> None:
    async def run() -> tuple[int, int, float]:
        broker = InProcessBroker(buffer=4)
        with broker.subscribe("e") as q:
            start = time.perf_counter()
            for i in range(1000):
                broker.publish("e", {"seq": i})
            took = time.perf_counter() - start
            return q.qsize(), broker.dropped, took

    size, dropped, took = asyncio.run(run())
    assert (size, dropped) == (4, 996)
    assert took < 1.0


def test_stalled_consumer_does_not_slow_the_producer(served: ServerThread, running: Running) -> None:
    c, eid, sid = _executing_step(running, served.url)

    def produce(n: int, first: int = 0) -> float:
        start = time.perf_counter()
        for seq in range(first, first + n):  # each delta its own bytes: a repeat is a refused replay
            assert c.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream",
                             {"seq": seq, "data": "x" * 1000}).status_code == 204
        return (time.perf_counter() - start) / n

    alone = produce(100)
    # A consumer that connects and never reads: its socket and 64-delta buffer fill, then it drops.
    with httpx.Client(timeout=10) as slow, slow.stream("GET", f"{served.url}/v0/executions/{eid}/stream") as r:
        assert r.status_code == 200
        stalled = produce(300, first=100)
    assert stalled < alone * 5 + 0.05, (alone, stalled)


def test_frames_are_exactly_the_spec_bytes(served: ServerThread, running: Running) -> None:
    """rebuno-v0 §10: `: ok`, then `data: {…}` per delta, `: keep-alive` on the timer, LF only."""
    c, eid, sid = _executing_step(running, served.url)
    raw = b""
    with httpx.stream("GET", f"{served.url}/v0/executions/{eid}/stream", timeout=10) as r:
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        chunks = r.iter_raw()
        raw += next(chunks)
        assert c.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": 0, "data": "hi"}).status_code == 204
        deadline = time.monotonic() + 5
        while b": keep-alive\n\n" not in raw and time.monotonic() < deadline:
            raw += next(chunks)
    assert raw.startswith(b": ok\n\n")
    assert f'data: {{"step_id":"{sid}","seq":0,"data":"hi"}}\n\n'.encode() in raw
    assert b": keep-alive\n\n" in raw and b"\r" not in raw
