"""The `judge` decision (rebuno-v0 §3.6): a rule's question to a model, and its answer; pure.

A judge rule's Decision carries a `JudgeSpec` until the judge has answered; `resolve_judge` then
turns the answer into an allow, deny or require_approval Decision with the upstream reasons
(`judge: deny 0.91`, `judge: allow 0.40 below threshold 0.60`, `judge unavailable: …`,
`judge not configured`) and a record of what was asked and answered, for the audit trail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel.domain.decision import Decision, Verdict

DEFAULT_THRESHOLD = 0.6
# Ties go to the more careful outcome: the first of these with the highest probability wins.
OUTCOMES = ("deny", "require_approval", "allow")


@dataclass(frozen=True, slots=True)
class JudgeSpec:
    """A rule's `judge` block. A threshold of 0 means the default, as upstream."""

    instructions: str = ""
    threshold: float = DEFAULT_THRESHOLD
    fallback: str = "require_approval"  # allow | deny | require_approval


@dataclass(frozen=True, slots=True)
class JudgeAnswer:
    """What asking the judge gave: probabilities, or why there are none."""

    probabilities: Mapping[str, float] | None = None
    error: str = ""  # why the judge could not be asked or answered nothing usable
    configured: bool = True
    latency_ms: float = 0.0
    request: Mapping[str, Any] | None = None  # what was asked (masked; never headers)

    @classmethod
    def not_configured(cls) -> JudgeAnswer:
        return cls(configured=False, error="judge not configured")

    @classmethod
    def mocked(cls, probabilities: Mapping[str, float] | None) -> JudgeAnswer:
        """A policy test's stand-in (`context.judge`, `--judge`); none given: not configured."""
        if probabilities is None:
            return cls.not_configured()
        return cls(probabilities=dict(probabilities), request={"mocked": True})

    @classmethod
    def unavailable(cls, error: str, latency_ms: float = 0.0,
                    request: Mapping[str, Any] | None = None) -> JudgeAnswer:
        return cls(error=error, latency_ms=latency_ms, request=request)


def resolve_judge(d: Decision, answer: JudgeAnswer) -> Decision:
    """The final Decision of a judge rule given the judge's answer (`d.judge` must be set)."""
    from kernel.domain.decision import Verdict

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
