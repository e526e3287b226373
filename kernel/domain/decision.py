"""A policy decision and what the engines see: engine-agnostic, so downstream never asks which
engine decided (approvals, rate limits, budgets, replay, events and tests read only this)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kernel.domain.judge import DEFAULT_THRESHOLD, OUTCOMES, JudgeAnswer, JudgeSpec


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    REQUIRE_APPROVAL = "require_approval"


class PolicyKind(StrEnum):
    YAML = "yaml"
    REGO = "rego"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class ApprovalConfig:
    approvers: tuple[str, ...] = ()
    timeout_seconds: float = 0.0  # 0 → the kernel default
    message: str = ""


@dataclass(frozen=True, slots=True)
class RateLimitSpec:
    max_calls: int
    window_seconds: float
    per_what: str = "execution"  # execution | session | agent | global
    max_wait_seconds: float = 0.0
    on_limiter_error: str = "allow"  # allow | deny

    @property
    def active(self) -> bool:
        return self.max_calls > 0 and self.window_seconds > 0

    def bucket(self, rule_id: str, agent_id: str, execution_id: str, session: str | None) -> str:
        """The limiter key a call counts against: the rule's bucket per execution, session, agent
        or for everyone. `session` on an execution without one is the execution's own bucket."""
        per = self.per_what
        if per == "agent":
            return f"{rule_id}:agent:{agent_id}"
        if per == "global":
            return f"{rule_id}:global"
        if per == "session" and session is not None:
            return f"{rule_id}:session:{session}"
        return f"{rule_id}:exec:{execution_id}"


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    max_tokens: int
    on_exceed: str = "deny"  # deny | require_approval
    scope: str = "execution"  # execution | session (the whole session's executions' tokens)


@dataclass(frozen=True, slots=True)
class PolicyInput:
    """What a bundle is asked about one step (regent.md §3 input document)."""

    agent_id: str
    kind: str
    target: str
    args: Any  # decoded JSON (floats for non-integers), None when absent
    idempotency: str = "safe_to_retry"
    execution: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0})
    now: str = ""  # RFC 3339, from the kernel's clock
    session: str | None = None  # the execution's session, if it has one


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    rule_id: str
    reason: str = ""
    approval: ApprovalConfig | None = None
    rate_limit: RateLimitSpec | None = None
    budget: BudgetSpec | None = None
    policy_kind: PolicyKind = PolicyKind.NONE
    policy_revision: str = ""
    # SHA-256 of the bundle's canonical content (the stored revision's `content_hash`): two bundles
    # with one manifest revision still differ here. Set by the resolver; "" without a bundle.
    policy_hash: str = ""
    # A judge rule before the judge answered (`verdict` holds its fallback until then); the core
    # resolves it with kernel.domain.judge.resolve_judge, which fills `judge_record` for the audit.
    judge: JudgeSpec | None = None
    judge_record: dict[str, Any] | None = None

    @classmethod
    def permissive(cls) -> Decision:
        return cls(Verdict.ALLOW, "permissive")

    @classmethod
    def bundle_error(cls, reason: str, kind: PolicyKind = PolicyKind.NONE, revision: str = "") -> Decision:
        return cls(Verdict.DENY, "bundle-error", reason, policy_kind=kind, policy_revision=revision)


def apply_budget(d: Decision, spend: int) -> Decision:
    """An allow whose token budget `spend` has reached becomes the budget's `on_exceed` answer.
    `spend` is the tokens of the budget's scope: the execution's, or its session's executions'."""
    b = d.budget
    if b is None or b.max_tokens <= 0 or d.verdict != Verdict.ALLOW or spend < b.max_tokens:
        return d
    verdict = Verdict.REQUIRE_APPROVAL if b.on_exceed == "require_approval" else Verdict.DENY
    return dataclasses.replace(d, verdict=verdict, reason="execution_token_budget_exceeded")


def resolve_judge(d: Decision, answer: JudgeAnswer) -> Decision:
    """The final Decision of a judge rule given the judge's answer (`d.judge` must be set)."""
    spec = d.judge
    assert spec is not None, "resolve_judge needs a judge decision"
    threshold = spec.threshold or DEFAULT_THRESHOLD
    record: dict[str, Any] = {
        "instructions": spec.instructions,
        "threshold": threshold,
        "fallback": spec.fallback,
        "latency_ms": round(answer.latency_ms, 1),
    }
    if answer.request is not None:
        record["request"] = dict(answer.request)
    verdict: Verdict
    if not answer.configured:
        verdict, reason = Verdict.DENY, "judge not configured"
    elif answer.probabilities is None:
        verdict, reason = Verdict(spec.fallback), f"judge unavailable: {answer.error}"
        record["error"] = answer.error
    else:
        probs = answer.probabilities
        record["probabilities"] = dict(probs)
        top, p = OUTCOMES[0], -1.0
        for outcome in OUTCOMES:
            if probs.get(outcome, 0.0) > p:
                top, p = outcome, probs.get(outcome, 0.0)
        if p < threshold:
            verdict = Verdict(spec.fallback)
            reason = f"judge: {top} {p:.2f} below threshold {threshold:.2f}"
        else:
            verdict, reason = Verdict(top), f"judge: {top} {p:.2f}"
    record["outcome"] = verdict.value
    return dataclasses.replace(d, verdict=verdict, reason=reason, judge=None, judge_record=record)


# A shadow tally's key: (agreed | disagreed | error, the active bundle's outcome, the shadow's).
TallyKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ShadowRef:
    """An agent's shadow (candidate) bundle being evaluated, without its content."""

    id: int
    agent_id: str
    kind: str
    revision: str
