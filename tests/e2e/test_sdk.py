"""The official Rebuno SDK end to end against a real `regent dev`: completion, crash and
re-delivery, replay of local steps and LLM calls, cancel, refused webhooks, duplicate deliveries."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import rebuno
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.e2e.conftest import (
    REPO,
    SECRET,
    DevKernel,
    clean_env,
    dev_kernel_for,
    sign_webhook,
    wait_for,
)
from tests.support import ServerThread

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

STEP = ["step.proposed", "step.allowed", "step.executing", "step.succeeded"]


def acked(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["payload"]["dispatch_id"], e["payload"]["attempt"]) for e in events if e["type"] == "dispatch.acked"]


@pytest.fixture
def k(dev_kernel: DevKernel) -> Iterator[DevKernel]:
    started = len(dev_kernel.agents)
    yield dev_kernel
    for a in dev_kernel.agents[started:]:
        a.stop(signal.SIGKILL)


def test_hello_example_completes_with_the_expected_event_log(k: DevKernel) -> None:
    port = k.ports["hello"]
    k.agent("hello", script=REPO / "examples" / "hello" / "agent.py", argv=["--port", str(port)])
    eid = k.api.create("hello", {"name": "Ada", "language": "fr"})
    e = k.api.wait_status(eid, "completed", "failed", "cancelled")
    assert e["status"] == "completed", e
    assert e["output"]["message"] == "Bonjour, Ada!"
    events = k.api.events(eid)
    types = [ev["type"] for ev in events]
    # dispatch.acked is written by the dispatch loop outside the agent's transactions, so it may
    # land among the first step events (rebuno-v0 §6.2); everything else is in a fixed order.
    assert [t for t in types if t != "dispatch.acked"] == [
        "execution.created", "execution.started", "dispatch.queued", *STEP, *STEP, *STEP, "execution.completed"]
    assert types.index("dispatch.acked") > types.index("dispatch.queued")
    assert [a for _, a in acked(events)] == [1]
    steps = sorted(k.api.steps(eid), key=lambda s: s["started_at"])
    assert [(s["kind"], s["target"], s["status"]) for s in steps] == [
        ("tool_call", "lookup_greeting", "succeeded"), ("tool_call", "render_greeting", "succeeded"),
        ("local", "greeted_at", "succeeded")]
    assert [e["event_seq"] for e in events] == list(range(1, len(events) + 1))


def test_hello_example_client_runs_an_execution(k: DevKernel) -> None:
    port = k.ports["hello"]
    k.agent("hello", script=REPO / "examples" / "hello" / "agent.py", argv=["--port", str(port)])
    out = subprocess.run([sys.executable, str(REPO / "examples" / "hello" / "agent.py"), "--run", "Grace"],
                         env=clean_env(REBUNO_URL=k.url), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("completed") and "Hello, Grace!" in out.stdout


def test_shell_example_runs_allowed_commands_and_waits_for_approval_on_others(k: DevKernel) -> None:
    k.agent("shell", script=REPO / "examples" / "shell" / "agent.py", argv=["--port", str(k.ports["shell"])])
    bundle = (REPO / "bundles" / "shell.yaml").read_text()
    assert k.api.http.post("/v0/policies/shell", json={"bundle": bundle}).status_code == 204
    ok = k.api.wait_status(k.api.create("shell", {"command": "echo hi"}), "completed", "failed")
    assert ok["output"]["result"] == {"exit_code": 0, "stdout": "hi\n", "stderr": ""}
    eid = k.api.create("shell", {"command": "rm -rf /nonexistent"})
    k.api.wait_status(eid, "blocked")
    pending = k.api.http.get("/v0/approvals", params={"status": "pending"}).json()
    assert [a["approvers"] for a in pending if a["execution_id"] == eid] == [["oncall"]]
    assert k.api.http.post(f"/v0/executions/{eid}/cancel").status_code == 204


def test_agent_killed_after_an_effect_is_redelivered_and_the_effect_runs_once(k: DevKernel) -> None:
    first = k.agent("crash", MODE="crash", HANG="1")
    eid = k.api.create("crash")
    wait_for(lambda: first.log_lines("hanging"), "the handler to record effect a and hang")
    assert first.effect_lines() == [f"{eid} a"]
    assert [s["status"] for s in k.api.steps(eid) if s["target"] == "effect"] == ["succeeded"]
    first.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    second = k.agent("crash", MODE="crash")  # same port, does not hang
    e = k.api.wait_status(eid, "completed", "failed", timeout=30)
    redelivered_after = time.monotonic() - killed_at
    assert e["status"] == "completed", e
    # the body of effect a ran once in total: attempt 2 replayed its recorded result
    assert second.effect_lines() == [f"{eid} a", f"{eid} b"]
    assert e["output"]["results"] == ["did a", "did b"]
    # the local step's value replayed identically after re-delivery
    tokens = [(r["attempt"], r["token"], r["pid"]) for r in second.log_lines("token")]
    assert tokens[0][0] == 1 and len({pid for _, _, pid in tokens}) == 2
    assert {t for _, t, _ in tokens} == {e["output"]["token"]}
    # the same dispatch row, re-claimed with a later attempt (a refused delivery while the new
    # process was starting, or a lease lost on a loaded machine, may take an attempt of its own)
    deliveries = acked(k.api.events(eid))
    assert len({d for d, _ in deliveries}) == 1 and deliveries[0][1] == 1 and len(deliveries) >= 2
    assert [a for _, a in deliveries] == sorted({a for _, a in deliveries})
    steps = k.api.steps(eid)
    assert sorted((s["kind"], s["target"], s["status"]) for s in steps) == [
        ("local", "token", "succeeded"), ("tool_call", "effect", "succeeded"), ("tool_call", "effect", "succeeded")]
    assert redelivered_after < 20, f"re-delivery took {redelivered_after:.1f}s for a 5 s lease"


class FakeProvider:
    """An OpenAI-shaped chat endpoint on loopback that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.calls += 1
        return JSONResponse({
            "id": f"cmpl-{self.calls}", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"hi #{self.calls}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        })


def test_llm_call_through_the_sdk_transport_is_recorded_once_and_replayed(k: DevKernel) -> None:
    provider = FakeProvider()
    with ServerThread(provider.app) as srv:
        first = k.agent("llm", MODE="llm", HANG="1", PROVIDER_URL=srv.url)
        eid = k.api.create("llm")
        wait_for(lambda: first.log_lines("hanging"), "the LLM call to be recorded")
        [step] = k.api.steps(eid)
        assert (step["kind"], step["target"], step["status"]) == ("llm_call", "fake-model", "succeeded")
        assert step["result"]["status"] == 200 and "hi #1" in step["result"]["body"]
        first.stop(signal.SIGKILL)
        second = k.agent("llm", MODE="llm", PROVIDER_URL=srv.url)
        e = k.api.wait_status(eid, "completed", "failed", timeout=30)
        assert e["status"] == "completed", e
        assert provider.calls == 1  # the re-delivered attempt replayed the recorded response
    assert e["output"] == {"reply": "hi #1"}
    replies = [(r["attempt"], r["reply"]) for r in second.log_lines("llm")]
    assert replies[0][0] == 1 and len(replies) >= 2 and {r for _, r in replies} == {"hi #1"}
    assert len(k.api.steps(eid)) == 1


def test_cancel_mid_run_ends_cancelled_and_the_agent_unwinds_cleanly(k: DevKernel) -> None:
    a = k.agent("ticks", MODE="ticks")
    eid = k.api.create("ticks")
    wait_for(lambda: len(a.effect_lines()) >= 3, "a few ticks")

    async def cancel() -> None:
        async with rebuno.Client(k.url) as client:  # the official client
            await client.cancel(eid)

    asyncio.run(cancel())
    e = k.api.wait_status(eid, "cancelled")
    assert e["failure_reason"] == "client_cancelled"
    [exited] = wait_for(lambda: a.log_lines("exited"), "the handler to unwind")
    assert exited["error"] in ("Terminated", "CancelledError", "LeaseSuperseded")
    ticks = len(a.effect_lines())
    # The agent must not go on working after it unwound: once its process has ended every
    # effect it made is on file (this waited a fixed 0.5 s before).
    assert a.stop(signal.SIGTERM) == 0
    assert len(a.effect_lines()) == ticks
    types = k.api.types(eid)
    assert "execution.cancelled" in types
    assert not {"execution.completed", "execution.failed"} & set(types)
    assert "Traceback" not in a.output()


@pytest.fixture(scope="module")
def three_attempts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevKernel]:
    """A kernel that gives up after three failed deliveries."""
    with dev_kernel_for(("refused", "wrong-secret"), tmp_path_factory.mktemp("exhaust"),
                        REGENT_DISPATCH_MAX_ATTEMPTS="3") as k:
        yield k


@pytest.mark.parametrize("agent_id", ["refused", "wrong-secret"], ids=["connection-refused", "sdk-answers-401"])
def test_webhook_refusing_deliveries_fails_the_execution_dispatch_exhausted(
    three_attempts: DevKernel, agent_id: str
) -> None:
    k = three_attempts
    agent = k.agent(agent_id, MODE="bulk", secret="not-the-secret") if agent_id == "wrong-secret" else None
    eid = k.api.create(agent_id)
    e = k.api.wait_status(eid, "failed", "completed", timeout=30)
    assert (e["status"], e["failure_reason"]) == ("failed", "dispatch_exhausted")
    events = k.api.events(eid)
    assert [ev["payload"]["attempt"] for ev in events if ev["type"] == "dispatch.failed"] == [1, 2, 3]
    assert events[-1]["type"] == "execution.failed"
    assert events[-1]["payload"]["reason"] == "dispatch_exhausted"
    if agent is not None:
        assert [w["status"] for w in agent.log_lines("webhook")] == [401, 401, 401]
        assert agent.effect_lines() == []


def test_duplicate_webhook_delivery_does_not_duplicate_an_effect(k: DevKernel) -> None:
    gate = k.tmp / "gate"
    a = k.agent("gated", MODE="gated", GATE=str(gate))
    eid = k.api.create("gated")
    wait_for(lambda: a.effect_lines(), "the effect")
    [delivery] = wait_for(lambda: a.log_lines("webhook"), "the delivery to be logged")
    raw = json.dumps(delivery["body"], separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Rebuno-Signature": sign_webhook(SECRET, raw),
               "Rebuno-Execution-Id": eid}

    def duplicate() -> int:
        return httpx.post(f"http://127.0.0.1:{a.port}/webhook", content=raw, headers=headers, timeout=5).status_code

    assert duplicate() == 200  # while the first handler is still running
    gate.touch()
    e = k.api.wait_status(eid, "completed", "failed")
    assert e["status"] == "completed", e
    count = len(k.api.events(eid))
    assert duplicate() == 200  # after it completed
    wait_for(lambda: len(a.log_lines("webhook")) == 3, "the duplicates to be logged")
    time.sleep(0.5)  # e2e only: give a wrongly started handler time to show itself
    assert a.effect_lines() == [f"{eid} once"]
    assert len(a.log_lines("started")) == 1
    assert len(k.api.events(eid)) == count
    assert [x for _, x in acked(k.api.events(eid))] == [1]



def test_execution_past_its_deadline_is_cancelled_and_the_agent_unwinds(tmp_path: Any) -> None:
    with dev_kernel_for(("ticks",), tmp_path, REGENT_DEADLINE_TIMEOUT="2s",
                        REGENT_DEADLINE_CHECK_INTERVAL="200ms") as k:
        a = k.agent("ticks", MODE="ticks")
        eid = k.api.create("ticks")
        assert "deadline_at" in k.api.get(eid)
        e = k.api.wait_status(eid, "cancelled", "completed", "failed", timeout=20)
        assert (e["status"], e["failure_reason"]) == ("cancelled", "deadline_exceeded")
        [cancelled] = [ev for ev in k.api.events(eid) if ev["type"] == "execution.cancelled"]
        assert cancelled["payload"]["reason"] == "deadline_exceeded"
        wait_for(lambda: a.log_lines("exited"), "the handler to unwind")
        assert len(a.effect_lines()) >= 1
