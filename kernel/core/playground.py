"""The policy playground: one step evaluated by the agent's active bundle and by a candidate,
each with the explanation `regent policy eval --explain` prints. Nothing is stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.core.kernel import Kernel
from kernel.core.policy_test import Candidate, compiled
from kernel.domain import Decision, JudgeAnswer, PolicyInput, resolve_judge
from kernel.errors import NotFound


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one bundle decided for the input, and why."""

    label: str  # "active" | "candidate"
    kind: str
    revision: str
    decision: str
    rule_id: str
    reason: str
    explain: list[str]


def explain(bundle: Any, inp: PolicyInput) -> tuple[Decision, list[str]]:
    """The decision and its explanation, as `regent policy eval --explain` prints it
    (kernel/policy/explain.py): YAML, each rule in file order; Rego, the decision set with the
    overridden members, a per-expression trace with file:line and the policy's print lines."""
    from kernel.policy.explain import explain_document, explain_lines

    d = bundle.evaluate(inp)
    lines = explain_lines(explain_document(bundle, inp))
    return d, lines[1:]


def _evaluate(k: Kernel, label: str, c: Candidate, inp: PolicyInput) -> Evaluation:
    with compiled(k, c) as bundle:
        d, lines = explain(bundle, inp)
        if d.judge is not None:  # the playground never calls a model: the rule's fallback shows
            d = resolve_judge(d, JudgeAnswer.unavailable("the playground does not ask the judge"))
        return Evaluation(label, c.kind, bundle.revision, d.verdict.value, d.rule_id, d.reason, lines)


def compare(k: Kernel, agent_id: str, inp: PolicyInput, candidate: Candidate | None) -> list[Evaluation]:
    """The active bundle's evaluation (when the agent has one) and the candidate's (when given).
    A candidate that does not compile raises ValidationError with the load gate's diagnostics."""
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        row = tx.active_policy(agent_id)
    out = []
    if row is not None:
        out.append(_evaluate(k, "active", Candidate(row.kind, row.content), inp))
    if candidate is not None:
        out.append(_evaluate(k, "candidate", candidate, inp))
    return out


MAX_REPLAY_EXECUTIONS = 100


@dataclass(frozen=True, slots=True)
class RecentReplay:
    executions: int  # replayed
    steps: int  # decisions replayed
    changes: list[Any]  # ReplayResult of each decision that would change
    truncated: bool  # some execution had more steps than the replay cap


def replay_recent(k: Kernel, agent_id: str, n: int, candidate: Candidate | None) -> RecentReplay:
    """The agent's last `n` executions (at most MAX_REPLAY_EXECUTIONS) replayed against the
    candidate (or the active bundle): every recorded decision that would change."""
    from kernel.core.policy_test import candidate_for, recorded_steps
    from kernel.policy.backtest import replay

    n = max(1, min(n, MAX_REPLAY_EXECUTIONS))
    with k.store.read() as tx:
        c = candidate_for(k, tx, agent_id, candidate)
        recent = tx.list_executions(agent_id, None, None, n)
        recorded = [recorded_steps(tx, e.id, agent_id) for e in recent]
    with compiled(k, c) as bundle:
        reports = [replay(bundle, steps, truncated=truncated) for steps, truncated in recorded]
    return RecentReplay(len(recent), sum(len(r.results) for r in reports),
                        [ch for r in reports for ch in r.changes], any(r.truncated for r in reports))
