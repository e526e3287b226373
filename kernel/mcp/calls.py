"""tools/call as a `tool_call` step: submit under the session's lease, then act on the decision
(proceed → call upstream and record; replay; denied; blocked → wait for the approver with
progress; rate limited), as rebuno-v0 §2 and the SDK's `wrap_mcp_tools` do it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
from mcp import types

from kernel.gateway.kernel_client import Lease
from kernel.identity import args_hash
from kernel.lane import long_lived, off_loop
from kernel.manifest_mcp import McpAgent
from kernel.mcp.catalog import Entry, Metrics
from kernel.mcp.leases import Reply, Slot
from kernel.mcp.upstream import UpstreamError

log = logging.getLogger("regent.mcp")

Progress = Callable[[float, float, str], Awaitable[None]]
_SUPERSEDED_RETRIES = 3
_PROGRESS_EVERY = 1.0  # seconds between progress notifications while a call waits


def refusal_message(decision: str, reason: str = "") -> str:
    """rebuno.errors.refusal_message: what `rebuno.raise_for_refusal` parses back."""
    return f"rebuno_refusal: {decision}" + (f" reason={reason}" if reason else "")


def flatten(result: types.CallToolResult) -> Any:
    """rebuno.mcp._default_flatten: structured content, else the text blocks (one → the string,
    several → joined by newlines; a non-text block as its str())."""
    if result.structuredContent is not None:
        return result.structuredContent
    texts = [b.text if isinstance(b, types.TextContent) else str(b) for b in result.content]
    return texts[0] if len(texts) == 1 else "\n".join(texts)


def from_record(value: Any, is_error: bool = False) -> types.CallToolResult:
    """A recorded (flattened) value back as a tool result: a string as one text block, an object
    as structured content with its JSON as the text."""
    if isinstance(value, str):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)], isError=is_error)
    text = json.dumps(value, ensure_ascii=False)
    structured = value if isinstance(value, dict) and not is_error else None
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structuredContent=structured, isError=is_error)


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("reason") or json.dumps(error))
    return str(error)


@dataclass
class Call:
    """One tools/call: its identity for occurrence counting, and the occurrence it was recorded
    at once the kernel has answered with a step."""

    entry: Entry
    args: dict[str, Any]
    idempotency: str
    key: tuple[str, str]
    occurrence: int | None = None


class Caller:
    def __init__(self, agent_id: str, cfg: McpAgent, metrics: Metrics):
        self.agent_id, self.cfg, self.metrics = agent_id, cfg, metrics

    def count(self, call: Call, decision: str) -> None:
        self.metrics.calls.labels(self.agent_id, call.entry.upstream.spec.prefix, decision).inc()

    def new_call(self, entry: Entry, args: dict[str, Any], slot: Slot) -> Call:
        from fnmatch import fnmatchcase

        idem = "at_most_once" if any(fnmatchcase(entry.name, g) for g in self.cfg.at_most_once) else "safe_to_retry"
        key = (entry.name, args_hash(json.dumps(args, ensure_ascii=False).encode("utf-8")))
        call = Call(entry, args, idem, key)
        pending = slot.unanswered.get(key)
        if pending:  # a call answered "pending approval" before: this retry is that step
            call.occurrence = pending.pop(0)
        return call

    async def _submit(self, slot: Slot, lease: Lease, call: Call) -> Reply:
        """Submit `call` at its occurrence: first replay the earlier occurrences this dispatch has
        not seen (the kernel counts occurrences per dispatch, from 0 at each delivery)."""
        target = call.occurrence if call.occurrence is not None else slot.total[call.key]
        for _ in range(max(0, target - slot.in_dispatch[call.key])):
            r = await slot.link.submit(lease, call.entry.name, call.args, call.idempotency)
            if r.status_code != 200:
                return r
            if "step_id" not in r.json():
                return r
            slot.in_dispatch[call.key] += 1
        r = await slot.link.submit(lease, call.entry.name, call.args, call.idempotency)
        if r.status_code == 200 and "step_id" in r.json():
            slot.in_dispatch[call.key] += 1
            if call.occurrence is None:
                call.occurrence = slot.total[call.key]
                slot.total[call.key] += 1
        return r

    async def run(self, slot: Slot, call: Call, progress: Progress | None) -> types.CallToolResult:
        started = time.monotonic()
        approval_deadline = started + self.cfg.approval_wait_seconds
        superseded = 0
        newer_than = -1
        approval_id = ""
        while True:
            async with slot.submit_lock:
                if slot.pending:
                    await asyncio.gather(*slot.pending, return_exceptions=True)
                lease = await slot.wait_lease(self.cfg.lease_wait_seconds, newer_than)
                if lease is None:
                    break
                try:
                    r = await self._submit(slot, lease, call)
                except httpx.HTTPError as e:
                    self.count(call, "kernel_error")
                    return error_result(f"regent: the kernel is unreachable ({type(e).__name__}); retry the call")
            if r.status_code == 409 and _code(r) == "lease_superseded" and superseded < _SUPERSEDED_RETRIES:
                superseded += 1
                slot.drop(lease)
                newer_than = slot.generation
                continue
            if r.status_code != 200:
                self.count(call, "kernel_error")
                return error_result(f"regent: the kernel refused the step ({r.status_code} {_code(r)}): "
                                    f"{_message(r)}")
            dec = r.json()
            decision = dec.get("decision", "")
            reason = str(dec.get("reason") or "")
            if decision == "proceed":
                self.count(call, "proceed")
                return await self._proceed(slot, lease, call, dec["step_id"])
            if decision == "replay":
                self.count(call, "replay")
                if dec.get("error") is not None:
                    return from_record(_error_text(dec["error"]), is_error=True)
                return from_record(dec.get("result"))
            if decision == "denied":
                self.count(call, "denied")
                return error_result(refusal_message("denied", reason or "policy_denied"))
            if decision == "rate_limited":
                self.count(call, "rate_limited")
                return error_result(refusal_message("rate_limited", reason or "rate_limit_exceeded")
                                    + "; retry the call later (the rule's window refills the bucket)")
            if decision == "execution_terminal":
                self.count(call, "execution_terminal")
                slot.ended = True
                return error_result(refusal_message("execution_terminal")
                                    + "; this session's execution has ended: open a new session")
            if decision in ("blocked", "execution_blocked"):
                # The kernel released our lease (rebuno-v0 §5.1, §2.1 park); a decision, a refill
                # or an expiry queues a new dispatch, and the resubmission answers it.
                approval_id = str(dec.get("approval_id") or approval_id)
                slot.drop(lease)
                newer_than = slot.generation
                waited = await self._wait(slot, newer_than, approval_deadline, approval_id, reason, progress)
                if waited:
                    continue
                if approval_id:
                    self.count(call, "pending")
                    if call.occurrence is not None:
                        slot.unanswered.setdefault(call.key, []).append(call.occurrence)
                    return error_result(refusal_message("blocked", "approval_pending")
                                        + f"; approval {approval_id} is pending: retry this call once an "
                                        "approver has decided")
                self.count(call, "rate_limited")
                return error_result(refusal_message("rate_limited", reason or "rate_limit_exceeded")
                                    + "; retry the call later")
            self.count(call, "kernel_error")
            return error_result(f"regent: unexpected decision {decision!r}")
        self.count(call, "no_lease")
        return error_result("regent: the kernel has not delivered this session's execution to the gateway "
                            f"within {self.cfg.lease_wait_seconds:g}s; retry the call")

    async def _wait(self, slot: Slot, newer_than: int, deadline: float, approval_id: str, reason: str,
                    progress: Progress | None) -> bool:
        """Wait for the next delivery until `deadline`, sending progress on the way. Meanwhile the
        call's request only waits: in the kernel's process (`regent serve --mcp`) it must not keep
        other agents' lone step calls off the event loop (kernel/lane.py `long_lived`; a no-op in
        a separate gateway's process)."""
        with long_lived():
            return await self._waiting(slot, newer_than, deadline, approval_id, reason, progress)

    async def _waiting(self, slot: Slot, newer_than: int, deadline: float, approval_id: str, reason: str,
                       progress: Progress | None) -> bool:
        what = f"approval {approval_id}" if approval_id else f"the rate limit ({reason or 'parked'})"
        start = time.monotonic()
        total = max(0.0, deadline - start)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if progress is not None:
                try:
                    await progress(time.monotonic() - start, total, f"waiting for {what}")
                except Exception:  # a client that went away: keep waiting for the bound anyway
                    progress = None
            if await slot.wait_lease(min(left, _PROGRESS_EVERY), newer_than) is not None:
                return True
            if slot.ended:
                return False

    async def _proceed(self, slot: Slot, lease: Lease, call: Call, step_id: str) -> types.CallToolResult:
        up = call.entry.upstream
        try:
            result = await up.call(call.entry.tool.name, call.args)
        except UpstreamError as e:
            self.metrics.upstream_errors.labels(self.agent_id, up.spec.prefix, e.kind).inc()
            await self._record(slot.link.fail_step(lease, step_id, {"message": str(e), "reason": f"upstream_{e.kind}"}))
            return error_result(f"regent: {e}")
        value = flatten(result)
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        if size > self.cfg.max_result_bytes:
            self.metrics.upstream_errors.labels(self.agent_id, up.spec.prefix, "oversized").inc()
            message = f"the upstream's result is {size} bytes, over the gateway's {self.cfg.max_result_bytes}"
            await self._record(slot.link.fail_step(lease, step_id, {"message": message, "reason": "result_too_large"}))
            return error_result(f"regent: {message}")
        if result.isError:
            # The tool reported a failure: the step fails with its text, so a replay says so too.
            await self._record_soon(slot, slot.link.fail_step(lease, step_id, {"message": _error_text(value),
                                                                                "is_error": True}))
        else:
            await self._record_soon(slot, slot.link.complete_step(lease, step_id, value))
        return result

    async def _record_soon(self, slot: Slot, request: Coroutine[Any, Any, Reply]) -> None:
        """Record an upstream answer while it goes back to the client (unless the manifest says
        `record_before_answer`). The session's next submission waits for it, so the timeline keeps
        the calls' order. Why not first: the record is half a step round trip: waiting for it, the
        gateway added 2.09 plain round trips to a direct call at p50 on SQLite; recording while
        answering, 1.44-1.71 (bench/mcp.py, a loaded 2-CPU machine). What is given up is narrow
        (docs/mcp.md, "When the result is recorded")."""
        task = asyncio.get_running_loop().create_task(
            self._record(request) if self.cfg.record_before_answer else self._record_aside(request))
        slot.pending.add(task)
        task.add_done_callback(slot.pending.discard)
        if self.cfg.record_before_answer:
            await task

    @classmethod
    async def _record_aside(cls, request: Awaitable[Reply]) -> None:
        """`_record` while the answer goes back: in the kernel's process, on the lane even when
        the kernel is idle, not on the event loop the answer needs (kernel/lane.py `off_loop`)."""
        off_loop()
        await cls._record(request)

    @staticmethod
    async def _record(request: Awaitable[Reply]) -> None:
        try:
            r = await request
        except httpx.HTTPError as e:
            log.warning("recording a step outcome failed: %s", type(e).__name__)
            return
        if r.status_code >= 300:
            log.warning("recording a step outcome was refused: %s %s", r.status_code, _code(r))


def _code(r: Reply) -> str:
    try:
        body = r.json()
    except ValueError:
        return ""
    return str(body.get("code", "")) if isinstance(body, dict) else ""


def _message(r: Reply) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:300]
    return str(body.get("message", ""))[:300] if isinstance(body, dict) else r.text[:300]
