"""The gateway's side of dispatch: the kernel delivers each MCP session's execution to the
gateway's webhook; the gateway keeps the lease, heartbeats it, and hands it to the calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from kernel.gateway.kernel_client import Lease, post_signed, signed_post
from kernel.mcp.kernel_http import KernelHttp
from kernel.signing import sign_request

log = logging.getLogger("regent.mcp")


class Reply(Protocol):
    """What the gateway reads of the kernel's answer: an `httpx.Response`, or the in-kernel
    gateway's answer made without HTTP (kernel/mcp/inkernel.py)."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


class AgentLink:
    """Signed calls into the kernel as one agent (the official SDK's headers), and the client
    calls the gateway makes with a bearer (creating and ending executions)."""

    def __init__(self, http: httpx.AsyncClient, agent_id: str, secret: str, kernel_token: str | None):
        self.http, self.agent_id, self.secret, self.kernel_token = http, agent_id, secret, kernel_token
        # The signed step calls' own client, when the kernel is plain http:// (kernel/mcp/kernel_http.py;
        # set by `Gateways`, shared by its links); None: httpx.
        self.lean: KernelHttp | None = None

    def lease(self, execution_id: str, dispatch_id: str, attempt: int) -> Lease:
        return Lease(execution_id, dispatch_id, str(attempt), self.agent_id, self.secret)

    async def signed(self, lease: Lease, path: str, payload: Any) -> Reply:
        if self.lean is None:
            return await post_signed(self.http, lease, path, payload)
        return await self.lean.post(path, *signed_post(lease, path, payload))

    async def submit(self, lease: Lease, target: str, args: Any, idempotency: str, kind: str = "tool_call") -> Reply:
        return await self.signed(lease, f"/v0/executions/{lease.execution_id}/steps",
                                 {"kind": kind, "target": target, "args": args, "idempotency": idempotency})

    async def complete_step(self, lease: Lease, step_id: str, result: Any) -> Reply:
        return await self.signed(lease, f"/v0/executions/{lease.execution_id}/steps/{step_id}/complete",
                                 {"result": result})

    async def fail_step(self, lease: Lease, step_id: str, error: Any) -> Reply:
        return await self.signed(lease, f"/v0/executions/{lease.execution_id}/steps/{step_id}/fail",
                                 {"error": error})

    async def heartbeat(self, lease: Lease) -> Reply:
        return await self.signed(lease, f"/v0/executions/{lease.execution_id}/heartbeat", {})

    async def complete_execution(self, lease: Lease, output: Any) -> Reply:
        return await self.signed(lease, f"/v0/executions/{lease.execution_id}/complete", {"output": output})

    async def report_tools(self, report: Any) -> httpx.Response:
        """The tools the agent's upstreams offer (docs/mcp.md, "Pinned tool definitions"), signed
        as the agent outside any dispatch; the kernel answers the approved definitions."""
        path = f"/v0/mcp/{self.agent_id}/tools"
        body = json.dumps(report).encode("utf-8")
        stamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "Rebuno-Agent-Id": self.agent_id, "Rebuno-Timestamp": stamp,
                   "Rebuno-Signature": sign_request(self.secret, "POST", path, stamp, body=body)}
        return await self.http.post(path, content=body, headers=headers, timeout=10.0)

    async def create_execution(self, token: str | None, input: Any, idempotency_key: str | None) -> httpx.Response:
        body: dict[str, Any] = {"agent_id": self.agent_id, "input": input}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        bearer = token or self.kernel_token
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        return await self.http.post("/v0/executions", json=body, headers=headers)


@dataclass
class Slot:
    """One execution as the gateway sees it: the live lease (None while the kernel holds none for
    us: before the first delivery, after an approval block or a rate-limit park), how many
    sessions use it, and the occurrences submitted (so a resubmission after a new dispatch lands
    on the same step: the kernel counts occurrences per dispatch)."""

    execution_id: str
    link: AgentLink
    lease: Lease | None = None
    lease_seconds: float = 120.0
    generation: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    attached: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    resume_seconds: float = 0.0
    total: Counter[tuple[str, str]] = field(default_factory=Counter)  # (target, args_hash) -> occurrences so far
    in_dispatch: Counter[tuple[str, str]] = field(default_factory=Counter)  # … under the current lease
    unanswered: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # answered "pending approval"
    submit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: set[asyncio.Task[None]] = field(default_factory=set)  # step outcomes being recorded
    heartbeat: asyncio.Task[None] | None = None
    ended: bool = False

    def offer(self, lease: Lease, lease_seconds: float) -> None:
        if self.lease is not None and self.lease.dispatch_id == lease.dispatch_id \
                and self.lease.dispatch_attempt == lease.dispatch_attempt:
            return  # the same delivery again (at least once)
        self.lease, self.lease_seconds = lease, lease_seconds
        self.generation += 1
        self.in_dispatch = Counter()
        self.changed.set()
        self.changed = asyncio.Event()

    def drop(self, lease: Lease) -> None:
        if self.lease == lease:
            self.lease = None

    async def wait_lease(self, timeout: float, newer_than: int = -1) -> Lease | None:
        deadline = time.monotonic() + timeout
        while self.lease is None or self.generation <= newer_than:
            if self.ended:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return self.lease


class LeaseBook:
    """Every execution this gateway process has been delivered or has created, by id."""

    def __init__(self) -> None:
        self.slots: dict[str, Slot] = {}
        self._janitor: asyncio.Task[None] | None = None

    def slot(self, execution_id: str, link: AgentLink) -> Slot:
        s = self.slots.get(execution_id)
        if s is None:
            s = self.slots[execution_id] = Slot(execution_id, link)
        return s

    def deliver(self, link: AgentLink, execution_id: str, dispatch_id: str, attempt: int, lease_seconds: float) -> None:
        s = self.slot(execution_id, link)
        if s.ended:
            return
        s.offer(link.lease(execution_id, dispatch_id, attempt), lease_seconds)
        if s.heartbeat is None or s.heartbeat.done():
            s.heartbeat = asyncio.get_running_loop().create_task(self._beat(s))
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.get_running_loop().create_task(self._sweep())

    async def _beat(self, s: Slot) -> None:
        """Renew the lease a third of the way through its period until it is gone."""
        while not s.ended and s.lease is not None:
            await asyncio.sleep(max(0.5, s.lease_seconds / 3))
            lease = s.lease
            if lease is None or s.ended:
                return
            try:
                r = await s.link.heartbeat(lease)
            except httpx.HTTPError as e:
                log.warning("heartbeat for %s failed: %s", s.execution_id, type(e).__name__)
                continue
            if r.status_code == 409:
                s.drop(lease)
                return

    async def end(self, s: Slot, output: Any) -> None:
        """Complete the execution (its session is over), if we hold a lease for it."""
        if s.ended:
            return
        s.ended = True
        s.changed.set()
        if s.pending:
            await asyncio.gather(*s.pending, return_exceptions=True)
        lease = s.lease
        if lease is not None:
            with contextlib.suppress(httpx.HTTPError):
                await s.link.complete_execution(lease, output)
        if s.heartbeat is not None:
            s.heartbeat.cancel()
        self.slots.pop(s.execution_id, None)

    async def _sweep(self) -> None:
        """End executions no session has used for their resume window (orphans of a restart too)."""
        while self.slots:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for s in list(self.slots.values()):
                if s.attached == 0 and s.lease is not None and now - s.idle_since > max(s.resume_seconds, 60.0):
                    await self.end(s, {"mcp": "session ended"})

    async def close(self) -> None:
        for s in list(self.slots.values()):
            if s.heartbeat is not None:
                s.heartbeat.cancel()
        if self._janitor is not None:
            self._janitor.cancel()
