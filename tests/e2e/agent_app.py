"""An official-SDK agent for the end-to-end tests, configured by environment variables.

MODE picks the handler; EFFECTS is a file every tool body appends one line to (so a test can count
how often a body really ran); LOG receives one JSON line per webhook received and per handler
event; HANG=1 makes the handler stop (heartbeating) after its first recorded effect, so a test can
SIGKILL the process at a known point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from typing import Any

import rebuno
import uvicorn

AGENT_ID = os.environ["AGENT_ID"]
EFFECTS = os.environ["EFFECTS"]
LOG = os.environ["LOG"]
MODE = os.environ.get("MODE", "crash")
HANG = os.environ.get("HANG") == "1"
GATE = os.environ.get("GATE", "")
PROVIDER_URL = os.environ.get("PROVIDER_URL", "")

agent = rebuno.Agent(AGENT_ID, secret=os.environ["REBUNO_AGENT_SECRET"], base_url=os.environ["REBUNO_URL"])


def _append(path: str, line: str) -> None:
    # One write per line with O_APPEND: concurrent handlers never interleave within a line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def log(event: str, **fields: Any) -> None:
    _append(LOG, json.dumps({"event": event, "pid": os.getpid(), **fields}))


@rebuno.tool
async def effect(name: str) -> str:
    _append(EFFECTS, f"{rebuno.execution().id} {name}")
    return f"did {name}"


async def hang() -> None:
    log("hanging", execution_id=rebuno.execution().id)
    await asyncio.Event().wait()  # the SDK keeps heartbeating; only a kill ends this


async def crash() -> dict[str, Any]:
    ctx = rebuno.execution()
    token = await rebuno.step("token", lambda: uuid.uuid4().hex)
    log("token", execution_id=ctx.id, attempt=ctx.dispatch_attempt, token=token)
    first = await effect("a")
    if HANG:
        await hang()
    second = await effect("b")
    return {"token": token, "results": [first, second]}


async def llm() -> dict[str, Any]:
    ctx = rebuno.execution()
    async with rebuno.http_client(base_url=PROVIDER_URL, timeout=10) as http:
        resp = await http.post("/v1/chat/completions", json={
            "model": "fake-model", "messages": [{"role": "user", "content": "say hi"}]})
    reply = resp.json()["choices"][0]["message"]["content"]
    log("llm", execution_id=ctx.id, attempt=ctx.dispatch_attempt, reply=reply, status=resp.status_code)
    if HANG:
        await hang()
    return {"reply": reply}


async def ticks() -> dict[str, Any]:
    ctx = rebuno.execution()
    try:
        for i in range(2000):  # bounded: about 100 s at most
            await effect(f"tick-{i}")
            await asyncio.sleep(0.05)
        return {"ticks": 2000}
    except BaseException as exc:
        log("exited", execution_id=ctx.id, error=type(exc).__name__)
        raise


async def gated() -> dict[str, Any]:
    ctx = rebuno.execution()
    log("started", execution_id=ctx.id, attempt=ctx.dispatch_attempt)
    await effect("once")
    for _ in range(1200):  # bounded: 60 s
        if os.path.exists(GATE):
            break
        await asyncio.sleep(0.05)
    return {"done": True}


async def bulk() -> dict[str, Any]:
    return {"result": await effect("work")}


_FLAKY: set[str] = set()


@rebuno.tool
async def flaky(name: str) -> str:
    """Raises the first time per execution, so the handler retries it."""
    eid = rebuno.execution().id
    if eid not in _FLAKY:
        _FLAKY.add(eid)
        raise RuntimeError("first call fails")
    _append(EFFECTS, f"{eid} {name}")
    return f"did {name}"


async def twins() -> dict[str, Any]:
    """Pairs of identical calls the official SDK signs as the same bytes within one second: two
    local steps back to back, two tool calls at once, a tool call retried after its body raised."""
    first = await rebuno.step("token", lambda: uuid.uuid4().hex)
    second = await rebuno.step("token", lambda: uuid.uuid4().hex)
    both = await asyncio.gather(effect("twin"), effect("twin"))
    with contextlib.suppress(rebuno.ToolError):
        await flaky("retry")
    retried = await flaky("retry")
    return {"tokens": [first, second], "twins": list(both), "retried": retried}


HANDLERS = {"crash": crash, "llm": llm, "ticks": ticks, "gated": gated, "bulk": bulk, "twins": twins}


async def _log_sent(request: Any) -> None:
    """CAPTURE=1: one line per request the SDK sends, with the exact bytes (to replay them)."""
    log("sent", method=request.method, path=request.url.raw_path.decode("ascii"),
        headers={k: v for k, v in request.headers.items() if k.lower().startswith("rebuno-")},
        body=request.content.decode("utf-8"))


if os.environ.get("CAPTURE") == "1":
    agent._http.event_hooks["request"].append(_log_sent)


class WebhookLog:
    """ASGI wrapper recording each webhook delivery (body and the delivering replica)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/webhook":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        status: list[int] = []

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, recording_receive, recording_send)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        log("webhook", body=json.loads(b"".join(chunks) or b"null"), status=status[0] if status else None,
            user_agent=headers.get("user-agent", ""), at=time.time())


def main() -> None:
    agent.bind(HANDLERS[MODE])
    server = uvicorn.Server(uvicorn.Config(WebhookLog(agent.app), host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    # uvicorn re-raises SIGTERM after its graceful shutdown; with this handler in place the
    # process then exits 0, so a test can tell a clean exit from a crash.
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
