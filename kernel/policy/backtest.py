"""Replay: feed recorded steps through a candidate bundle and list every decision that would change.

A library: it returns results and never prints (rebuno-v0 §4.4). A change is a different verdict;
a different rule reaching the same verdict is reported (`rule_changed`) but is not a change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kernel.domain import JudgeAnswer, PolicyInput, resolve_judge
from kernel.policy.resolver import CompiledBundle


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One step as the kernel decided it: the input it gave the bundle and the first decision."""

    execution_id: str
    step_id: str
    seq: int  # event_seq of the first decision event
    agent_id: str
    kind: str
    target: str
    args: Any  # decoded; None when absent or not an object
    was_decision: str  # allow | deny | require_approval
    was_rule: str
    was_reason: str = ""
    idempotency: str = "safe_to_retry"
    execution: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0})
    now: str = ""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    step: RecordedStep
    decision: str
    rule_id: str
    reason: str

    @property
    def changed(self) -> bool:
        return self.decision != self.step.was_decision

    @property
    def rule_changed(self) -> bool:
        return self.rule_id != self.step.was_rule


@dataclass
class ReplayReport:
    results: list[ReplayResult] = field(default_factory=list)
    truncated: bool = False  # more steps were recorded than the cap allowed

    @property
    def changes(self) -> list[ReplayResult]:
        return [r for r in self.results if r.changed]

    @property
    def failed(self) -> int:
        return len(self.changes)


def policy_input(s: RecordedStep) -> PolicyInput:
    # args are evaluated exactly like submitted args: JSON-serialised, then decoded.
    args = json.loads(json.dumps(s.args, sort_keys=True)) if s.args is not None else None
    return PolicyInput(agent_id=s.agent_id, kind=s.kind, target=s.target, args=args,
                       idempotency=s.idempotency, execution=dict(s.execution), usage=dict(s.usage), now=s.now)


def replay(bundle: CompiledBundle, steps: list[RecordedStep], *, truncated: bool = False) -> ReplayReport:
    """Evaluate each recorded step with the rule engine only (no rate limits, budgets or guards)."""
    report = ReplayReport(truncated=truncated)
    for s in steps:
        d = bundle.evaluate(policy_input(s))
        if d.judge is not None:  # a replay never calls out: the rule's fallback stands in
            d = resolve_judge(d, JudgeAnswer.unavailable("the judge is not asked in a replay"))
        report.results.append(ReplayResult(s, d.verdict.value, d.rule_id, d.reason))
    return report


def result_json(r: ReplayResult) -> dict[str, Any]:
    """One result in the §4.2 report shape (replay fields; `pass` false exactly when it changed)."""
    s = r.step
    out: dict[str, Any] = {"agent_id": s.agent_id, "kind": s.kind, "target": s.target}
    if s.args:
        out["args"] = s.args
    out.update(expect=s.was_decision, execution_id=s.execution_id, step_id=s.step_id, was_rule=s.was_rule,
               decision=r.decision, rule_id=r.rule_id)
    if r.reason:
        out["reason"] = r.reason
    out["pass"] = not r.changed
    if r.changed:
        out["failure"] = f"{r.decision}, want {s.was_decision}"
    out["seq"] = s.seq
    out["rule_changed"] = r.rule_changed
    return out
