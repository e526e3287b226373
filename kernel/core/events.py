"""Event payload builders (rebuno-v0 §7.7): one place that knows each payload's fields."""

from __future__ import annotations

from typing import Any

from kernel.domain import Approval, Decision, EventType, ExecutionStatus

Ev = tuple[str, dict[str, Any]]


def execution(typ: EventType, execution_id: str, status: ExecutionStatus, **extra: Any) -> Ev:
    payload: dict[str, Any] = {"execution_id": execution_id, "status": status.value}
    payload.update({k: v for k, v in extra.items() if v is not None})
    return typ.value, payload


def step(typ: EventType, step_id: str, kind: str, target: str | None, **extra: Any) -> Ev:
    payload: dict[str, Any] = {"step_id": step_id, "step_type": kind}
    if target is not None:
        payload["target"] = target
    payload.update({k: v for k, v in extra.items() if v is not None})
    return typ.value, payload


def decision_fields(d: Decision) -> dict[str, Any]:
    """What every decision event carries so an auditor can tell which bundle decided."""
    out: dict[str, Any] = {
        "rule_id": d.rule_id,
        "policy_kind": d.policy_kind.value,
        "policy_revision": d.policy_revision,
    }
    if d.policy_hash:
        out["policy_hash"] = d.policy_hash
    if d.reason:
        out["reason"] = d.reason
    if d.judge_record is not None:
        out["judge"] = d.judge_record
    return out


def asked_fields(a: Approval) -> dict[str, Any]:
    """The decision fields of the events that answer an approval (grant, deny, expiry, cancel):
    those of the decision that asked for it, so every decision event names its rule and bundle."""
    out: dict[str, Any] = {}
    for key in ("rule_id", "policy_kind", "policy_revision", "policy_hash"):
        value = getattr(a, key)
        if value:
            out[key] = value
    return out


def dispatch(typ: EventType, dispatch_id: str, execution_id: str, status: str, attempt: int, **extra: Any) -> Ev:
    payload: dict[str, Any] = {
        "dispatch_id": dispatch_id,
        "execution_id": execution_id,
        "status": status,
        "attempt": attempt,
    }
    payload.update({k: v for k, v in extra.items() if v is not None})
    return typ.value, payload


def approval(typ: EventType, a: Approval, status: str, **extra: Any) -> Ev:
    payload: dict[str, Any] = {
        "approval_id": a.id,
        "step_id": a.step_id,
        "execution_id": a.execution_id,
        "status": status,
    }
    # The rule and bundle that asked, so the approval's events alone say what was decided on.
    if a.rule_id:
        payload["rule_id"] = a.rule_id
    if a.policy_hash:
        payload["policy_hash"] = a.policy_hash
    payload.update({k: v for k, v in extra.items() if v is not None})
    return typ.value, payload
