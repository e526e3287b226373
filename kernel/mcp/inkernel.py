"""`regent serve --mcp`: the MCP gateway served by the kernel's own process, under /mcp-gateway.

The same gateway as `regent mcp serve` (sessions, leases, pins, approvals, replay), with one
difference: a call's step is submitted and recorded through the kernel's agent-route code in this
process (`kernel.api.routes.agent.submit`/`outcome`, the code the signed routes run after their
signature check), not over signed HTTP. Deliveries still arrive at the gateway's webhook, and
sessions are still created through the kernel's HTTP API (once per session, not per call).

Why: a tools/call through a separate gateway spends two signed HTTP requests on its step — the
gateway's client side and the kernel's server side of each — on top of the MCP hop it cannot
avoid; in one process the step costs what a step costs (bench/mcp.py measures both modes).
What is given up: the gateway shares the kernel's CPU and its fate (a kernel restart is a gateway
restart; the kernel re-delivers the sessions' executions when it is back, as after a gateway crash).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kernel.domain import Lease as KernelLease
from kernel.errors import CODE_TO_STATUS, RegentError
from kernel.gateway.kernel_client import Lease
from kernel.lane import long_lived
from kernel.manifest import Manifest
from kernel.mcp.app import Gateways
from kernel.mcp.leases import AgentLink

log = logging.getLogger("regent.mcp")

PREFIX = "/mcp-gateway"


@dataclass(frozen=True, slots=True)
class Answer:
    """The kernel's answer as the gateway reads an HTTP one (`kernel.mcp.leases.Reply`)."""

    status_code: int
    body: Any

    @property
    def text(self) -> str:
        return json.dumps(self.body)

    def json(self) -> Any:
        return self.body


LeaseOf = Callable[[], KernelLease]
Submit = Callable[[LeaseOf, bytes], Awaitable[Any]]
Outcome = Callable[[LeaseOf, str, bytes, bool], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Host:
    """What the in-kernel links call, handed in by the server's wiring (kernel/bootstrap.py) so
    this room imports nothing of the API: the agent routes' work after their signature check
    (`kernel.api.routes.agent.submit`/`outcome`, bound to the kernel and the API's metrics)."""

    submit: Submit  # (the lease, body) -> the decision
    outcome: Outcome  # (the lease, step, body, failed) -> the answer


class CoreLink(AgentLink):
    """An agent's link whose step calls run the agent routes' code in this process. The body is
    the JSON the signed request would carry, parsed by the same code, so a step's arguments, its
    hash and its id are what they would be over HTTP."""

    def __init__(self, http: httpx.AsyncClient, agent_id: str, secret: str, kernel_token: str | None, host: Host):
        super().__init__(http, agent_id, secret, kernel_token)
        self.host = host

    async def submit(self, lease: Lease, target: str, args: Any, idempotency: str, kind: str = "tool_call") -> Answer:
        raw = _body({"kind": kind, "target": target, "args": args, "idempotency": idempotency})
        return await self._answer(lambda: self.host.submit(_held(lease), raw))

    async def complete_step(self, lease: Lease, step_id: str, result: Any) -> Answer:
        return await self._outcome(lease, step_id, {"result": result}, failed=False)

    async def fail_step(self, lease: Lease, step_id: str, error: Any) -> Answer:
        return await self._outcome(lease, step_id, {"error": error}, failed=True)

    async def _outcome(self, lease: Lease, step_id: str, payload: Any, failed: bool) -> Answer:
        raw = _body(payload)
        return await self._answer(lambda: self.host.outcome(_held(lease), step_id, raw, failed))

    async def _answer(self, call: Callable[[], Awaitable[Any]]) -> Answer:
        """The answer, or the error envelope the route would have answered with."""
        try:
            answer = await call()
        except RegentError as e:
            return Answer(CODE_TO_STATUS.get(e.code, 500), {"code": e.code, "message": e.message})
        except Exception:
            log.exception("in-kernel MCP step call failed")
            return Answer(500, {"code": "internal_error", "message": "internal error"})
        return Answer(200, answer.to_json())


def _held(lease: Lease) -> LeaseOf:
    """The lease as the routes read it from the dispatch headers: the ids the kernel delivered."""
    return lambda: KernelLease(lease.agent_id, lease.execution_id, lease.dispatch_id, int(lease.dispatch_attempt))


def _body(payload: Any) -> bytes:
    return json.dumps(payload).encode("utf-8")


class _Waiting:
    """The mounted gateway, with each MCP client's GET stream counted as held open (kernel/lane.py
    `long_lived`). An MCP client keeps that stream open for the whole session, so without this the
    kernel is never idle: the MCP call's own submit and outcome, and every lone step of any other
    agent, went to the lane thread instead of running on the event loop (`call_hot`), and the
    plain step round trip in this mode was 4.28 ms against 3.76 ms beside a separate gateway
    (bench/journal/2026-12-05-mcp-gateway.md). A POST in flight is the caller's own request."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "GET" and "/mcp/" in scope.get("path", ""):
            with long_lived():
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def mount(app: Any, host: Host, manifest: Manifest, *, kernel_url: str, kernel_token: str | None,
          pins_path: Path | None) -> Callable[[Any], Awaitable[Any]]:
    """Mount the gateway of every agent with an `mcp:` section on the kernel's app, under
    /mcp-gateway; returns the lifespan hook that runs it (kernel/api/app.py `lifespan_hooks`)."""
    gws = Gateways(manifest, kernel_url, kernel_token=kernel_token, pins_path=pins_path, link=CoreLink,
                   link_args=(host,))
    app.mount_ahead(PREFIX, _Waiting(gws.app(lifespan=False)))  # kernel/api/hot.py: past its middleware stack

    async def hook(_app: Any) -> Callable[[], Awaitable[None]]:
        running: AbstractAsyncContextManager[None] = gws.running()
        await running.__aenter__()

        async def stop() -> None:
            await running.__aexit__(None, None, None)

        return stop

    return hook
