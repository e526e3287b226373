"""The playground: one step decided by the active bundle and a candidate side by side, with the
explanation, and the agent's last N executions replayed against the candidate."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response

from kernel.console.policies import gate_errors
from kernel.console.web import ConsoleRoute, form, kernel_of, page, require, viewer
from kernel.core import agents, playground
from kernel.core.policy_test import Candidate
from kernel.domain import PolicyInput, StepKind
from kernel.errors import NotFound, ValidationError, invalid
from kernel.identity import MAX_DEPTH, MAX_INT_DIGITS, canonical_json
from kernel.ids import whole_number
from kernel.lane import call
from kernel.text import check_text

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
DEFAULTS = {"agent_id": "", "kind": "tool_call", "target": "", "args": "{}", "candidate_kind": "yaml", "candidate": "",
            "candidate_data": "", "candidate_manifest": "", "n": "10"}
REGO_MODULE = "policy.rego"  # the name a pasted Rego candidate's problems are reported under
CANDIDATE_KINDS = ("yaml", "rego")


def _input(fields: dict[str, str]) -> PolicyInput:
    kind = fields["kind"]
    if kind not in {k.value for k in StepKind}:
        raise invalid(f"unknown step kind {kind!r}")
    if not fields["target"].strip():
        raise invalid("the step needs a target")
    try:
        args = form_json(fields["args"], "args") if fields["args"].strip() else None
    except json.JSONDecodeError as exc:
        raise invalid(f"args are not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if args is not None and not isinstance(args, dict):
        raise invalid("args must be a JSON object")
    return PolicyInput(agent_id=fields["agent_id"], kind=kind, target=fields["target"].strip(), args=args)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise invalid(f"an integer has more than {MAX_INT_DIGITS} digits")
    return int(text)


def form_json(text: str, what: str) -> Any:
    """A JSON field of a form, held to a step's bounds: integers of at most 4300 digits (Python's
    own bound on int text; past it `json.loads` raised ValueError, a 500) and nesting of at most
    MAX_DEPTH levels (past about 1000 it raised RecursionError; a step's args stop at 512)."""
    if text.count("[") + text.count("{") > MAX_DEPTH:  # only then can it nest that deep
        try:
            canonical_json(text)  # iterative: measures any depth, words the error
        except ValidationError as exc:
            raise invalid(f"{what}: {exc.message.removeprefix('validation error: ')}") from None
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:  # pragma: no cover - canonical_json refused it first
        raise invalid(f"{what}: JSON nested deeper than {MAX_DEPTH}") from None


def _candidate(fields: dict[str, Any]) -> tuple[Candidate | None, str]:
    """The candidate bundle of the form and the name its load-gate problems are reported under:
    a chosen file (a Rego `.tar.gz` or a YAML file), else the pasted text, YAML or one Rego
    module with an optional data.json. Nothing here compiles it: `core.policy_test.compiled`,
    the load gate uploads go through, does."""
    from kernel.console.policies import parse_bundle

    upload = fields.get("candidate_file")
    if isinstance(upload, tuple):
        filename, raw = upload
        kind, content = parse_bundle("yaml", "", raw, filename)
        return Candidate(kind, content), filename
    text = str(fields.get("candidate") or "")
    if not text.strip():
        return None, ""
    if str(fields.get("candidate_kind") or "yaml") != "rego":
        return Candidate("yaml", text), "candidate.yaml"
    from kernel.core.policies import rego_content

    data = _json_object(fields, "candidate_data", "data.json")
    manifest = _json_object(fields, "candidate_manifest", ".manifest")
    return Candidate("rego", rego_content({"modules": {REGO_MODULE: text}, "data": data, "manifest": manifest})), REGO_MODULE


def _json_object(fields: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    text = str(fields.get(key) or "")
    try:
        value = form_json(text, name) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValidationError(f"invalid policy bundle: {name}:{exc.lineno}:{exc.colno}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValidationError(f"invalid policy bundle: {name}: must be a JSON object")
    return value


async def _fields(request: Request, v: Any) -> dict[str, Any]:
    data = await form(request, v)
    fields: dict[str, Any] = {key: str(data.get(key) or default) for key, default in DEFAULTS.items()}
    # The agent id reaches the store (its bundle, its executions): NUL was a driver error, a 500,
    # on PostgreSQL (R11 of regent chaos).
    check_text(fields["agent_id"], "agent id")
    if fields["candidate_kind"] not in CANDIDATE_KINDS:
        raise invalid(f"a candidate is one of {', '.join(CANDIDATE_KINDS)}")
    upload = data.get("candidate_file")
    if isinstance(upload, UploadFile) and upload.filename:
        fields["candidate_file"] = (upload.filename, await upload.read())
    return fields


async def _render(request: Request, v: Any, fields: dict[str, str], status: int = 200, **extra: Any) -> Response:
    known = [a.id for a in await call(agents.list_agents, kernel_of(request))]
    if not fields["agent_id"] and known:
        fields["agent_id"] = known[0]
    extra.setdefault("evaluations", None)
    extra.setdefault("replayed", None)
    extra.setdefault("errors", [])
    extra.setdefault("notice", "")
    fields = {key: value for key, value in fields.items() if key in DEFAULTS}  # not the uploaded file
    return page(request, v, "playground.html", status=status, section="playground", agents=known, f=fields,
                kinds=[k.value for k in StepKind], candidate_kinds=CANDIDATE_KINDS, **extra)


@router.get("/console/playground")
async def playground_page(request: Request) -> Response:
    v = await viewer(request)
    require(v, "policies:write")
    fields: dict[str, Any] = dict(DEFAULTS)
    for key in ("agent_id", "kind", "target", "args"):
        if request.query_params.get(key):
            fields[key] = request.query_params[key]
    notice = ""
    if request.query_params.get("start") == "active" and fields["agent_id"]:
        notice = await call(_start_from_active, kernel_of(request), fields)
    return await _render(request, v, fields, notice=notice)


def _start_from_active(k: Any, fields: dict[str, Any]) -> str:
    """Fill the candidate with the agent's active bundle, to edit from; a notice when it cannot."""
    from kernel.core import policies

    try:
        r = policies.active_policy(k, fields["agent_id"])
    except NotFound as exc:
        return exc.message
    if r.kind == "yaml":
        fields.update(candidate_kind="yaml", candidate=r.content)
        return ""
    b = json.loads(r.content)
    modules = b.get("modules") or {}
    if len(modules) != 1:
        return f"The active bundle has {len(modules)} modules: choose its .tar.gz to try a changed copy."

    def text(key: str) -> str:
        return json.dumps(b[key], indent=2, sort_keys=True) if b.get(key) else ""

    fields.update(candidate_kind="rego", candidate=next(iter(modules.values())), candidate_data=text("data"),
                  candidate_manifest=text("manifest"))
    return ""


@router.post("/console/playground")
async def evaluate(request: Request) -> Response:
    v = await viewer(request)
    fields = await _fields(request, v)
    require(v, "policies:write")
    name = "candidate.yaml"
    try:
        inp = _input(fields)
        candidate, name = _candidate(fields)
        evaluations = await call(playground.compare, kernel_of(request), fields["agent_id"], inp, candidate)
    except ValidationError as exc:
        return await _render(request, v, fields, status=400, errors=gate_errors(exc.message, name or "candidate.yaml"))
    return await _render(request, v, fields, evaluations=evaluations)


@router.post("/console/playground/replay")
async def replay(request: Request) -> Response:
    v = await viewer(request)
    fields = await _fields(request, v)
    require(v, "policies:write", "executions:read")
    n = whole_number(fields["n"])
    n = 10 if n is None else n
    name = "candidate.yaml"
    try:
        candidate, name = _candidate(fields)
        result = await call(playground.replay_recent, kernel_of(request), fields["agent_id"], n, candidate)
    except ValidationError as exc:
        return await _render(request, v, fields, status=400, errors=gate_errors(exc.message, name or "candidate.yaml"))
    return await _render(request, v, fields, replayed=result)
