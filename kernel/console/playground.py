"""The playground: one step decided by the active bundle and a candidate side by side, with the
explanation, and the agent's last N executions replayed against the candidate."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api.threads import call
from kernel.console.policies import gate_errors
from kernel.console.web import ConsoleRoute, form, kernel_of, page, require, viewer
from kernel.core import agents, playground
from kernel.core.policy_test import Candidate
from kernel.domain import PolicyInput, StepKind
from kernel.errors import ValidationError

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
DEFAULTS = {"agent_id": "", "kind": "tool_call", "target": "", "args": "{}", "candidate": "", "n": "10"}


def _input(fields: dict[str, str]) -> PolicyInput:
    kind = fields["kind"]
    if kind not in {k.value for k in StepKind}:
        raise ValidationError(f"validation error: unknown step kind {kind!r}")
    if not fields["target"].strip():
        raise ValidationError("validation error: the step needs a target")
    try:
        args = json.loads(fields["args"]) if fields["args"].strip() else None
    except json.JSONDecodeError as exc:
        raise ValidationError(f"validation error: args are not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if args is not None and not isinstance(args, dict):
        raise ValidationError("validation error: args must be a JSON object")
    return PolicyInput(agent_id=fields["agent_id"], kind=kind, target=fields["target"].strip(), args=args)


def _candidate(fields: dict[str, str]) -> Candidate | None:
    text = fields["candidate"]
    return Candidate("yaml", text) if text.strip() else None


async def _fields(request: Request, v: Any) -> dict[str, str]:
    data = await form(request, v)
    return {key: str(data.get(key) or default) for key, default in DEFAULTS.items()}


async def _render(request: Request, v: Any, fields: dict[str, str], status: int = 200, **extra: Any) -> Response:
    known = [a.id for a in await call(agents.list_agents, kernel_of(request))]
    if not fields["agent_id"] and known:
        fields["agent_id"] = known[0]
    extra.setdefault("evaluations", None)
    extra.setdefault("replayed", None)
    extra.setdefault("errors", [])
    return page(request, v, "playground.html", status=status, section="playground", agents=known, f=fields,
                kinds=[k.value for k in StepKind], **extra)


@router.get("/console/playground")
async def playground_page(request: Request) -> Response:
    v = await viewer(request)
    require(v, "policies:write")
    fields = dict(DEFAULTS)
    for key in ("agent_id", "kind", "target", "args"):
        if request.query_params.get(key):
            fields[key] = request.query_params[key]
    return await _render(request, v, fields)


@router.post("/console/playground")
async def evaluate(request: Request) -> Response:
    v = await viewer(request)
    fields = await _fields(request, v)
    require(v, "policies:write")
    try:
        inp = _input(fields)
        evaluations = await call(playground.compare, kernel_of(request), fields["agent_id"], inp, _candidate(fields))
    except ValidationError as exc:
        return await _render(request, v, fields, status=400, errors=gate_errors(exc.message, "candidate.yaml"))
    return await _render(request, v, fields, evaluations=evaluations)


@router.post("/console/playground/replay")
async def replay(request: Request) -> Response:
    v = await viewer(request)
    fields = await _fields(request, v)
    require(v, "policies:write", "executions:read")
    n = int(fields["n"]) if fields["n"].isdigit() else 10
    try:
        result = await call(playground.replay_recent, kernel_of(request), fields["agent_id"], n, _candidate(fields))
    except ValidationError as exc:
        return await _render(request, v, fields, status=400, errors=gate_errors(exc.message, "candidate.yaml"))
    return await _render(request, v, fields, replayed=result)
