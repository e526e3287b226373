"""The `judge` decision (rebuno-v0 §3.6): a rule's question to a model, and its answer; pure.

A judge rule's Decision carries a `JudgeSpec` until the judge has answered;
`kernel.domain.decision.resolve_judge` then turns the answer into an allow, deny or require_approval Decision with the upstream reasons
(`judge: deny 0.91`, `judge: allow 0.40 below threshold 0.60`, `judge unavailable: …`,
`judge not configured`) and a record of what was asked and answered, for the audit trail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
