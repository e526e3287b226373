"""The gateway between a real kernel on loopback and a fake upstream: record once, replay without
an upstream call, refusals the official SDK maps back, budgets fed by the recorded usage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import rebuno
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kernel.api.app import create_app
from kernel.core.dispatch import claim_due, reap_expired_leases
from kernel.core.kernel import Kernel
from kernel.domain import BudgetSpec, Decision, PolicyInput, RateLimitSpec, Verdict
from kernel.gateway import create_gateway_app
from tests.conftest import Running
from tests.support import ServerThread

CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}
STREAM = "".join(f"data: {json.dumps(c)}\n\n" for c in [
    {"id": "c1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": "hel"}}]},
    {"id": "c1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": "lo"}}]},
    {"id": "c1", "object": "chat.completion.chunk", "choices": [],
     "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}},
]) + "data: [DONE]\n\n"


def fake_upstream(calls: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        calls.append({"body": body, "authorization": request.headers.get("authorization"),
                      "leaked": [h for h in request.headers if h.startswith("x-rebuno")]})
        if body.get("model") == "broken":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if body.get("stream") and body.get("model") == "latin-1":  # a provider that is not UTF-8
            async def latin() -> Any:
                yield b'data: {"text": "caf\xe9"}\n\n'
                yield b"data: [DONE]\n\n"
            return StreamingResponse(latin(), media_type="text/event-stream")
        if body.get("stream"):
            async def chunks() -> Any:
                for frame in STREAM.split("\n\n")[:-1]:
                    yield (frame + "\n\n").encode()
            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse(CHAT)

    return app


class ByModel:
    """A resolver deciding by the model name, so one execution can see every decision."""

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: PolicyInput, tx: Any = None, bundle_id: Any = None) -> Decision:
        if inp.target == "forbidden":
            return Decision(Verdict.DENY, "no-forbidden", reason="model_forbidden")
        if inp.target == "needs-approval":
            return Decision(Verdict.REQUIRE_APPROVAL, "ask")
        if inp.target == "one-per-minute":
            return Decision(Verdict.ALLOW, "llm-cap", rate_limit=RateLimitSpec(max_calls=1, window_seconds=60))
        if inp.target == "budgeted":
            return Decision(Verdict.ALLOW, "budget", budget=BudgetSpec(max_tokens=10))
        return Decision.permissive()


class Stack:
    def __init__(self, kernel: ServerThread, gateway: ServerThread, upstream_calls: list[dict[str, Any]],
                 running: Running):
        self.kernel, self.gateway, self.calls, self.running = kernel, gateway, upstream_calls, running

    def lease_headers(self) -> tuple[str, dict[str, str]]:
        eid, did, att = self.running.start()
        return eid, {"X-Rebuno-Execution-Id": eid, "X-Rebuno-Dispatch-Id": did,
                     "X-Rebuno-Dispatch-Attempt": str(att), "X-Rebuno-Agent-Id": self.running.agent_id,
                     "X-Rebuno-Agent-Secret": self.running.secret, "Authorization": "Bearer sk-test"}

    def reclaim(self, eid: str, headers: dict[str, str]) -> dict[str, str]:
        """Expire the lease and claim the dispatch again, as a crashed agent's re-delivery does."""
        k = self.running.kernel
        k.clock.advance(k.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
        reap_expired_leases(k)
        [claim] = [c for c in claim_due(k, 10) if c.execution_id == eid]
        return {**headers, "X-Rebuno-Dispatch-Id": claim.dispatch_id,
                "X-Rebuno-Dispatch-Attempt": str(claim.attempt)}

    def chat(self, headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


@pytest.fixture
def stack(kernel: Kernel, running: Running) -> Iterator[Stack]:
    from kernel.ratelimit import LimitsLimiter

    kernel.policy = ByModel()
    kernel.limiter = limiter = LimitsLimiter("memory://")
    calls: list[dict[str, Any]] = []
    with ServerThread(create_app(kernel, dev=True, bearer_token="boot-token")) as k, \
            ServerThread(fake_upstream(calls)) as up, \
            ServerThread(create_gateway_app(f"{up.url}/v1", k.url)) as gw:
        yield Stack(k, gw, calls, running)
    limiter.close()


def test_non_streamed_completion_is_recorded_once_and_replayed(stack: Stack) -> None:
    eid, h = stack.lease_headers()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    first = stack.chat(h, body)
    assert first.status_code == 200 and first.json() == CHAT
    assert len(stack.calls) == 1
    assert stack.calls[0]["authorization"] == "Bearer sk-test" and stack.calls[0]["leaked"] == []
    again = stack.chat(stack.reclaim(eid, h), body)
    assert again.status_code == 200 and again.json() == CHAT
    assert len(stack.calls) == 1, "a replay must not call upstream"
    steps = httpx.get(f"{stack.kernel.url}/v0/executions/{eid}/steps").json()
    items = steps["steps"] if isinstance(steps, dict) else steps
    assert [(s["kind"], s["target"], s["status"]) for s in items] == [("llm_call", "gpt-4o-mini", "succeeded")]
    assert items[0]["usage_input"] == 12 and items[0]["usage_output"] == 7


def test_streamed_completion_passes_through_and_replays_the_same_stream(stack: Stack) -> None:
    eid, h = stack.lease_headers()
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    first = stack.chat(h, body)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
    assert first.text == STREAM
    again = stack.chat(stack.reclaim(eid, h), body)
    assert again.text == STREAM and again.headers["content-type"].startswith("text/event-stream")
    assert len(stack.calls) == 1
    steps = httpx.get(f"{stack.kernel.url}/v0/executions/{eid}/steps").json()
    items = steps["steps"] if isinstance(steps, dict) else steps
    assert items[0]["usage_input"] == 31 and items[0]["usage_output"] == 9


def _raised(resp: httpx.Response) -> BaseException | None:
    try:
        resp.raise_for_status()
    except httpx.HTTPStatusError as e:
        err = RuntimeError(f"Error code: {resp.status_code} - {resp.text}")  # what provider SDKs surface
        err.__cause__ = e
        try:
            rebuno.raise_for_refusal(err)
        except Exception as mapped:
            return mapped
    return None


def test_denied_call_maps_back_to_policy_error(stack: Stack) -> None:
    _, h = stack.lease_headers()
    r = stack.chat(h, {"model": "forbidden", "messages": []})
    assert r.status_code == 403 and r.json()["error"]["type"] == "rebuno_refusal"
    mapped = _raised(r)
    assert isinstance(mapped, rebuno.PolicyError) and "model_forbidden" in str(mapped)
    assert stack.calls == []


def test_approval_required_call_maps_back_to_blocked(stack: Stack) -> None:
    _, h = stack.lease_headers()
    r = stack.chat(h, {"model": "needs-approval", "messages": []})
    assert r.status_code == 403
    assert isinstance(_raised(r), rebuno.Blocked)


def test_call_on_cancelled_execution_maps_back_to_terminated(stack: Stack) -> None:
    eid, h = stack.lease_headers()
    assert httpx.post(f"{stack.kernel.url}/v0/executions/{eid}/cancel", json={}).status_code < 300
    r = stack.chat(h, {"model": "gpt-4o-mini", "messages": []})
    assert r.status_code == 403 and "execution_terminal" in r.json()["error"]["message"], r.text
    assert isinstance(_raised(r), rebuno.Terminated), r.text
    assert stack.calls == []


def test_a_real_rate_limit_refusal_is_429_and_maps_back_to_rate_limited(stack: Stack) -> None:
    _, h = stack.lease_headers()
    body = {"model": "one-per-minute", "messages": [{"role": "user", "content": "hi"}]}
    assert stack.chat(h, body).status_code == 200
    r = stack.chat(h, {**body, "messages": [{"role": "user", "content": "again"}]})
    assert r.status_code == 429 and r.json()["error"]["type"] == "rebuno_refusal", r.text
    assert "rate_limited" in r.json()["error"]["message"] and "rate_limit_exceeded" in r.json()["error"]["message"]
    assert isinstance(_raised(r), rebuno.RateLimited)
    assert len(stack.calls) == 1, "a refused call never reaches upstream"


def test_rate_limited_marker_maps_back_to_rate_limited() -> None:
    from kernel.gateway.app import refusal

    resp = refusal("rate_limited", "rate_limit_exceeded")
    assert resp.status_code == 429
    r = httpx.Response(429, content=resp.body, request=httpx.Request("POST", "http://gw/v1/chat/completions"))
    assert isinstance(_raised(r), rebuno.RateLimited)


def test_budget_sees_the_gateways_recorded_usage(stack: Stack) -> None:
    _, h = stack.lease_headers()
    first = stack.chat(h, {"model": "budgeted", "messages": [{"role": "user", "content": "a"}]})
    assert first.status_code == 200  # 19 tokens recorded, over the 10-token budget
    second = stack.chat(h, {"model": "budgeted", "messages": [{"role": "user", "content": "b"}]})
    assert isinstance(_raised(second), rebuno.PolicyError), second.text
    assert len(stack.calls) == 1


def test_upstream_error_fails_the_step_with_status_and_body(stack: Stack) -> None:
    eid, h = stack.lease_headers()
    r = stack.chat(h, {"model": "broken", "messages": []})
    assert r.status_code == 503 and r.json() == {"error": {"message": "overloaded"}}
    steps = httpx.get(f"{stack.kernel.url}/v0/executions/{eid}/steps").json()
    items = steps["steps"] if isinstance(steps, dict) else steps
    assert items[0]["status"] == "failed" and items[0]["error"]["status"] == 503


@pytest.mark.parametrize("drop", ["X-Rebuno-Execution-Id", "X-Rebuno-Agent-Secret", "X-Rebuno-Dispatch-Attempt"])
def test_missing_lease_header_is_400_in_openai_shape(stack: Stack, drop: str) -> None:
    _, h = stack.lease_headers()
    del h[drop]
    r = stack.chat(h, {"model": "gpt-4o-mini", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "sk-test" not in r.text and stack.calls == []


@pytest.mark.parametrize("attempt", [b"\xb2", b"x1", b"-1"], ids=["superscript-two", "letters", "negative"])
def test_a_dispatch_attempt_that_is_not_a_plain_number_is_400_in_openai_shape(stack: Stack, attempt: bytes) -> None:
    # "²" passed str.isdigit() and reached the kernel as the attempt; it is refused here now.
    _, h = stack.lease_headers()
    h["X-Rebuno-Dispatch-Attempt"] = attempt  # type: ignore[assignment]
    r = stack.chat(h, {"model": "gpt-4o-mini", "messages": []})
    assert r.status_code == 400 and "x-rebuno-dispatch-attempt" in r.json()["error"]["message"], r.text
    assert stack.calls == []


def test_streamed_call_publishes_its_deltas_to_the_side_channel(stack: Stack) -> None:
    import threading

    eid, h = stack.lease_headers()
    got: list[str] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", f"{stack.kernel.url}/v0/executions/{eid}/stream", timeout=10) as r:
            for line in r.iter_lines():
                if line == ": ok":
                    ready.set()
                elif line.startswith("data: "):
                    got.append(json.loads(line[6:])["data"])
                    if "".join(got) == STREAM:
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(10)
    assert stack.chat(h, {"model": "gpt-4o-mini", "stream": True, "messages": []}).text == STREAM
    t.join(10)
    assert "".join(got) == STREAM


@pytest.mark.parametrize("record", [{"status": "abc", "body": "x"}, {"status": 99}, {"status": 10**30},
                                    {"status": True}, {"status": 204, "body": "x"}, {"status": 200, "headers": ["x"]},
                                    ["not", "a", "record"], None, "text"],
                         ids=["status-text", "status-99", "status-huge", "status-bool", "no-body-status",
                              "headers-list", "list", "null", "string"])
def test_a_replayed_result_that_is_not_a_gateway_record_is_answered_as_json(record: Any) -> None:
    # An agent may record the same llm_call step itself, with any JSON: the replay must not 500.
    from kernel.gateway.app import _from_record

    r = _from_record(record)
    assert r.status_code == 200 and json.loads(bytes(r.body)) == record


def test_a_gateway_record_is_rebuilt_with_its_status_and_type() -> None:
    from kernel.gateway.app import _from_record

    r = _from_record({"status": 201, "headers": {"content-type": "text/plain"}, "body": "hi"})
    assert (r.status_code, r.media_type, bytes(r.body)) == (201, "text/plain", b"hi")


def test_a_stream_that_is_not_utf8_passes_through_whole_and_is_recorded(stack: Stack) -> None:
    # Before: the strict UTF-8 decoder of the tee raised at the first bad byte, cutting the
    # caller's stream and failing the step. The bytes pass through as sent; the record has U+FFFD.
    eid, h = stack.lease_headers()
    r = stack.chat(h, {"model": "latin-1", "stream": True, "messages": []})
    assert r.status_code == 200 and r.content == b'data: {"text": "caf\xe9"}\n\ndata: [DONE]\n\n'
    steps = httpx.get(f"{stack.kernel.url}/v0/executions/{eid}/steps").json()
    items = steps["steps"] if isinstance(steps, dict) else steps
    assert items[0]["status"] == "succeeded" and "caf\ufffd" in items[0]["result"]["body"]
