"""Agent routes (v1 request signature): steps, outcomes, heartbeat, complete/fail, metadata."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import model_validator
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import (
    Name,
    Strict,
    _Number,
    dumps_lexical,
    parse_model,
)
from kernel.api.deps import (
    LeanRoute,
    agent_param,
    auth_of,
    call,
    call_hot,
    kernel_of,
    lease,
    signed_on,
    step_param,
    uuid_param,
)
from kernel.api.metrics import ApiMetrics
from kernel.api.render import JSONResponse, execution_json, step_json
from kernel.core import executions, resources, sessions, steps
from kernel.core.kernel import Kernel
from kernel.domain import Lease, StepKind
from kernel.errors import Forbidden, invalid
from kernel.identity import canonical_hash, canonical_json
from kernel.text import check_text, scrub_text

router = APIRouter()


def _hot(path: str, **kwargs: Any):  # type: ignore[no-untyped-def]
    """`router.post` for the agent's hot routes, served lean (kernel/api/deps.py `LeanRoute`)."""
    def register(endpoint):  # type: ignore[no-untyped-def]
        router.add_api_route(path, endpoint, methods=["POST"], route_class_override=LeanRoute, **kwargs)
        return endpoint

    return register
_KINDS = frozenset(k.value for k in StepKind)


class SubmitBody(Strict):
    kind: Name
    target: Name
    args: Any = None
    idempotency: Name = "safe_to_retry"
    # The registered resources the body may change (docs/api.md, "Resources and checkpoints").
    resources: list[Name] | None = None

    @model_validator(mode="before")
    @classmethod
    def _strings_are_strings(cls, data: Any) -> Any:
        # Lexical parsing keeps numbers as str subclasses; they must not pass as strings.
        if isinstance(data, dict):
            for key in ("kind", "target", "idempotency"):
                if isinstance(data.get(key), _Number):
                    raise ValueError(f"{key} must be a string")
        return data


# What the document offers a client for the free-text fields the route checks itself.
_SUBMIT_ENUMS: dict[str, dict[str, Any]] = {
    "kind": {"enum": sorted(_KINDS)},
    "idempotency": {"enum": ["safe_to_retry", "at_most_once"]},
}


class CaptureBody(Strict):
    key: Name
    generation: int
    checkpoint_ref: Name


class CaptureFailureBody(Strict):
    key: Name
    generation: int
    error: str = ""


class CapturesBody(Strict):
    """A body's resource captures (docs/api.md, "Resources and checkpoints")."""

    captures: list[CaptureBody] | None = None
    capture_failures: list[CaptureFailureBody] | None = None

    def parsed(self) -> dict[str, Any]:
        return {
            "captures": [resources.Capture(c.key, c.generation, c.checkpoint_ref) for c in self.captures or []],
            "capture_failures": [resources.CaptureFailure(f.key, f.generation, scrub_text(f.error))
                                 for f in self.capture_failures or []],
        }


class CompleteStepBody(CapturesBody):
    result: Any = None


class FailStepBody(CapturesBody):
    error: Any = None


MAX_EVERY_STEPS = 1_000_000  # a count the store keeps in an INTEGER column (docs/api.md, "Bounds")


class ResourceBody(Strict):
    key: Name
    driver_id: Name
    configuration: Any = None
    coverage_reuse: bool = False
    every_steps: int = 0
    on_completion: bool = False


class BindingBody(Strict):
    binding: Any = None


class CompleteExecutionBody(Strict):
    output: Any = None
    state: Any = None  # the session's next turn reads it (GET …/previous)


class FailExecutionBody(Strict):
    error: str = ""


class MetadataBody(Strict):
    description: Name | None = None
    input_schema: Any = None
    output_schema: Any = None


@_hot("/v0/executions/{execution_id}/steps",
             openapi_extra=schema.operation(SubmitBody, answer=schema.DECISION, overrides=_SUBMIT_ENUMS))
async def submit_step(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "repeatable", with_call=True)
    answer = await submit(kernel_of(request), request.app.state.metrics, functools.partial(lease, a, eid), a.body)
    return JSONResponse(answer.to_json())


async def submit(k: Kernel, metrics: ApiMetrics, lease_of: Callable[[], Lease], raw: bytes) -> steps.StepAnswer:
    """A step's submission once its caller is known to hold the lease `lease_of` reads: the route's
    work after the signature (the body, then the lease, `signed_on`), and the in-kernel MCP
    gateway's submission (kernel/mcp/inkernel.py): one code path."""
    body = parse_model(SubmitBody, raw, lexical=True)
    if body.kind not in _KINDS:
        raise invalid(f"unknown kind {body.kind!r} (tool_call, llm_call or local)")
    held = lease_of()
    text = canonical_json(dumps_lexical(body.args)) if body.args is not None else "null"
    req = steps.StepRequest(
        kind=body.kind,
        target=body.target,
        args=json.loads(text),
        args_text=text,
        args_hash=canonical_hash(text),
        idempotency=body.idempotency,
        resources=tuple(dict.fromkeys(body.resources or ())),
    )
    try:
        answer = await call_hot(steps.submit_step, k, held, req)
    except steps.JudgeNeeded as need:
        # A judge rule: ask the model here, on the event loop, with no transaction open and no
        # lane thread held; then decide again with its answer (kernel.core.steps.JudgeNeeded).
        verdict = await k.judge.ask(need.spec, need.input)
        answer = await call_hot(steps.submit_step, k, held, req, {need.rule_id: verdict})
    metrics.decision(req.kind, answer.decision, held.agent_id, answer.decided_rule)
    return answer


async def _outcome(request: Request, execution_id: str, step_id: str, failed: bool) -> Response:
    a, eid = await signed_on(request, execution_id, "once", with_call=True)
    answer = await outcome(kernel_of(request), request.app.state.metrics, functools.partial(lease, a, eid), step_id,
                           a.body, failed)
    return JSONResponse(answer.to_json())


async def outcome(k: Kernel, metrics: ApiMetrics, lease_of: Callable[[], Lease], step_id: str, raw: bytes,
                  failed: bool) -> steps.StepAnswer:
    """A step's result or error once its caller is known to hold the lease (as `submit`)."""
    if failed:
        fb = parse_model(FailStepBody, raw)
        kwargs: dict[str, Any] = {"error": fb.error, "failed": True, **fb.parsed()}
    else:
        cb = parse_model(CompleteStepBody, raw)
        kwargs = {"result": cb.result, **cb.parsed()}
    held = lease_of()
    answer = await call_hot(steps.record_outcome, k, held, step_param(step_id), **kwargs)
    metrics.outcome(failed, answer.decision)
    return answer


@_hot("/v0/executions/{execution_id}/steps/{step_id}/complete",
             openapi_extra=schema.operation(CompleteStepBody, answer=schema.OUTCOME))
async def complete_step(execution_id: str, step_id: str, request: Request) -> Response:
    return await _outcome(request, execution_id, step_id, failed=False)


@_hot("/v0/executions/{execution_id}/steps/{step_id}/fail",
             openapi_extra=schema.operation(FailStepBody, answer=schema.OUTCOME))
async def fail_step(execution_id: str, step_id: str, request: Request) -> Response:
    return await _outcome(request, execution_id, step_id, failed=True)


@_hot("/v0/executions/{execution_id}/heartbeat", openapi_extra=schema.operation(ok=204))
async def heartbeat(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "once", with_call=True)
    held = lease(a, eid)
    await call(executions.heartbeat, kernel_of(request), held)
    return Response(status_code=204)


@router.post("/v0/executions/{execution_id}/complete",
             openapi_extra=schema.operation(CompleteExecutionBody, body_required=False, ok=204))
async def complete_execution(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "once")
    body = parse_model(CompleteExecutionBody, a.body, allow_empty=True)
    held = lease(a, eid)
    await call(executions.finish_execution, kernel_of(request), held, output=body.output, state=body.state)
    return Response(status_code=204)


@router.post("/v0/executions/{execution_id}/suspend", openapi_extra=schema.operation(answer=schema.SUSPENDED))
async def suspend(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "repeatable")
    held = lease(a, eid)
    suspended = await call(sessions.suspend, kernel_of(request), held)
    return JSONResponse({"suspended": suspended})


@router.post("/v0/executions/{execution_id}/fail",
             openapi_extra=schema.operation(FailExecutionBody, body_required=False, ok=204))
async def fail_execution(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "once")
    body = parse_model(FailExecutionBody, a.body, allow_empty=True)
    held = lease(a, eid)
    await call(executions.finish_execution, kernel_of(request), held, error=scrub_text(body.error), failed=True)
    return Response(status_code=204)


@router.put("/v0/agents/{agent_id}/metadata",
            openapi_extra=schema.operation(MetadataBody, body_required=False, ok=204))
async def put_metadata(agent_id: str, request: Request) -> Response:
    a = await auth_of(request).agent(request, "repeatable")
    if a.agent_id != agent_param(agent_id):
        raise Forbidden("forbidden: an agent may only describe itself")
    body = parse_model(MetadataBody, a.body, allow_empty=True)

    def _store() -> None:
        k = kernel_of(request)
        with k.store.transaction() as tx:
            tx.update_agent_metadata(agent_id, body.description, body.input_schema, body.output_schema)

    await call(_store)
    return Response(status_code=204)


@router.post("/v0/executions/{execution_id}/resources",
             openapi_extra=schema.operation(ResourceBody, answer=schema.RESOURCE))
async def register_resource(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "repeatable")
    body = parse_model(ResourceBody, a.body)
    if not 0 < len(body.key) <= 200:
        raise invalid("key must be 1-200 characters")
    if not 0 <= body.every_steps <= MAX_EVERY_STEPS:
        raise invalid(f"every_steps must be 0-{MAX_EVERY_STEPS}")
    held = lease(a, eid)
    reg = resources.Registration(body.key, body.driver_id, body.configuration, body.coverage_reuse,
                                 body.every_steps, body.on_completion)
    return JSONResponse(await call(resources.register, kernel_of(request), held, reg))


@router.post("/v0/executions/{execution_id}/resources/checkpoints",
             openapi_extra=schema.operation(CapturesBody, ok=204))
async def publish_checkpoints(execution_id: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "once")
    body = parse_model(CapturesBody, a.body, allow_empty=True).parsed()
    held = lease(a, eid)
    await call(resources.publish, kernel_of(request), held, body["captures"], body["capture_failures"])
    return Response(status_code=204)


@router.post("/v0/executions/{execution_id}/resources/{key}/binding",
             openapi_extra=schema.operation(BindingBody, ok=204))
async def bind_resource(execution_id: str, key: str, request: Request) -> Response:
    a, eid = await signed_on(request, execution_id, "once")
    body = parse_model(BindingBody, a.body)
    held = lease(a, eid)
    await call(resources.bind, kernel_of(request), held, check_text(key, "resource key"), body.binding)
    return Response(status_code=204)


# Dual read routes: signature when agent headers are present, else bearer executions:read.
async def _reader(request: Request) -> str | None:
    from kernel.api.auth import is_agent_request

    auth = auth_of(request)
    if is_agent_request(request):
        return (await auth.agent(request)).agent_id
    await call(auth.principal, request, "executions:read")
    return None


@router.get("/v0/executions/{execution_id}", openapi_extra=schema.operation(answer=schema.EXECUTION))
async def get_execution(execution_id: str, request: Request) -> Response:
    agent_id = await _reader(request)
    eid = uuid_param(execution_id, "execution id")
    e, children = await call(executions.get_execution_tree, kernel_of(request), eid, agent_id)
    return JSONResponse(execution_json(e, children))


@router.get("/v0/executions/{execution_id}/previous", openapi_extra=schema.operation(answer=schema.PREVIOUS))
async def previous(execution_id: str, request: Request) -> Response:
    agent_id = await _reader(request)
    eid = uuid_param(execution_id, "execution id")
    return JSONResponse(await call(sessions.previous_state, kernel_of(request), eid, agent_id))


@router.get("/v0/executions/{execution_id}/steps", openapi_extra=schema.operation(answer=schema.array(schema.STEP)))
async def list_steps(execution_id: str, request: Request, status: str | None = None) -> Response:
    agent_id = await _reader(request)
    eid = uuid_param(execution_id, "execution id")
    rows = await call(steps.list_steps, kernel_of(request), eid, agent_id, status == "terminal")
    return JSONResponse([step_json(s) for s in rows])


@router.get("/v0/executions/{execution_id}/steps/{step_id}", openapi_extra=schema.operation(answer=schema.STEP))
async def get_step(execution_id: str, step_id: str, request: Request) -> Response:
    agent_id = await _reader(request)
    eid = uuid_param(execution_id, "execution id")
    s = await call(steps.get_step, kernel_of(request), eid, step_param(step_id), agent_id)
    return JSONResponse(step_json(s))


@router.get("/v0/executions/{execution_id}/resources",
            openapi_extra=schema.operation(answer=schema.array(schema.RESOURCE)))
async def list_resources(execution_id: str, request: Request) -> Response:
    agent_id = await _reader(request)
    eid = uuid_param(execution_id, "execution id")
    return JSONResponse(await call(resources.list_views, kernel_of(request), eid, agent_id))
