"""Policy test use case (rebuno-v0 §4.5): run cases or replay a recorded execution against a
candidate bundle (or the agent's active one). Nothing is stored and no events are written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from kernel.clock import rfc3339
from kernel.core.kernel import Kernel
from kernel.core.store_ports import ExecutionStore, Transaction
from kernel.domain import EventType
from kernel.errors import NotFound, invalid
from kernel.policy.backtest import RecordedStep, ReplayReport, replay
from kernel.policy.cases import Report, parse_cases, run_cases
from kernel.policy.resolver import (
    CompiledBundle,
    LazyRegoEngine,
    RegoCompiled,
    compile_yaml,
    parse_rego_content,
    yaml_revision,
)

MAX_REPLAY_STEPS = 1000  # steps replayed per execution; the rest are reported as truncated
MAX_EVENTS_READ = 50_000  # events read per execution to find the decisions
_EVENT_PAGE = 1000
_FIRST_DECISION = {
    EventType.STEP_ALLOWED.value: "allow",
    EventType.STEP_DENIED.value: "deny",
    EventType.STEP_AWAITING_APPROVAL.value: "require_approval",
}
_SKIPPED_RULES = {"__indeterminate_retry"}  # kernel guards, not policy decisions


@dataclass(frozen=True, slots=True)
class Candidate:
    kind: str  # yaml | rego
    content: str  # YAML text or the stored Rego JSON mapping


@contextlib.contextmanager
def compiled(k: Kernel, c: Candidate) -> Iterator[CompiledBundle]:
    """Compile a candidate (ValidationError with the compiler's diagnostics on failure)."""
    if c.kind == "yaml":
        yield compile_yaml(c.content, yaml_revision(c.content))
        return
    if c.kind != "rego":
        raise invalid(f"unsupported bundle kind {c.kind!r} (yaml or rego)")
    from kernel.policy.rego import compile_rego_bundle

    lazy = getattr(k.policy, "rego", None)
    own = None if isinstance(lazy, LazyRegoEngine) else LazyRegoEngine(size=1)
    engine = (own or lazy).get()  # type: ignore[union-attr]
    try:
        bundle = compile_rego_bundle(parse_rego_content(c.content), engine=engine)
        yield RegoCompiled(bundle, engine)
    finally:
        if own is not None:
            own.close()


def candidate_for(k: Kernel, tx: ExecutionStore, agent_id: str, given: Candidate | None) -> Candidate:
    if tx.get_agent(agent_id) is None:
        raise NotFound(f"test policy: agent {agent_id!r} not found")
    if given is not None:
        return given
    row = tx.active_policy(agent_id)
    if row is None:
        raise invalid(f'agent "{agent_id}" has no policy bundle')
    return Candidate(row.kind, row.content)


def recorded_steps(tx: Transaction, execution_id: str, agent_id: str, limit: int = MAX_REPLAY_STEPS) -> tuple[list[RecordedStep], bool]:
    """The execution's steps with their first decision event, in event order; (steps, truncated).

    Steps refused by a rate limit have no row (and no recorded args) and are not replayed; a
    grant's or denial's later decision event is ignored (the first one is what the bundle said).
    """
    e = tx.get_execution(execution_id)
    if e is None or e.agent_id != agent_id:
        raise NotFound(f"test policy: execution {execution_id!r} of agent {agent_id!r} not found")
    rows = {s.step_id: s for s in tx.list_steps(execution_id)}
    execution = {"id": e.id, "agent_id": e.agent_id, "input": e.input, "created_at": rfc3339(e.created_at)}
    usage_in = usage_out = 0
    seen: set[str] = set()
    out: list[RecordedStep] = []
    truncated = False
    after, read = 0, 0
    while read < MAX_EVENTS_READ:
        page = tx.list_events(execution_id, after, _EVENT_PAGE)
        if not page:
            break
        read += len(page)
        after = page[-1].event_seq
        for ev in page:
            p = ev.payload
            if ev.type == EventType.STEP_SUCCEEDED.value and isinstance(p.get("usage"), dict):
                usage_in += int(p["usage"].get("input_tokens", 0))
                usage_out += int(p["usage"].get("output_tokens", 0))
                continue
            verdict = _FIRST_DECISION.get(ev.type)
            sid = p.get("step_id")
            if verdict is None or not sid or sid in seen or "rule_id" not in p:
                continue
            seen.add(sid)
            row = rows.get(sid)
            if row is None or p["rule_id"] in _SKIPPED_RULES:
                continue
            if len(out) >= limit:
                truncated = True
                continue
            out.append(RecordedStep(
                execution_id=execution_id, step_id=sid, seq=ev.event_seq, agent_id=e.agent_id,
                kind=row.kind, target=row.target, args=row.args if isinstance(row.args, dict) else None,
                was_decision=verdict, was_rule=str(p["rule_id"]), was_reason=str(p.get("reason") or ""),
                idempotency=row.idempotency, execution=execution,
                usage={"input_tokens": usage_in, "output_tokens": usage_out}, now=rfc3339(ev.occurred_at),
            ))
        if len(page) < _EVENT_PAGE:
            break
    else:
        truncated = True
    return out, truncated


def replay_execution(k: Kernel, agent_id: str, execution_id: str, candidate: Candidate | None) -> ReplayReport:
    with k.store.read() as tx:
        c = candidate_for(k, tx, agent_id, candidate)
        steps, truncated = recorded_steps(tx, execution_id, agent_id)
    with compiled(k, c) as bundle:
        return replay(bundle, steps, truncated=truncated)


BACKTEST_DEFAULT, BACKTEST_MAX = 100, 1000


def backtest(
    k: Kernel, agent_id: str, candidate: Candidate | None, *, session: str | None = None,
    since: datetime | None = None, limit: int = BACKTEST_DEFAULT,
) -> tuple[ReplayReport, int]:
    """Replay the agent's executions, newest first (at most `limit`, of `session` when given,
    stopping at the first created before `since`), through one candidate. (report, executions)."""
    limit = max(1, min(limit, BACKTEST_MAX))
    all_steps: list[RecordedStep] = []
    truncated = False
    with k.store.read() as tx:
        c = candidate_for(k, tx, agent_id, candidate)
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"test policy: agent {agent_id!r} not found")
        rows = tx.list_executions(agent_id, None, None, limit, created_from=since, session=session)
        for e in rows:
            got, cut = recorded_steps(tx, e.id, agent_id)
            all_steps.extend(got)
            truncated = truncated or cut
    with compiled(k, c) as bundle:
        return replay(bundle, all_steps, truncated=truncated), len(rows)


def run_test_cases(k: Kernel, agent_id: str, cases_text: str, candidate: Candidate | None) -> tuple[Report, tuple[str, ...]]:
    """Cases (YAML/JSON text of a case file's `cases`) against the candidate; (report, rule ids)."""
    with k.store.read() as tx:
        c = candidate_for(k, tx, agent_id, candidate)
    cases = parse_cases(cases_text, source="cases", default_agent=agent_id)
    with compiled(k, c) as bundle:
        rule_ids = tuple(getattr(bundle, "rule_ids", ()) or ())
        return run_cases(bundle, cases, rule_ids), rule_ids

