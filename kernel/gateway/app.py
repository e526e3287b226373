"""The gateway's FastAPI app: every JSON POST under /v1 becomes an `llm_call` step (rebuno-v0 LLM calls)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kernel.gateway.kernel_client import KernelClient, Lease
from kernel.ids import whole_number

log = logging.getLogger("regent.gateway")

LEASE_HEADERS = {
    "execution_id": "x-rebuno-execution-id",
    "dispatch_id": "x-rebuno-dispatch-id",
    "dispatch_attempt": "x-rebuno-dispatch-attempt",
    "agent_id": "x-rebuno-agent-id",
    "agent_secret": "x-rebuno-agent-secret",
}
# Never forwarded upstream: our lease headers, and headers httpx recomputes for the new request.
_DROP = frozenset({*LEASE_HEADERS.values(), "host", "content-length", "connection", "keep-alive",
                   "transfer-encoding", "te", "upgrade", "proxy-authorization", "accept-encoding"})
# The status and SDK decision name each kernel refusal is returned as (rebuno SDK http_client._REFUSALS).
_REFUSAL_STATUS = {"rate_limited": 429, "lease_superseded": 409}
_DELTA_MAX_CHARS = 1750  # the kernel caps a delta at 7000 bytes; UTF-8 runs to 4 bytes a char
_DELTA_QUEUE = 64  # deltas waiting to be published; a full queue drops, the caller never waits
_DELTA_FLUSH_CHARS = 2000


def openai_error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"type": type_, "message": message}}, status_code=status)


def refusal(decision: str, reason: str = "") -> JSONResponse:
    message = f"rebuno_refusal: {decision}" + (f" reason={reason}" if reason else "")
    return JSONResponse({"error": {"type": "rebuno_refusal", "message": message}},
                        status_code=_REFUSAL_STATUS.get(decision, 403))


def _lease(request: Request) -> Lease | JSONResponse:
    values = {}
    for field, name in LEASE_HEADERS.items():
        got = request.headers.getlist(name)
        if len(got) != 1 or not got[0].strip():
            return openai_error(400, f"missing or repeated lease header {name}")
        values[field] = got[0].strip()
    if whole_number(values["dispatch_attempt"]) is None:
        return openai_error(400, "x-rebuno-dispatch-attempt must be a positive integer")
    return Lease(**values)


def _is_event_stream(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


_NO_BODY = frozenset({204, 205, 304})  # statuses a response may not carry a body with


def _from_record(record: Any) -> Response:
    """Rebuild a recorded response (the SDK's {status, headers, body} record); streams re-stream.
    A result that is not such a record (an agent may have recorded the same step itself, with
    any JSON) is answered as it is, as JSON."""
    status = record.get("status", 200) if isinstance(record, dict) else None
    headers = (record.get("headers") or {}) if isinstance(record, dict) else None
    if (not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599
            or status in _NO_BODY or not isinstance(headers, dict)):
        return JSONResponse(record)
    content_type = str(headers.get("content-type", "application/json"))
    body = record.get("body", "")
    content = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode("utf-8")
    if _is_event_stream(content_type):
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(content), 4096):
                yield content[i:i + 4096]
        return StreamingResponse(chunks(), status_code=status, media_type=content_type)
    return Response(content, status_code=status, media_type=content_type)


class _DeltaPublisher:
    """Publishes stream deltas from a bounded queue on its own task: a slow kernel drops deltas,
    it never holds up the caller's stream."""

    def __init__(self, kernel: KernelClient, lease: Lease, step_id: str):
        self.kernel, self.lease, self.step_id = kernel, lease, step_id
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(_DELTA_QUEUE)
        self.seq = 0
        self.dropped = 0
        self.task = asyncio.create_task(self._run())

    def offer(self, text: str) -> None:
        for i in range(0, len(text), _DELTA_MAX_CHARS):
            try:
                self.queue.put_nowait(text[i:i + _DELTA_MAX_CHARS])
            except asyncio.QueueFull:
                self.dropped += 1

    async def _run(self) -> None:
        while (data := await self.queue.get()) is not None:
            with contextlib.suppress(Exception):  # best-effort by contract (rebuno-v0 §10)
                await self.kernel.delta(self.lease, self.step_id, self.seq, data)
            self.seq += 1

    async def close(self, timeout_seconds: float = 2.0) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout_seconds)
        except TimeoutError:
            self.task.cancel()


def create_gateway_app(upstream: str, kernel_url: str, *, max_body_bytes: int = 4 * 1024 * 1024,
                       upstream_timeout_seconds: float = 600.0, kernel_timeout_seconds: float = 30.0) -> FastAPI:
    """`upstream` replaces the `/v1` prefix: `https://api.openai.com/v1` for OpenAI."""
    base = upstream.rstrip("/")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with (httpx.AsyncClient(timeout=upstream_timeout_seconds) as up,
                    httpx.AsyncClient(base_url=kernel_url, timeout=kernel_timeout_seconds) as kc):
            app.state.upstream = up
            app.state.kernel = KernelClient(kc)
            yield

    app = FastAPI(title="regent gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/v1/{path:path}")
    async def proxy(path: str, request: Request) -> Response:
        lease = _lease(request)
        if isinstance(lease, JSONResponse):
            return lease
        declared = whole_number(request.headers.get("content-length"))
        if declared is not None and declared > max_body_bytes:
            return openai_error(413, f"request body is over {max_body_bytes} bytes")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > max_body_bytes:
                return openai_error(413, f"request body is over {max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return openai_error(400, "the gateway records JSON object bodies only")
        kernel: KernelClient = request.app.state.kernel
        try:
            sub = await kernel.submit(lease, str(body.get("model") or ""), body)
        except httpx.HTTPError as e:
            return openai_error(502, f"kernel unreachable: {type(e).__name__}", "rebuno_kernel_error")
        if sub.status_code >= 300:
            return _kernel_error(sub)
        dec = sub.json()
        decision = dec.get("decision", "")
        if decision == "replay":
            if dec.get("error") is not None:
                return openai_error(502, f"recorded call failed: {json.dumps(dec['error'])}", "rebuno_replayed_error")
            return _from_record(dec.get("result"))
        if decision != "proceed":
            return refusal(decision, str(dec.get("reason") or ""))
        step_id = dec["step_id"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        up: httpx.AsyncClient = request.app.state.upstream
        url = f"{base}/{path}"
        if request.url.query:
            url += "?" + request.url.query
        try:
            resp = await up.send(up.build_request("POST", url, content=bytes(raw), headers=headers), stream=True)
        except httpx.HTTPError as e:
            await _fail_quietly(kernel, lease, step_id, {"status": 502, "body": f"upstream: {type(e).__name__}"})
            return openai_error(502, f"upstream unreachable: {type(e).__name__}", "upstream_error")
        content_type = resp.headers.get("content-type", "application/json")
        if resp.status_code < 400 and (body.get("stream") is True or _is_event_stream(content_type)):
            return StreamingResponse(_tee(kernel, lease, step_id, resp, content_type),
                                     status_code=resp.status_code, media_type=content_type)
        try:
            await resp.aread()
        except httpx.HTTPError as e:
            await _fail_quietly(kernel, lease, step_id, {"status": 502, "body": f"upstream: {type(e).__name__}"})
            return openai_error(502, f"upstream read failed: {type(e).__name__}", "upstream_error")
        finally:
            await resp.aclose()
        if resp.status_code >= 400:
            await _fail_quietly(kernel, lease, step_id, {"status": resp.status_code, "body": resp.text})
            return Response(resp.content, status_code=resp.status_code, media_type=content_type)
        record = {"status": resp.status_code, "headers": {"content-type": content_type}, "body": resp.text}
        done = await kernel.complete(lease, step_id, record)
        if done.status_code >= 300:
            return _kernel_error(done)
        return Response(resp.content, status_code=resp.status_code, media_type=content_type)

    return app


def _kernel_error(resp: httpx.Response) -> JSONResponse:
    try:
        env = resp.json()
    except ValueError:
        env = {}
    code = str(env.get("code", "")) if isinstance(env, dict) else ""
    if code == "lease_superseded":
        return refusal("lease_superseded")
    message = str(env.get("message", resp.text[:500])) if isinstance(env, dict) else resp.text[:500]
    return JSONResponse({"error": {"type": "rebuno_kernel_error", "code": code, "message": message}},
                        status_code=resp.status_code)


async def _fail_quietly(kernel: KernelClient, lease: Lease, step_id: str, error: Any) -> None:
    try:
        await kernel.fail(lease, step_id, error)
    except httpx.HTTPError:
        log.warning("could not fail step %s", step_id)


async def _tee(kernel: KernelClient, lease: Lease, step_id: str, resp: httpx.Response,
               content_type: str) -> AsyncIterator[bytes]:
    """Pass the upstream stream through as it arrives, publish deltas, record the whole at the end."""
    # The caller gets the bytes as sent; the record (text) has U+FFFD for any that are not UTF-8,
    # as `resp.text` does for a non-streamed answer, rather than cutting the stream off.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chunks: list[str] = []
    pending = ""
    publisher = _DeltaPublisher(kernel, lease, step_id)
    try:
        async for raw in resp.aiter_raw():
            text = decoder.decode(raw)
            chunks.append(text)
            pending += text
            yield raw
            if len(pending) >= _DELTA_FLUSH_CHARS or "\n\n" in pending:
                publisher.offer(pending)
                pending = ""
    except BaseException as e:
        await resp.aclose()
        await publisher.close(0.1)
        await _fail_quietly(kernel, lease, step_id, {"status": 502, "body": f"upstream stream: {type(e).__name__}"})
        raise
    await resp.aclose()
    tail = decoder.decode(b"", final=True)
    chunks.append(tail)
    if pending + tail:
        publisher.offer(pending + tail)
    await publisher.close()
    record = {"status": resp.status_code, "headers": {"content-type": content_type}, "body": "".join(chunks)}
    done = await kernel.complete(lease, step_id, record)
    if done.status_code >= 300:
        log.warning("recording streamed step %s failed: %s", step_id, done.status_code)
