"""Stream side channel routes (rebuno-v0 §10): agent-signed producer, bearer SSE consumer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import Strict, parse_model, whole
from kernel.api.deps import auth_of, call, kernel_of, long_lived, signed_on, step_param, uuid_param
from kernel.core import executions, steps
from kernel.domain import StepStatus
from kernel.errors import Conflict, ValidationError, invalid
from kernel.stream import InProcessBroker, StreamBroker

router = APIRouter()
MAX_DATA_BYTES = 7000  # PostgreSQL NOTIFY payloads stop at 8000 bytes
MAX_SEQ = 2**63 - 1  # `seq` is an int64 in every SDK that reads the frames; -1 and 2^63 were relayed
DEFAULT_KEEPALIVE_SECONDS = 15.0


class DeltaBody(Strict):
    seq: whole(0, MAX_SEQ)  # type: ignore[valid-type]
    data: str


def broker_of(request: Request) -> StreamBroker:
    """The app's broker; one in-process broker is made on first use when none was installed."""
    state = request.app.state
    if getattr(state, "stream_broker", None) is None:
        state.stream_broker = InProcessBroker()
    return state.stream_broker  # type: ignore[no-any-return]


@router.post("/v0/executions/{execution_id}/steps/{step_id}/stream", openapi_extra=schema.operation(DeltaBody, ok=204))
async def publish_delta(execution_id: str, step_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "once")
    body = parse_model(DeltaBody, a.body)
    if not 0 <= body.seq <= MAX_SEQ:
        raise invalid(f"seq must be a whole number 0-{MAX_SEQ}")
    # surrogatepass: a lone surrogate in `data` is relayed as its JSON escape (docs/stream.md).
    if len(body.data.encode("utf-8", "surrogatepass")) > MAX_DATA_BYTES:
        raise ValidationError(f"data is over {MAX_DATA_BYTES} bytes")
    s = await call(steps.get_step, kernel_of(request), eid, step_param(step_id), a.agent_id)
    if s.status != StepStatus.EXECUTING:
        raise Conflict(f"step {s.step_id} is {s.status}, not executing")
    broker_of(request).publish(eid, {"step_id": s.step_id, "seq": body.seq, "data": body.data})
    return Response(status_code=204)


@router.get("/v0/executions/{execution_id}/stream", openapi_extra=schema.SSE)
async def subscribe(execution_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "executions:read")
    eid = uuid_param(execution_id, "execution id")
    await call(executions.get_execution, kernel_of(request), eid, None)
    keepalive = float(getattr(request.app.state, "stream_keepalive_seconds", DEFAULT_KEEPALIVE_SECONDS))
    broker = broker_of(request)
    ctx = broker.subscribe(eid)
    queue = ctx.__enter__()  # subscribed before the 200, so nothing published after it is missed

    async def frames() -> AsyncIterator[ServerSentEvent]:
        try:
            with long_lived():  # held open: not a request a step call on the event loop would hold up
                yield ServerSentEvent(comment="ok", sep="\n")
                while True:
                    msg = await queue.get()
                    yield ServerSentEvent(data=json.dumps(msg, separators=(",", ":")), sep="\n")
        finally:
            ctx.__exit__(None, None, None)

    # sse-starlette sends the keep-alive comment on its own timer and ends the stream (running the
    # generator's cleanup, which unsubscribes) as soon as the client disconnects.
    return EventSourceResponse(
        frames(), sep="\n", ping=keepalive,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep="\n"),
        headers={"Cache-Control": "no-cache"},
    )
