"""Test helpers: a real uvicorn server on loopback, and a signing agent client written from the
spec (an oracle independent of kernel.signing)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """uvicorn serving an app on 127.0.0.1 in a background thread."""

    def __init__(self, app: Any):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def sign(secret: str, method: str, target: str, ts: str, dispatch_id: str, attempt: str, body: bytes) -> str:
    msg = f"rebuno-request-v1\n{method}\n{target}\n{ts}\n{dispatch_id}\n{attempt}\n".encode() + body
    return "v1=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


class AgentClient:
    """Signs every request the way the official SDK does (sdk-contract.md)."""

    def __init__(self, base_url: str, agent_id: str, secret: str):
        self.http = httpx.Client(base_url=base_url, timeout=30)
        self.agent_id = agent_id
        self.secret = secret
        self.dispatch_id = ""
        self.attempt = ""

    def lease(self, dispatch_id: str, attempt: int) -> AgentClient:
        self.dispatch_id, self.attempt = dispatch_id, str(attempt)
        return self

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                ts: int | None = None, headers: dict[str, str] | None = None, lease: bool = True) -> httpx.Response:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        stamp = str(ts if ts is not None else int(time.time()))
        did, att = (self.dispatch_id, self.attempt) if lease else ("", "")
        h = {
            "Rebuno-Agent-Id": self.agent_id,
            "Rebuno-Timestamp": stamp,
            "Rebuno-Signature": sign(self.secret, method, path, stamp, did, att, data),
            "Content-Type": "application/json",
        }
        if did:
            h["Rebuno-Dispatch-Id"] = did
        if att:
            h["Rebuno-Dispatch-Attempt"] = att
        h.update(headers or {})
        return self.http.request(method, path, content=data, headers=h)

    def submit(self, execution_id: str, target: str, args: Any = None, *, kind: str = "tool_call",
               idempotency: str = "safe_to_retry") -> httpx.Response:
        return self.request("POST", f"/v0/executions/{execution_id}/steps",
                            {"kind": kind, "target": target, "args": args, "idempotency": idempotency,
                             "resources": []})

    def complete_step(self, execution_id: str, step_id: str, result: Any, *, ts: int | None = None) -> httpx.Response:
        return self.request("POST", f"/v0/executions/{execution_id}/steps/{step_id}/complete", {"result": result},
                            ts=ts)

    def fail_step(self, execution_id: str, step_id: str, error: Any) -> httpx.Response:
        return self.request("POST", f"/v0/executions/{execution_id}/steps/{step_id}/fail", {"error": error})

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_until(predicate: Any, what: str, timeout: float = 10.0, every: float = 0.005) -> Any:
    """Poll `predicate` until it is truthy (and return it), or fail after `timeout` seconds: the
    tests wait for a state they can observe, never a fixed time."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return value


async def until(predicate: Any, what: str, timeout: float = 10.0, every: float = 0.001) -> Any:
    """`wait_until` for a coroutine: polls without blocking the event loop."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)
    return value
