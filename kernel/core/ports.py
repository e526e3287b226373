"""The seams the core sees: the policy resolver, the rate limiter, the judge and the shadow
observer, as small Protocols.

The store's Protocols are in `store_ports.py` (`Store`, `Transaction` and its parts); the app
factory is the one place that picks concrete classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kernel.domain import Decision, JudgeAnswer, JudgeSpec, LimitOutcome, PolicyInput, RateLimitSpec
from kernel.policy.source import BundleReads


class PolicyResolver(Protocol):
    """Agent → active bundle → decision. Never raises: any fault is a deny `bundle-error`.

    `tx` is the submit's open transaction: a resolver that reads the store reads the active
    revision there, in the same snapshot as the execution (and without a transaction of its own).
    """

    def decide(self, inp: PolicyInput, tx: BundleReads | None = None, bundle_id: int | None = None) -> Decision: ...

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        """The `targets` the agent's active bundle denies whatever the arguments (docs/mcp.md,
        "Hiding denied tools"). Sound and never raises: when in doubt (a Rego bundle, no bundle, a
        fault), none."""
        ...

    def check(self, kind: str, content: str) -> str:
        """The load gate: compile without storing; returns the revision or raises ValidationError."""
        ...


class PermissiveResolver:
    """No bundles at all: every step is allowed with rule id `permissive`."""

    def decide(self, inp: PolicyInput, tx: BundleReads | None = None, bundle_id: int | None = None) -> Decision:
        return Decision.permissive()

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def check(self, kind: str, content: str) -> str:
        from kernel.errors import invalid

        raise invalid("this kernel has no policy engines")


class Limiter(Protocol):
    def hit(self, key: str, spec: RateLimitSpec) -> LimitOutcome: ...

    def peek(self, key: str, spec: RateLimitSpec) -> LimitOutcome:
        """Would a call be admitted now? Consumes nothing (the shadow bundle's view)."""
        ...


class NoLimiter:
    def hit(self, key: str, spec: RateLimitSpec) -> LimitOutcome:
        return LimitOutcome(admitted=True)

    def peek(self, key: str, spec: RateLimitSpec) -> LimitOutcome:
        return LimitOutcome(admitted=True)


@dataclass(frozen=True, slots=True)
class ShadowObservation:
    """One step the active bundle decided, handed to the shadow once the answer has committed."""

    execution_id: str
    step_id: str
    observed_at: datetime  # the step's `now`
    inp: PolicyInput  # exactly what the active bundle saw (same now, usage, execution)
    active: Decision  # as the active bundle returned it
    outcome: str  # what the agent was answered: allow | deny | require_approval | rate_limited
    limit_key: str | None = None  # the bucket the active decision's rate limit hit, if any
    limit: LimitOutcome | None = None  # and what the limiter said


class ShadowObserver(Protocol):
    """Evaluates an agent's shadow bundle beside the active one; never decides, never blocks."""

    def wants(self, agent_id: str) -> bool:
        """Cheap (an in-memory lookup): does this agent have a shadow being evaluated?"""
        ...

    def observe(self, obs: ShadowObservation) -> None:
        """Queue one observation; returns at once (a full queue drops it and counts the drop)."""
        ...

    def reload(self) -> None:
        """Re-read which agents have a shadow (after this replica changed one)."""
        ...

    def backlog(self) -> int:
        """Observations queued or judged but not yet recorded, in this process."""
        ...


class NoShadow:
    def wants(self, agent_id: str) -> bool:
        return False

    def observe(self, obs: ShadowObservation) -> None:
        return None

    def reload(self) -> None:
        return None

    def backlog(self) -> int:
        return 0

class DecisionLog(Protocol):
    """Where the core hands decision-log entries once their transaction has committed
    (kernel/decisionlog). `submit` never blocks on a sink and never raises."""

    enabled: bool

    def submit(self, entries: list[dict[str, Any]]) -> None: ...


class NoDecisionLog:
    enabled = False

    def submit(self, entries: list[dict[str, Any]]) -> None:
        return None


class Judge(Protocol):
    """Asks a `judge` rule's model (kernel.judge). Never raises: any failure is an answer saying
    why, which the rule's fallback decides. Awaited on the event loop, outside any transaction."""

    async def ask(self, spec: JudgeSpec, inp: PolicyInput) -> JudgeAnswer: ...


class NoJudge:
    """No judge provider configured: a judge rule denies with `judge not configured`."""

    async def ask(self, spec: JudgeSpec, inp: PolicyInput) -> JudgeAnswer:
        return JudgeAnswer.not_configured()
