"""The gateway's signed calls into the kernel, made under the caller's dispatch lease."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from kernel.signing import sign_request


@dataclass(frozen=True, slots=True)
class Lease:
    execution_id: str
    dispatch_id: str
    dispatch_attempt: str
    agent_id: str
    agent_secret: str


def signed_post(lease: Lease, path: str, payload: Any) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a POST of `payload` to the kernel's agent route `path`, signed under
    `lease` as the official SDK signs."""
    body = json.dumps(payload).encode("utf-8")
    stamp = str(int(time.time()))
    return body, {
        "Content-Type": "application/json",
        "Rebuno-Agent-Id": lease.agent_id,
        "Rebuno-Timestamp": stamp,
        "Rebuno-Dispatch-Id": lease.dispatch_id,
        "Rebuno-Dispatch-Attempt": lease.dispatch_attempt,
        "Rebuno-Signature": sign_request(lease.agent_secret, "POST", path, stamp, lease.dispatch_id,
                                         lease.dispatch_attempt, body),
    }


async def post_signed(http: httpx.AsyncClient, lease: Lease, path: str, payload: Any) -> httpx.Response:
    """POST `payload` to the kernel's agent route `path`, signed under `lease` (`signed_post`)."""
    body, headers = signed_post(lease, path, payload)
    return await http.post(path, content=body, headers=headers)


class KernelClient:
    """Signs each request with the lease's agent secret, as the official SDK does."""

    def __init__(self, http: httpx.AsyncClient):
        self.http = http

    async def send(self, lease: Lease, path: str, payload: Any) -> httpx.Response:
        return await post_signed(self.http, lease, path, payload)

    async def submit(self, lease: Lease, model: str, body: Any) -> httpx.Response:
        return await self.send(lease, f"/v0/executions/{lease.execution_id}/steps",
                               {"kind": "llm_call", "target": model, "args": body,
                                "idempotency": "safe_to_retry", "resources": []})

    async def complete(self, lease: Lease, step_id: str, record: Any) -> httpx.Response:
        return await self.send(lease, f"/v0/executions/{lease.execution_id}/steps/{step_id}/complete",
                               {"result": record})

    async def fail(self, lease: Lease, step_id: str, error: Any) -> httpx.Response:
        return await self.send(lease, f"/v0/executions/{lease.execution_id}/steps/{step_id}/fail",
                               {"error": error})

    async def delta(self, lease: Lease, step_id: str, seq: int, data: str) -> httpx.Response:
        return await self.send(lease, f"/v0/executions/{lease.execution_id}/steps/{step_id}/stream",
                               {"seq": seq, "data": data})
