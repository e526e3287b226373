"""The dispatcher against a real webhook receiver on loopback: signing, verdicts, backoff,
exhaustion, leases, concurrency, stop (rebuno-v0 §6). Time moves only on the ManualClock."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import anyio.to_thread
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel.core import executions, steps
from kernel.core.agents import register_agent
from kernel.core.dispatch import Claim, claim_due
from kernel.core.kernel import Kernel
from kernel.dispatcher import Dispatcher, reap_interval, webhook_body
from kernel.domain import Decision, DispatchStatus, Lease, PolicyInput, Verdict
from kernel.identity import args_hash
from tests.support import ServerThread, free_port

SECRET = "webhook-secret"


class Receiver:
    """A webhook endpoint that records every request and answers `status` once `release` is set."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.release = threading.Event()
        self.release.set()
        self.app = Starlette(routes=[Route("/webhook", self._webhook, methods=["POST"])])

    async def _webhook(self, request: Request) -> Response:
        body = await request.body()
        self.requests.append((dict(request.headers), body))
        await anyio.to_thread.run_sync(self.release.wait, 10)
        return Response(status_code=self.status)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(b) for _, b in self.requests]


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    r = Receiver()
    with ServerThread(r.app) as srv:
        yield r, f"{srv.url}/webhook"
        r.release.set()


class AskEveryone:
    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: PolicyInput, tx: Any = None, bundle_id: Any = None) -> Decision:
        return Decision(Verdict.REQUIRE_APPROVAL, "ask")


def agent(k: Kernel, url: str, lease: int | None = None, agent_id: str = "hello") -> None:
    register_agent(k, agent_id, url, SECRET, lease, keep_policy=True)


def start(k: Kernel, agent_id: str = "hello") -> str:
    e, _ = executions.create_execution(k, agent_id, {"n": 1})
    return e.id


def types(k: Kernel, eid: str) -> list[str]:
    with k.store.read() as tx:
        return [e.type for e in tx.list_events(eid, 0, 1000)]


def dispatch_events(k: Kernel, eid: str, typ: str) -> list[dict[str, Any]]:
    with k.store.read() as tx:
        return [e.payload for e in tx.list_events(eid, 0, 1000) if e.type == typ]


def run(k: Kernel, scenario: Callable[[Dispatcher], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        d = Dispatcher(k, **{"poll_interval": 0.01, **options})
        try:
            return await scenario(d)
        finally:
            await d.stop()

    return asyncio.run(main())


async def deliver(d: Dispatcher) -> int:
    n = await d.claim_and_deliver()
    await d.drain()
    return n


async def until(predicate: Callable[[], bool], seconds: float = 10) -> None:
    """Wait (bounded) for work another thread or task is doing."""
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


# -- the webhook itself -------------------------------------------------------------------
def test_webhook_body_has_rebuno_field_order_and_whole_second_lease() -> None:
    c = Claim("d-1", "e-1", "hello", 3, 120.0)
    assert webhook_body(c) == (b'{"execution_id":"e-1","dispatch_id":"d-1","dispatch_attempt":3,'
                               b'"lease_timeout_seconds":120}')


def test_webhook_body_keeps_a_fractional_lease() -> None:
    assert json.loads(webhook_body(Claim("d", "e", "a", 1, 2.5)))["lease_timeout_seconds"] == 2.5


def test_reaper_runs_every_quarter_lease_capped_at_two_seconds() -> None:
    assert (reap_interval(120), reap_interval(4)) == (2.0, 1.0)


def test_dispatcher_posts_signed_webhook_and_records_ack(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    agent(kernel, url)
    eid = start(kernel)
    assert run(kernel, deliver) == 1
    [(headers, raw)] = r.requests
    with kernel.store.read() as tx:
        [d] = [d for d in [tx.get_dispatch(p["dispatch_id"]) for p in dispatch_events(kernel, eid, "dispatch.queued")] if d]
    assert json.loads(raw) == {"execution_id": eid, "dispatch_id": d.id, "dispatch_attempt": 1,
                               "lease_timeout_seconds": 120}
    assert list(json.loads(raw)) == ["execution_id", "dispatch_id", "dispatch_attempt", "lease_timeout_seconds"]
    assert headers["content-type"] == "application/json"
    assert headers["rebuno-execution-id"] == eid
    assert headers["rebuno-signature"] == "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert types(kernel, eid)[-1] == "dispatch.acked"
    assert dispatch_events(kernel, eid, "dispatch.acked")[0]["attempt"] == 1
    # the lease lasts for the agent's whole run: the row stays in flight after the ack
    assert (d.status, d.attempt, d.locked_by) == (DispatchStatus.IN_FLIGHT, 1, kernel.replica_id)


def test_agent_lease_timeout_is_sent_in_the_body(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    agent(kernel, url, lease=30)
    start(kernel)
    run(kernel, deliver)
    assert r.bodies()[0]["lease_timeout_seconds"] == 30


def test_failed_delivery_is_retried_after_backoff_with_the_next_attempt(
    kernel: Kernel, receiver: tuple[Receiver, str]
) -> None:
    r, url = receiver
    r.status = 500
    agent(kernel, url)
    eid = start(kernel)
    now = kernel.clock.now()
    run(kernel, deliver)
    [failed] = dispatch_events(kernel, eid, "dispatch.failed")
    assert (failed["attempt"], failed["status"], failed["error"]) == (1, "failed", "HTTP 500")
    with kernel.store.read() as tx:
        d = tx.get_dispatch(failed["dispatch_id"])
    assert d is not None and d.status == DispatchStatus.FAILED and d.locked_by is None
    assert now + timedelta(seconds=1) <= d.next_attempt_at < now + timedelta(seconds=1.25)
    assert run(kernel, deliver) == 0  # not due yet
    kernel.clock.advance(1.25)  # type: ignore[attr-defined]
    r.status = 204
    assert run(kernel, deliver) == 1
    assert [b["dispatch_attempt"] for b in r.bodies()] == [1, 2]
    assert dispatch_events(kernel, eid, "dispatch.acked")[0]["attempt"] == 2


@pytest.mark.parametrize("status", [302, 401, 404, 503], ids=["redirect", "unauthorized", "not-found", "unavailable"])
def test_any_non_2xx_answer_is_a_failed_delivery(kernel: Kernel, receiver: tuple[Receiver, str], status: int) -> None:
    r, url = receiver
    r.status = status
    agent(kernel, url)
    eid = start(kernel)
    run(kernel, deliver)
    assert [p["error"] for p in dispatch_events(kernel, eid, "dispatch.failed")] == [f"HTTP {status}"]
    assert "dispatch.acked" not in types(kernel, eid)


def test_unreachable_webhook_is_a_failed_delivery(kernel: Kernel) -> None:
    agent(kernel, f"http://127.0.0.1:{free_port()}/webhook")
    eid = start(kernel)
    run(kernel, deliver)
    [failed] = dispatch_events(kernel, eid, "dispatch.failed")
    assert failed["error"].startswith("ConnectError")


def test_slow_webhook_times_out_as_a_failed_delivery(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    r.release.clear()
    agent(kernel, url)
    eid = start(kernel)
    run(kernel, deliver, timeout=0.2)
    r.release.set()
    assert [p["error"] for p in dispatch_events(kernel, eid, "dispatch.failed")] == ["timeout after 0.2s"]


class RawWebhook:
    """A loopback webhook written on a bare socket, to answer the way no well-behaved server does:
    `mode` "endless-body" (200, then a chunk every 20 ms without end), "trickle-headers" (a header
    byte every 50 ms, never finishing them) or "big-body" (200 and 1 MB at once). Every loop is
    bounded: a connection lives at most 20 s."""

    def __init__(self, mode: str) -> None:
        import socket

        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/webhook"
        self.done = threading.Event()
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        import time

        deadline = time.monotonic() + 20
        try:
            request = b""  # read the whole request: closing on unread bytes would reset the answer
            while b"\r\n\r\n" not in request and time.monotonic() < deadline:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            while len(body) < length and time.monotonic() < deadline:
                body += conn.recv(65536)
            if self.mode == "trickle-headers":
                for b in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                    if self.done.is_set() or time.monotonic() > deadline:
                        return
                    conn.sendall(bytes([b]))
                    time.sleep(0.05)
            elif self.mode == "endless-body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while not self.done.is_set() and time.monotonic() < deadline:
                    conn.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
                    time.sleep(0.02)
            else:
                body = b"x" * (1 << 20)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()


@pytest.mark.parametrize(("mode", "verdict"), [("endless-body", "dispatch.acked"), ("big-body", "dispatch.acked"),
                                               ("trickle-headers", "dispatch.failed")])
def test_a_webhook_that_never_finishes_answering_is_bounded_by_the_delivery_timeout(
        kernel: Kernel, mode: str, verdict: str) -> None:
    # Before: httpx's timeout is per read, so a body that never ends or headers sent a byte at a
    # time held a delivery worker (and the answer's memory) for as long as the agent liked; 8
    # such agents halted every delivery. Now the whole delivery is bounded and the body capped.
    hook = RawWebhook(mode)
    try:
        agent(kernel, hook.url)
        eid = start(kernel)

        async def scenario(d: Dispatcher) -> None:
            await asyncio.wait_for(deliver(d), 10)  # the old code never returned here

        run(kernel, scenario, timeout=0.5)
    finally:
        hook.close()
    assert types(kernel, eid)[-1] == verdict
    if verdict == "dispatch.failed":
        assert dispatch_events(kernel, eid, verdict)[0]["error"] == "timeout after 0.5s"


def test_delivery_failing_every_attempt_fails_the_execution_dispatch_exhausted(
    kernel: Kernel, receiver: tuple[Receiver, str]
) -> None:
    r, url = receiver
    r.status = 503
    kernel.dispatch_max_attempts = 3
    agent(kernel, url)
    eid = start(kernel)

    async def scenario(d: Dispatcher) -> list[int]:
        counts = []
        for _ in range(5):
            counts.append(await deliver(d))
            kernel.clock.advance(60)  # type: ignore[attr-defined]
        return counts

    assert run(kernel, scenario) == [1, 1, 1, 0, 0]
    assert [p["attempt"] for p in dispatch_events(kernel, eid, "dispatch.failed")] == [1, 2, 3]
    e = executions.get_execution(kernel, eid)
    assert (e.status, e.failure_reason) == ("failed", "dispatch_exhausted")
    assert types(kernel, eid)[-2:] == ["dispatch.failed", "execution.failed"]
    assert dispatch_events(kernel, eid, "execution.failed")[0]["reason"] == "dispatch_exhausted"


def test_claims_never_exceed_idle_workers(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    r.release.clear()
    agent(kernel, url)
    for _ in range(5):
        start(kernel)

    async def scenario(d: Dispatcher) -> list[int]:
        first = await d.claim_and_deliver()
        await until(lambda: len(r.requests) == 2)
        second = await d.claim_and_deliver()  # both workers busy: nothing more is claimed
        r.release.set()
        await d.drain()
        third = await deliver(d)
        fourth = await deliver(d)
        return [first, second, third, fourth]

    # One agent may use every worker here (its share is the fairness tests' subject).
    assert run(kernel, scenario, concurrency=2, agent_concurrency=2, host_concurrency=2) == [2, 0, 2, 1]
    assert len({b["execution_id"] for b in r.bodies()}) == 5


def test_expired_lease_is_redelivered_with_the_next_attempt(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    agent(kernel, url)
    eid = start(kernel)

    async def scenario(d: Dispatcher) -> list[int]:
        await deliver(d)
        kernel.clock.advance(kernel.dispatch_lease_timeout - 1)  # type: ignore[attr-defined]
        early = await d.reap_once()
        kernel.clock.advance(2)  # type: ignore[attr-defined]
        late = await d.reap_once()
        await deliver(d)
        return [early, late]

    assert run(kernel, scenario) == [0, 1]
    assert [(b["dispatch_attempt"], b["dispatch_id"]) for b in r.bodies()] == [
        (1, r.bodies()[0]["dispatch_id"]), (2, r.bodies()[0]["dispatch_id"])]
    assert [p["attempt"] for p in dispatch_events(kernel, eid, "dispatch.acked")] == [1, 2]


def test_start_reaps_expired_leases_before_delivering(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    agent(kernel, url, lease=10)
    start(kernel)
    [claim] = claim_due(kernel, 10)  # a replica claimed it, then died before delivering
    kernel.clock.advance(11)  # type: ignore[attr-defined]

    async def scenario(d: Dispatcher) -> None:
        await d.start()
        await until(lambda: len(r.requests) == 1)

    run(kernel, scenario)
    assert r.bodies()[0]["dispatch_attempt"] == claim.attempt + 1


def test_failure_verdict_is_dropped_when_the_delivery_lost_its_row(
    kernel: Kernel, receiver: tuple[Receiver, str]
) -> None:
    r, url = receiver
    r.release.clear()
    r.status = 500
    kernel.dispatch_max_attempts = 1
    kernel.policy = AskEveryone()
    agent(kernel, url)
    eid = start(kernel)
    req = steps.StepRequest(kind="tool_call", target="t", args=None, args_text="null", args_hash=args_hash("null"))

    async def scenario(d: Dispatcher) -> str:
        await d.claim_and_deliver()
        await until(lambda: len(r.requests) == 1)
        b = r.bodies()[0]
        # during the webhook call the agent blocks on an approval, which retires the row
        answer = await anyio.to_thread.run_sync(
            lambda: steps.submit_step(kernel, Lease("hello", eid, b["dispatch_id"], b["dispatch_attempt"]), req))
        r.release.set()
        await d.drain()
        return answer.decision

    assert run(kernel, scenario) == "blocked"
    assert executions.get_execution(kernel, eid).status == "blocked"  # not failed: verdict dropped
    assert "dispatch.failed" in types(kernel, eid) and "execution.failed" not in types(kernel, eid)


def test_stop_lets_a_delivery_on_the_wire_finish(kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    r.release.clear()
    agent(kernel, url)
    eid = start(kernel)

    async def main() -> None:
        d = Dispatcher(kernel, poll_interval=0.01)
        await d.start()
        await until(lambda: len(r.requests) == 1)
        stopping = asyncio.create_task(d.stop())
        await asyncio.sleep(0)
        assert not stopping.done()
        r.release.set()
        await asyncio.wait_for(stopping, 10)

    asyncio.run(main())
    assert types(kernel, eid)[-1] == "dispatch.acked"


def test_agent_that_acks_but_never_reports_is_exhausted_at_the_claim_after_the_last_attempt(
    kernel: Kernel, receiver: tuple[Receiver, str]
) -> None:
    r, url = receiver
    kernel.dispatch_max_attempts = 2
    agent(kernel, url)
    eid = start(kernel)

    async def scenario(d: Dispatcher) -> list[int]:
        reaped = []
        for _ in range(3):
            await deliver(d)
            kernel.clock.advance(kernel.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
            reaped.append(await d.reap_once())
        return reaped

    assert run(kernel, scenario) == [1, 1, 0]
    assert [b["dispatch_attempt"] for b in r.bodies()] == [1, 2]  # N deliveries, no third request
    e = executions.get_execution(kernel, eid)
    assert (e.status, e.failure_reason) == ("failed", "dispatch_exhausted")
    assert "dispatch.failed" not in types(kernel, eid)


def test_claim_failures_are_logged_and_retried_with_backoff(
    kernel: Kernel, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import kernel.dispatcher as dispatcher_module

    r, url = receiver
    agent(kernel, url)
    start(kernel)
    real = dispatcher_module._claim_with_agents
    calls: list[int] = []

    def flaky(k: Kernel, limit: int) -> Any:
        calls.append(limit)
        if len(calls) <= 2:
            raise RuntimeError("store unavailable")
        return real(k, limit)

    monkeypatch.setattr(dispatcher_module, "_claim_with_agents", flaky)

    async def scenario(d: Dispatcher) -> None:
        await d.start()
        await until(lambda: len(r.requests) == 1)

    run(kernel, scenario)
    assert len(calls) >= 3
    assert caplog.text.count("claiming dispatches failed") == 2


def test_claims_go_out_in_chunks_and_every_claimed_row_is_delivered_and_acked(
        kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    """20 idle workers: three claim calls (8, 8, 4 rows) at once; verdicts recorded in batches."""
    r, url = receiver
    agent(kernel, url)
    ids = [start(kernel) for _ in range(21)]

    async def scenario(d: Dispatcher) -> int:
        return await deliver(d)

    assert run(kernel, scenario, concurrency=20, agent_concurrency=20, host_concurrency=20) == 20
    delivered = {b["execution_id"] for b in r.bodies()}
    assert len(r.requests) == 20 and delivered < set(ids)
    for eid in delivered:  # drain() waited for the batched verdicts
        assert types(kernel, eid)[-1] == "dispatch.acked"
    [left] = set(ids) - delivered
    assert "dispatch.acked" not in types(kernel, left)


def test_the_dispatcher_thread_delivers_on_a_loop_of_its_own_and_stops(
        kernel: Kernel, receiver: tuple[Receiver, str]) -> None:
    from kernel.dispatcher import DispatcherThread
    from kernel.lane import Lane

    r, url = receiver
    agent(kernel, url)
    ids = [start(kernel) for _ in range(3)]
    lane = Lane(threads=1)

    async def first(fn: Callable[..., Any], *args: Any) -> Any:
        return await lane.call_first(fn, *args)

    async def main() -> tuple[str, str]:
        t = DispatcherThread(lambda: Dispatcher(kernel, poll_interval=0.01, run_blocking=first))
        await t.start()
        try:
            await until(lambda: all(types(kernel, e)[-1] == "dispatch.acked" for e in ids))
            assert t.delivered == 3
            return threading.current_thread().name, t._thread.name if t._thread else ""
        finally:
            await t.stop()
            assert t._thread is not None and not t._thread.is_alive()

    try:
        loop_thread, dispatch_thread = asyncio.run(main())
    finally:
        lane.close()
    assert dispatch_thread == "regent-dispatch" != loop_thread
    assert sorted(b["execution_id"] for b in r.bodies()) == sorted(ids)
