"""The Rego output contract: an entrypoint's value → Decision (regent.md §3 "Output"); pure.

The value is one object with a YAML rule's `then` fields plus `rule_id`, or a set/array of them
combined deny-overrides. Undefined or empty falls to the bundle's `default_action` (unmatched
`local` steps are allowed, as in the YAML engine). Anything else denies with rule id `eval-error`
and a reason naming what was wrong: a malformed policy must fail closed, visibly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernel.domain.decision import (
    ApprovalConfig,
    BudgetSpec,
    Decision,
    PolicyKind,
    RateLimitSpec,
    Verdict,
)
from kernel.domain.judge import DEFAULT_THRESHOLD, JudgeSpec
from kernel.duration import DurationError, parse_duration

__all__ = [
    "EVAL_ERROR",
    "OutputError",
    "decision_from_output",
    "default_decision",
    "eval_error",
    "parse_output_object",
]

EVAL_ERROR = "eval-error"
_VERDICT_RANK = {Verdict.DENY: 0, Verdict.REQUIRE_APPROVAL: 1, Verdict.ALLOW: 2}
_FIELDS = {"decision", "rule_id", "reason", "approval_config", "rate_limit", "budget", "judge"}
_JUDGE_FIELDS = {"instructions", "threshold", "fallback"}
_APPROVAL_FIELDS = {"approvers", "timeout", "message"}
_RATE_FIELDS = {"max_calls", "window", "per_what", "max_wait", "on_limiter_error"}
_BUDGET_FIELDS = {"max_tokens", "on_exceed", "scope"}
# Fixed ids that mean "no rule decided"; a rule claiming one would mislead audits and metrics.
_RESERVED_RULE_IDS = {"eval-error", "bundle-error", "permissive"}


class OutputError(ValueError):
    """The entrypoint's value breaks the output contract."""


def eval_error(reason: str, revision: str = "") -> Decision:
    return Decision(
        Verdict.DENY, EVAL_ERROR, reason, policy_kind=PolicyKind.REGO, policy_revision=revision
    )


def default_decision(default_action: Verdict, kind: str, revision: str) -> Decision:
    if kind == "local":
        verdict, rule_id, reason = Verdict.ALLOW, "local", "local step"
    elif default_action == Verdict.ALLOW:
        verdict, rule_id, reason = Verdict.ALLOW, "default", "default allow"
    else:
        verdict, rule_id, reason = Verdict.DENY, "default", "no explicit allow rule matched"
    return Decision(verdict, rule_id, reason, policy_kind=PolicyKind.REGO, policy_revision=revision)


def decision_from_output(
    value: Any,
    *,
    defined: bool = True,
    kind: str,
    default_action: Verdict,
    revision: str,
    entrypoint: str = "the entrypoint",
) -> Decision:
    """Map the entrypoint's value (already JSON-decoded; sets arrive as arrays) to a Decision."""
    if not defined or value in ({}, []):
        return default_decision(default_action, kind, revision)
    try:
        if isinstance(value, dict):
            decision = parse_output_object(value)
        elif isinstance(value, list):
            decision = _combine([_element(v, i) for i, v in enumerate(value)])
        else:
            raise OutputError(
                f"{entrypoint} is {_type_name(value)}, expected an object or a set of objects"
            )
    except OutputError as exc:
        return eval_error(f"{entrypoint}: {exc}", revision)
    return _stamp(decision, revision)


def _element(value: Any, index: int) -> Decision:
    if not isinstance(value, dict):
        raise OutputError(f"element {index} is {_type_name(value)}, expected an object")
    try:
        return parse_output_object(value)
    except OutputError as exc:
        raise OutputError(f"element {index}: {exc}") from None


def _combine(decisions: list[Decision]) -> Decision:
    """Deny-overrides: any deny, else any require_approval, else a judge, else allow; ties by
    rule_id. A judge member is asked only when nothing stricter than allow is in the set: a deny
    stands and a human approval is asked anyway, whatever a model would say."""
    return min(decisions, key=lambda d: (_rank(d), d.rule_id))


def _rank(d: Decision) -> float:
    return 1.5 if d.judge is not None else _VERDICT_RANK[d.verdict]


def parse_output_object(obj: dict[str, Any]) -> Decision:
    """One output object → Decision (policy kind and revision not yet stamped)."""
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise OutputError(f"unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_FIELDS))})")
    if "decision" not in obj:
        raise OutputError('missing "decision"')
    raw = obj["decision"]
    if raw != "judge" and (not isinstance(raw, str) or raw not in _VERDICT_RANK):
        raise OutputError(
            f'unknown decision {raw!r} (expected "allow", "deny", "require_approval" or "judge")'
        )
    judge = _judge(obj.get("judge", {})) if raw == "judge" else None
    if judge is None and "judge" in obj:
        raise OutputError(f'"judge" is only allowed with decision "judge", not {raw!r}')
    rule_id = obj.get("rule_id")
    if rule_id is None:
        raise OutputError('missing "rule_id"')
    if not isinstance(rule_id, str) or not rule_id:
        raise OutputError(f"rule_id must be a non-empty string, not {rule_id!r}")
    if rule_id in _RESERVED_RULE_IDS:
        raise OutputError(f"rule_id {rule_id!r} is reserved for the kernel")
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise OutputError(f"reason must be a string, not {_type_name(reason)}")
    return Decision(
        Verdict(judge.fallback) if judge is not None else Verdict(raw),
        rule_id,
        reason,
        approval=_approval(obj["approval_config"]) if "approval_config" in obj else None,
        rate_limit=_rate_limit(obj["rate_limit"]) if "rate_limit" in obj else None,
        budget=_budget(obj["budget"]) if "budget" in obj else None,
        judge=judge,
    )


def _stamp(d: Decision, revision: str) -> Decision:
    return dataclasses.replace(d, policy_kind=PolicyKind.REGO, policy_revision=revision)


def _section(value: Any, name: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OutputError(f"{name} must be an object, not {_type_name(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise OutputError(f"{name}: unknown field {unknown[0]!r}")
    return value


def _approval(value: Any) -> ApprovalConfig:
    v = _section(value, "approval_config", _APPROVAL_FIELDS)
    approvers = v.get("approvers", [])
    if not isinstance(approvers, list) or not all(isinstance(a, str) for a in approvers):
        raise OutputError("approval_config.approvers must be a list of strings")
    message = v.get("message", "")
    if not isinstance(message, str):
        raise OutputError("approval_config.message must be a string")
    return ApprovalConfig(
        approvers=tuple(approvers),
        timeout_seconds=_duration(v, "timeout", "approval_config"),
        message=message,
    )


def _rate_limit(value: Any) -> RateLimitSpec:
    v = _section(value, "rate_limit", _RATE_FIELDS)
    return RateLimitSpec(
        max_calls=_integer(v, "max_calls", "rate_limit"),
        window_seconds=_duration(v, "window", "rate_limit"),
        per_what=_choice(v, "per_what", "rate_limit", ("execution", "agent", "global", "session")),
        max_wait_seconds=_duration(v, "max_wait", "rate_limit"),
        on_limiter_error=_choice(v, "on_limiter_error", "rate_limit", ("allow", "deny")),
    )


def _judge(value: Any) -> JudgeSpec:
    v = _section(value, "judge", _JUDGE_FIELDS)
    instructions = v.get("instructions", "")
    if not isinstance(instructions, str):
        raise OutputError("judge.instructions must be a string")
    threshold = v.get("threshold", 0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise OutputError(f"judge.threshold must be a number between 0 and 1, not {threshold!r}")
    fallback = _choice(v, "fallback", "judge", ("require_approval", "allow", "deny"))
    return JudgeSpec(instructions=instructions, threshold=float(threshold) or DEFAULT_THRESHOLD,
                     fallback=fallback)


def _budget(value: Any) -> BudgetSpec:
    v = _section(value, "budget", _BUDGET_FIELDS)
    return BudgetSpec(
        max_tokens=_integer(v, "max_tokens", "budget"),
        on_exceed=_choice(v, "on_exceed", "budget", ("deny", "require_approval")),
        scope=_choice(v, "scope", "budget", ("execution", "session")),
    )


def _duration(v: dict[str, Any], key: str, section: str) -> float:
    raw = v.get(key, "0")
    if not isinstance(raw, str):
        raise OutputError(
            f'{section}.{key} must be a duration string such as "30s", not {_type_name(raw)}'
        )
    try:
        return parse_duration(raw)
    except DurationError as exc:
        raise OutputError(f"{section}.{key}: {exc}") from None


def _integer(v: dict[str, Any], key: str, section: str) -> int:
    raw = v.get(key, 0)
    # Rego numbers are JSON numbers: arithmetic may hand back 10.0 for 10.
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise OutputError(f"{section}.{key} must be an integer, not {_type_name(raw)}")
    return raw


def _choice(v: dict[str, Any], key: str, section: str, allowed: tuple[str, ...]) -> str:
    raw = v.get(key, "")
    if raw == "":
        return allowed[0]
    if not isinstance(raw, str) or raw not in allowed:
        raise OutputError(f"{section}.{key} must be one of {', '.join(allowed)}, not {raw!r}")
    return raw


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
