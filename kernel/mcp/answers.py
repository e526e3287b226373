"""How the gateway answers one MCP POST: one JSON body, unless the request asked for progress
(then an SSE stream, so the progress sent while a call waits for an approver reaches the client)."""

from __future__ import annotations

import contextvars
from typing import Any

_STREAM: contextvars.ContextVar[bool] = contextvars.ContextVar("regent_mcp_stream", default=False)


class JsonUnlessProgress:
    """The SDK session manager's `json_response` flag, decided per request. The SDK's transport
    reads the flag while it serves each POST (to check Accept, then to choose the answer's shape),
    in the task that serves that request; this reads the choice `serving()` made for it.

    Why not always SSE, the SDK's default: an SSE answer cost the gateway 2.1 ms of CPU per
    tools/call against 1.2 ms for a JSON body, and the client 2.9 ms against 2.0 ms to read it
    (an echo tool, 400 calls, bench/journal/2026-12-05-mcp-gateway.md). Why not always JSON: a
    JSON answer drops the notifications sent while the request runs, so a client waiting on an
    approval would see no progress."""

    def __bool__(self) -> bool:
        return not _STREAM.get()


def wants_stream(message: Any, accept: str) -> bool:
    """Whether a POSTed JSON-RPC message asked for progress (`params._meta.progressToken`) from a
    client that reads SSE."""
    if not isinstance(message, dict) or "text/event-stream" not in accept:
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


def serving(stream: bool) -> None:
    """Choose the shape of the answer to the request this task serves."""
    _STREAM.set(stream)
