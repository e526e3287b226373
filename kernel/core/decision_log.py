"""Decision-log entries (OPA's shape plus Regent's ids), noted where a decision is recorded and
handed to the kernel's decision log only after that transaction commits.

A use case runs inside `collect(k)`: `note_*` appends to the batch of the running use case; the
batch is submitted when the block ends normally (the transaction has committed by then) and
dropped when it raises (the decision was rolled back, so it never happened).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from kernel.clock import rfc3339
from kernel.core.kernel import Kernel
from kernel.domain import Approval, Decision, DecisionRecord, Execution, PolicyInput
from kernel.ids import new_uuid7

STEP_PATH = "regent/step"
APPROVAL_PATH = "regent/approval"
SHADOW_PATH = "regent/shadow"
_ERROR_RULES = ("eval-error", "bundle-error")


class _Batch(list[dict[str, Any]]):
    """The entries of one use case, and the id of the durable decision record last built in it
    (`bind`), which the next step entry takes as its `decision_id`."""

    record_id: str | None = None


_batch: ContextVar[_Batch | None] = ContextVar("regent_decision_batch", default=None)


@contextlib.contextmanager
def collect(k: Kernel) -> Iterator[None]:
    if not k.decision_log.enabled:
        yield
        return
    batch = _Batch()
    token = _batch.set(batch)
    try:
        yield
    finally:
        _batch.reset(token)
    if batch:
        entries = list(batch)
        k.store.after_commit(lambda: k.decision_log.submit(entries))


def bind(record: DecisionRecord) -> DecisionRecord:
    """Called where the decisions table's record of a step decision is built: the log entry of
    that decision gets the record's id, so the two join (`GET /v0/decisions`)."""
    batch = _batch.get()
    if batch is not None:
        batch.record_id = record.id
    return record


def _take_record_id() -> str:
    batch = _batch.get()
    rid = batch.record_id if batch is not None else None
    if batch is not None:
        batch.record_id = None
    return rid or new_uuid7()


def _note(entry: dict[str, Any]) -> None:
    batch = _batch.get()
    if batch is not None:
        batch.append(entry)


def input_document(inp: PolicyInput) -> dict[str, Any]:
    """The input the bundle was asked about (regent.md §3), as a shallow dict (masking copies)."""
    return {"agent_id": inp.agent_id, "kind": inp.kind, "target": inp.target, "args": inp.args,
            "idempotency": inp.idempotency, "execution": inp.execution, "usage": inp.usage,
            "now": inp.now}


def _bundles(agent_id: str, d: Decision) -> dict[str, Any]:
    if not d.policy_revision and d.policy_kind.value == "none":
        return {}
    bundle: dict[str, Any] = {"revision": d.policy_revision, "kind": d.policy_kind.value}
    policy_hash = getattr(d, "policy_hash", "")
    if policy_hash:
        bundle["policy_hash"] = policy_hash
    return {agent_id: bundle}


def result_of(d: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"decision": d.verdict.value, "rule_id": d.rule_id}
    if d.reason:
        out["reason"] = d.reason
    return out


def note_step(k: Kernel, e: Execution, step_id: str | None, inp: PolicyInput, d: Decision, event: str,
              now: datetime, *, outcome: str | None = None, reason: str | None = None) -> None:
    """A step decision: `event` is the decision event recorded (step.allowed, step.denied,
    step.awaiting_approval, step.rate_limited); `outcome`/`reason` what the kernel did when it
    differs from the bundle's verdict (rate limit, budget)."""
    if not k.decision_log.enabled:
        return
    result = result_of(d)
    if outcome is not None:
        result["outcome"] = outcome
    if reason:
        result["reason"] = reason
    entry: dict[str, Any] = {
        "decision_id": _take_record_id(),
        "path": STEP_PATH,
        "event": event,
        "input": input_document(inp),
        "result": result,
        "bundles": _bundles(e.agent_id, d),
        "timestamp": rfc3339(now),
        "execution_id": e.id,
        "step_id": step_id,
        "rule_id": d.rule_id,
        "agent_id": e.agent_id,
        "requested_by": e.agent_id,
    }
    if d.rule_id in _ERROR_RULES:
        entry["error"] = {"code": d.rule_id, "message": d.reason}
    _note(entry)


def note_approval(k: Kernel, a: Approval, agent_id: str, kind: str, target: str | None, outcome: str,
                  now: datetime, *, decided_by: str | None, rationale: str | None,
                  decision_id: str | None = None) -> None:
    """An approval resolved: `outcome` approval_granted, approval_denied (by a person) or
    approval_expired (by the sweep)."""
    if not k.decision_log.enabled:
        return
    status = outcome.removeprefix("approval_")
    _note({
        "decision_id": decision_id or new_uuid7(),
        "path": APPROVAL_PATH,
        "event": f"approval.{status}",
        "input": {"approval_id": a.id, "kind": kind, "target": target, "approvers": a.approvers},
        "result": {"decision": status, "decided_by": decided_by, "rationale": rationale},
        "bundles": {},
        "timestamp": rfc3339(now),
        "execution_id": a.execution_id,
        "step_id": a.step_id,
        "rule_id": None,
        "agent_id": agent_id,
        "requested_by": decided_by,
    })


def note_shadow(k: Kernel, *, agent_id: str, execution_id: str, step_id: str, inp: PolicyInput,
                active: Decision, active_outcome: str, shadow: Decision | None, shadow_outcome: str,
                shadow_revision: str, now: datetime, error: str | None = None) -> None:
    """A shadow bundle that disagreed with the active one (or faulted beside it). `result` is the
    shadow's; `result.active` the enforced decision; `bundles` names both revisions."""
    if not k.decision_log.enabled:
        return
    result: dict[str, Any] = ({**result_of(shadow), "outcome": shadow_outcome} if shadow is not None
                              else {"decision": None, "outcome": shadow_outcome})
    result["active"] = {**result_of(active), "outcome": active_outcome}
    entry: dict[str, Any] = {
        "decision_id": new_uuid7(),
        "path": SHADOW_PATH,
        "event": "shadow.disagreed" if error is None else "shadow.failed",
        "input": input_document(inp),
        "result": result,
        "bundles": {**_bundles(agent_id, active),
                    f"{agent_id}#shadow": {"revision": shadow_revision, "kind": "shadow"}},
        "timestamp": rfc3339(now),
        "execution_id": execution_id,
        "step_id": step_id,
        "rule_id": shadow.rule_id if shadow is not None else None,
        "agent_id": agent_id,
        "requested_by": agent_id,
    }
    if error is not None:
        entry["error"] = {"code": shadow_outcome, "message": error}
    _note(entry)
