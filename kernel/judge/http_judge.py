"""Asking a judge over HTTP, bounded: a timeout, a concurrency limit and a circuit breaker.

The call is made on the event loop (httpx.AsyncClient), never on the lane thread that runs the
use cases and never inside a store transaction: the step's submit is decided in two passes around
it (kernel.core.steps.JudgeNeeded). Every failure becomes a `JudgeAnswer.unavailable`, which the
rule's `fallback` then decides; nothing here raises to the caller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from kernel.domain import JudgeAnswer, JudgeSpec, PolicyInput
from kernel.ids import whole_number
from kernel.judge.provider import JudgeProvider
from kernel.judge.template import TemplateError

__all__ = ["CRITERIA", "QUESTION", "Breaker", "HttpJudge", "JudgeLimits"]

log = logging.getLogger("regent.judge")

# The question and criteria upstream sends (rebuno internal/policy/judge.go), so a provider
# template written for Rebuno asks the model the same thing.
QUESTION = "Should `tool_call` run automatically, be blocked, or wait for a human to approve it?"
CRITERIA = {
    "allow": "Safe to run unattended: a routine action whose effects are easy to undo or minor if unwanted.",
    "deny": "Harmful in any context: destroys data, exposes secrets, or runs untrusted code.",
    "require_approval": "Possibly fine, but consequential or hard to undo, so a human should confirm.",
}
MAX_ANSWER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class JudgeLimits:
    timeout_seconds: float = 5.0
    concurrency: int = 8  # judge calls in flight at once, per kernel process
    max_request_bytes: int = 256 * 1024
    breaker_failures: int = 5  # consecutive failures that open the circuit
    breaker_reset_seconds: float = 30.0  # how long it stays open before one trial call


class Breaker:
    """Closed → open after N consecutive failures; open fails fast; after the reset period one
    trial call is let through (half-open): success closes it, failure opens it again."""

    def __init__(self, failures: int, reset_seconds: float, clock: Callable[[], float] = time.monotonic):
        self._limit, self._reset, self._clock = failures, reset_seconds, clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial = False

    def allow(self) -> bool:
        if self._opened_at is None:
            return True
        if not self._trial and self._clock() - self._opened_at >= self._reset:
            self._trial = True
            return True
        return False

    def success(self) -> None:
        self._failures, self._opened_at, self._trial = 0, None, False

    def failure(self) -> None:
        self._failures += 1
        if self._trial or self._failures >= self._limit:
            self._opened_at, self._trial = self._clock(), False

    @property
    def open(self) -> bool:
        return self._opened_at is not None


def tool_call(inp: PolicyInput, mask: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """What the judge is told about the step (upstream's ToolCall), with masked arguments."""
    args = mask(inp.args) if mask is not None else inp.args
    return {"agent_id": inp.agent_id, "tool": inp.target, "arguments": args}


class HttpJudge:
    """The configured judges: a deployment default and optional per-agent providers."""

    def __init__(
        self,
        default: JudgeProvider | None,
        per_agent: Mapping[str, JudgeProvider] | None = None,
        limits: JudgeLimits = JudgeLimits(),
        mask: Callable[[Any], Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._default = default
        self._per_agent = dict(per_agent or {})
        self._limits = limits
        self._mask = mask
        self._transport = transport
        self._breakers: dict[str, Breaker] = {}
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    def provider_for(self, agent_id: str) -> JudgeProvider | None:
        return self._per_agent.get(agent_id, self._default)

    def _breaker(self, url: str) -> Breaker:
        b = self._breakers.get(url)
        if b is None:
            b = self._breakers[url] = Breaker(self._limits.breaker_failures, self._limits.breaker_reset_seconds)
        return b

    async def ask(self, spec: JudgeSpec, inp: PolicyInput) -> JudgeAnswer:
        provider = self.provider_for(inp.agent_id)
        if provider is None:
            return JudgeAnswer.not_configured()
        request = {"tool_call": tool_call(inp, self._mask), "instructions": spec.instructions}
        try:
            body = provider.body.render(
                {"ToolCall": request["tool_call"], "Question": QUESTION, "Criteria": CRITERIA,
                 "Instructions": spec.instructions},
                self._limits.max_request_bytes,
            )
        except TemplateError as exc:
            return JudgeAnswer.unavailable(str(exc), request=request)
        breaker = self._breaker(provider.url)
        if not breaker.allow():
            return JudgeAnswer.unavailable("circuit open after repeated failures", request=request)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._limits.concurrency)
        started = time.perf_counter()
        timeout = provider.timeout_seconds or self._limits.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                async with self._slots:
                    probs = await self._post(provider, body)
        except TimeoutError:
            error = f"timeout after {timeout:g}s"
        except _BadAnswer as exc:
            error = str(exc)
        except httpx.HTTPError as exc:
            error = _describe(exc)
        else:
            breaker.success()
            return JudgeAnswer(probabilities=probs, latency_ms=_ms(started), request=request)
        breaker.failure()
        log.warning("judge %s unavailable: %s", provider.url, error)
        return JudgeAnswer.unavailable(error, latency_ms=_ms(started), request=request)

    async def _post(self, provider: JudgeProvider, body: str) -> dict[str, float]:
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, follow_redirects=False,
                                             timeout=None, trust_env=False)
        headers = {"Content-Type": "application/json", **provider.headers}
        async with self._client.stream("POST", provider.url, content=body.encode(), headers=headers) as r:
            if r.status_code != 200:
                raise _BadAnswer(f"judge returned {r.status_code}")
            raw = bytearray()
            async for chunk in r.aiter_bytes():
                raw += chunk
                if len(raw) > MAX_ANSWER_BYTES:
                    raise _BadAnswer("judge answer larger than 1 MiB")
        return probabilities(bytes(raw), provider.probabilities)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class _BadAnswer(Exception):
    pass


def probabilities(raw: bytes, path: tuple[str, ...]) -> dict[str, float]:
    """The probabilities object at `path` in a JSON answer (as upstream: numbers only)."""
    try:
        out: Any = json.loads(raw)
    except ValueError:
        raise _BadAnswer("judge answer is not JSON") from None
    where = ".".join(path)
    for key in path:
        if isinstance(out, dict):
            out = out.get(key)
        elif isinstance(out, list) and (i := whole_number(key, len(out) - 1)) is not None:
            out = out[i]
        else:
            raise _BadAnswer(f"judge response has no {where}")
    probs = {k: float(v) for k, v in out.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)} if isinstance(out, dict) else {}
    if not probs:
        raise _BadAnswer(f"judge response has no probabilities at {where}")
    return probs


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}" if str(exc) else "cannot connect"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
