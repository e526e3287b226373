"""JSON rendering of responses and resources (rebuno-v0 §0.2, §7.1): compact JSON plus a newline."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from kernel.clock import rfc3339
from kernel.domain import Agent, Approval, Event, Execution, Step
from kernel.jsontext import compact_encoder

_encode = compact_encoder(ensure_ascii=False)
_encode_ascii = compact_encoder(ensure_ascii=True)


class JSONResponse(Response):
    media_type = "application/json; charset=utf-8"

    def render(self, content: Any) -> bytes:
        try:
            return (_encode(content) + "\n").encode("utf-8")
        except UnicodeEncodeError:
            # A stored value holds a lone surrogate (accepted losslessly, docs/api.md): answer it
            # as the \uXXXX escape it came in as, every non-ASCII character escaped.
            return (_encode_ascii(content) + "\n").encode("ascii")


def execution_json(e: Execution, children: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.id,
        "agent_id": e.agent_id,
        "input": e.input,
        "status": e.status.value,
        "created_at": rfc3339(e.created_at),
        "updated_at": rfc3339(e.updated_at),
    }
    if e.output is not None:
        out["output"] = e.output
    if e.failure_reason:
        out["failure_reason"] = e.failure_reason
    if e.deadline_at is not None:
        out["deadline_at"] = rfc3339(e.deadline_at)
    if e.idempotency_key is not None:
        out["idempotency_key"] = e.idempotency_key
    if e.session is not None:
        out["session"] = e.session
    if e.previous_execution_id is not None:
        out["previous_execution_id"] = e.previous_execution_id
    if e.parent_execution_id is not None:
        out["parent_execution_id"] = e.parent_execution_id
        if e.spawned_step_id is not None:
            out["spawned_by"] = {"execution_id": e.parent_execution_id, "step_id": e.spawned_step_id}
    if children is not None:
        out["children"] = children
    if e.suspended:
        out["suspended"] = True
    if e.forked_from is not None:
        out["forked_from"] = e.forked_from
        out["fork_seq"] = e.fork_seq
        if e.restoration:
            out["restoration"] = e.restoration
    return out


def step_json(s: Step) -> dict[str, Any]:
    out: dict[str, Any] = {
        "step_id": s.step_id,
        "execution_id": s.execution_id,
        "kind": s.kind,
        "target": s.target,
        "args_hash": s.args_hash,
        "occurrence": s.occurrence,
        "status": s.status.value,
        "idempotency": s.idempotency,
    }
    if s.args is not None:
        out["args"] = s.args
    if s.result is not None:
        out["result"] = s.result
    if s.error is not None:
        out["error"] = s.error
    if s.started_at is not None:
        out["started_at"] = rfc3339(s.started_at)
    if s.completed_at is not None:
        out["completed_at"] = rfc3339(s.completed_at)
    if s.usage_input:
        out["usage_input"] = s.usage_input
    if s.usage_output:
        out["usage_output"] = s.usage_output
    return out


def event_json(e: Event) -> dict[str, Any]:
    return {
        "execution_id": e.execution_id,
        "event_seq": e.event_seq,
        "type": e.type,
        "payload": e.payload,
        "occurred_at": rfc3339(e.occurred_at),
    }


def approval_json(a: Approval) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": a.id,
        "step_id": a.step_id,
        "execution_id": a.execution_id,
        "status": a.status.value,
        "approvers": a.approvers,
        "timeout_at": rfc3339(a.timeout_at),
        "created_at": rfc3339(a.created_at),
    }
    for key in ("message", "decided_by", "asserted_by", "credential", "rationale", "agent_id", "kind", "target",
                "rule_id", "reason", "policy_hash"):
        value = getattr(a, key)
        if value:
            out[key] = value
    if a.decided_at is not None:
        out["decided_at"] = rfc3339(a.decided_at)
    # The context an approver decides on (docs/audit.md): the arguments as recorded, capped.
    out["args"] = a.args
    if a.args_truncated:
        out["args_truncated"] = True
        out["args_chars"] = a.args_chars
    out["requested_at"] = out["created_at"]
    out["expires_at"] = out["timeout_at"]
    return out


def agent_json(a: Agent, policy_bundle: str | None = None, *, schemas: bool = False) -> dict[str, Any]:
    """Never includes the secret. `schemas`: also the input and output JSON Schemas the agent
    published (`PUT /v0/agents/{id}/metadata`), as it sent them; only one agent's read carries
    them (a list of agents stays small)."""
    out: dict[str, Any] = {
        "id": a.id,
        "webhook_url": a.webhook_url,
        "registered_at": rfc3339(a.registered_at),
    }
    if policy_bundle:
        out["policy_bundle"] = policy_bundle
    if a.lease_timeout_seconds:
        out["lease_timeout_seconds"] = a.lease_timeout_seconds
    if a.description:
        out["description"] = a.description
    if schemas:
        for key in ("input_schema", "output_schema"):
            if getattr(a, key) is not None:
                out[key] = getattr(a, key)
    return out
