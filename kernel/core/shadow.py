"""Shadow bundles: store, read and clear an agent's candidate bundle; judge one observed step
against it (same input, same rate-limit view, nothing consumed); record the tallies and the
disagreements; promote the candidate and roll back (docs/policy-rollout.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from kernel.core import decision_log as dlog
from kernel.core.kernel import Kernel
from kernel.core.policies import Actor, PolicyRevision, _with_trail, refuse_if_pulled
from kernel.core.ports import LimitOutcome, ShadowObservation
from kernel.core.retention import delete_in_batches
from kernel.domain import Decision, PolicyEventType, PolicyInput, Verdict
from kernel.domain.decision import ShadowRef, TallyKey, apply_budget
from kernel.domain.policy_event import ACTIVATIONS
from kernel.errors import Conflict, NotFound, invalid

FAULT_RULES = frozenset({"eval-error", "bundle-error"})
RATE_LIMITED = "rate_limited"


@dataclass(frozen=True, slots=True)
class Shadow:
    id: int
    agent_id: str
    kind: str
    revision: str
    content: str
    status: str
    created_at: datetime
    created_by: str | None
    ended_at: datetime | None
    last_error: str | None


class ShadowPolicy(Protocol):
    """Evaluates a shadow bundle; never raises (a fault is a deny `eval-error`/`bundle-error`)."""

    def evaluate(self, ref: ShadowRef, inp: PolicyInput) -> Decision: ...


def _shadow(row: Any) -> Shadow:
    return Shadow(int(row.id), row.agent_id, row.kind, row.revision, row.content, row.status, row.created_at,
                  row.created_by, row.ended_at, row.last_error)


def _known_agent(tx: Any, agent_id: str) -> None:
    if tx.get_agent(agent_id) is None:
        raise NotFound(f"agent {agent_id!r} not found")


# -- admin use cases ---------------------------------------------------------------------------


def store_shadow(k: Kernel, agent_id: str, kind: str, content: str, actor: Actor) -> Shadow:
    """Validate (the load gate of `POST /v0/policies/{agent_id}`) and store the agent's shadow,
    replacing any other; its tallies start at zero. The same bundle again keeps the shadow (and
    its tallies) as it is."""
    with k.store.read() as tx:
        _known_agent(tx, agent_id)
        same = tx.current_shadow(agent_id)
    if same is not None and same.kind == kind and same.content == content:
        return _shadow(same)
    if kind == "yaml" and not content.strip():
        raise invalid("a shadow bundle cannot be empty (DELETE the shadow to stop it)")
    revision = k.policy.check(kind, content)
    now = k.clock.now()
    with k.store.transaction(lock=f"policy:{agent_id}") as tx:
        sid = tx.add_shadow(agent_id, kind, revision, content, now, actor.name)
        tx.add_policy_event(agent_id, PolicyEventType.SHADOW_SET, now, actor=actor.name, credential=actor.credential,
                            shadow_id=sid, payload={"kind": kind, "revision": revision})
        row = tx.get_shadow(sid)
    k.shadow.reload()
    return _shadow(row)


def get_shadow(k: Kernel, agent_id: str) -> Shadow:
    with k.store.read() as tx:
        _known_agent(tx, agent_id)
        row = tx.current_shadow(agent_id)
    if row is None:
        raise NotFound(f"agent {agent_id!r} has no shadow bundle")
    return _shadow(row)


def clear_shadow(k: Kernel, agent_id: str, actor: Actor) -> None:
    now = k.clock.now()
    with k.store.transaction(lock=f"policy:{agent_id}") as tx:
        _known_agent(tx, agent_id)
        row = tx.current_shadow(agent_id)
        if row is None:
            raise NotFound(f"agent {agent_id!r} has no shadow bundle")
        tx.end_shadows(agent_id, "cleared", now)
        tx.add_policy_event(agent_id, PolicyEventType.SHADOW_CLEARED, now, actor=actor.name, credential=actor.credential,
                            shadow_id=int(row.id), payload={"revision": row.revision})
    k.shadow.reload()


def promote_shadow(k: Kernel, agent_id: str, actor: Actor) -> PolicyRevision:
    """The shadow becomes the active revision in one transaction; the old active stays in the
    revision history (rollback restores it)."""
    now = k.clock.now()
    with k.store.transaction(lock=f"policy:{agent_id}") as tx:
        _known_agent(tx, agent_id)
        sh = tx.current_shadow(agent_id)
        if sh is None:
            raise NotFound(f"agent {agent_id!r} has no shadow bundle to promote")
        refuse_if_pulled(k, agent_id, actor, "promoting its shadow")
        old = tx.active_policy(agent_id)
        seq = tx.add_policy_revision(agent_id, sh.kind, sh.revision, sh.content, now)
        tx.end_shadows(agent_id, "promoted", now)
        tx.add_policy_event(
            agent_id, PolicyEventType.PROMOTED, now, actor=actor.name, credential=actor.credential, seq=seq,
            shadow_id=int(sh.id),
            payload={"revision": sh.revision, "kind": sh.kind, "from_seq": old.seq if old is not None else None,
                     "from_revision": old.revision if old is not None else None},
        )
        rev = _with_trail(tx, agent_id, [next(r for r in tx.list_policy_revisions(agent_id) if r.seq == seq)])[0]
    k.shadow.reload()
    return rev


def rollback_policy(k: Kernel, agent_id: str, actor: Actor) -> PolicyRevision:
    """Re-activate the revision that was active before the current one became active. Twice in a
    row toggles back, like `rollout undo`. Never to "no bundle" (that would allow everything):
    clearing stays an explicit `POST /v0/policies/{agent_id}` with an empty bundle."""
    now = k.clock.now()
    with k.store.transaction(lock=f"policy:{agent_id}") as tx:
        _known_agent(tx, agent_id)
        refuse_if_pulled(k, agent_id, actor, "rolling back")
        active = tx.active_policy(agent_id)
        current = int(active.seq) if active is not None else None
        target = _previous_activation(tx.policy_events(agent_id, 1000, ACTIVATIONS), current)
        if target is _NONE_FOUND:
            below = [int(r.seq) for r in tx.list_policy_revisions(agent_id) if current is not None and r.seq < current]
            if not below:
                raise Conflict(f"conflict: agent {agent_id!r} has no earlier policy revision to roll back to")
            target = max(below)
        if target is None:
            raise Conflict(f"conflict: before the current revision agent {agent_id!r} had no policy bundle; "
                           "rollback never clears the policy (post an empty bundle to do that)")
        tx.activate_policy_revision(agent_id, int(target))
        row = next(r for r in tx.list_policy_revisions(agent_id) if r.seq == target)
        tx.add_policy_event(
            agent_id, PolicyEventType.ROLLED_BACK, now, actor=actor.name, credential=actor.credential, seq=int(target),
            payload={"from_seq": current, "to_seq": target, "kind": row.kind, "revision": row.revision},
        )
        return _with_trail(tx, agent_id, [row])[0]


_NONE_FOUND: Any = object()


def _previous_activation(events: list[Any], current: int | None) -> Any:
    """From the activations, newest first: the seq active before the current activation (None for
    "no bundle"), or _NONE_FOUND when the log does not describe the current state (activations
    made before the log existed) or has nothing before it."""
    if not events or current is None or _seq_of(events[0]) != current:
        return _NONE_FOUND
    return _seq_of(events[1]) if len(events) > 1 else _NONE_FOUND


def _seq_of(e: Any) -> int | None:
    return None if e.type == PolicyEventType.CLEARED or e.seq is None else int(e.seq)


def list_policy_events(k: Kernel, agent_id: str, limit: int = 100) -> list[Any]:
    with k.store.read() as tx:
        _known_agent(tx, agent_id)
        return tx.policy_events(agent_id, limit)


# -- judging one step ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Judgement:
    """The shadow's answer to one observed step, compared with what the agent was answered."""

    obs: ShadowObservation
    ref: ShadowRef
    decision: Decision | None  # None when the shadow faulted
    outcome: str  # the shadow's answer (allow, deny, require_approval, rate_limited) or the fault class
    error: str | None = None  # the fault's reason

    @property
    def agreed(self) -> bool:
        return (self.error is None and self.decision is not None and self.outcome == self.obs.outcome
                and self.decision.rule_id == self.obs.active.rule_id)

    @property
    def tally_key(self) -> TallyKey:
        kind = "error" if self.error is not None else ("agreed" if self.agreed else "disagreed")
        return kind, self.obs.outcome, self.outcome


def fault_class(d: Decision) -> str:
    if d.rule_id == "bundle-error":
        return "bundle-error"
    if "timed out" in d.reason:
        return "timeout"
    if "crashed" in d.reason:
        return "crash"
    return "eval-error"


def judge(k: Kernel, policy: ShadowPolicy, ref: ShadowRef, obs: ShadowObservation) -> Judgement:
    """Evaluate the shadow on the active bundle's input, then apply its rate limit and budget the
    way the step path does, but read-only: a bucket the active decision hit is answered with the
    active's own limiter outcome (no second hit); any other bucket is peeked, not consumed."""
    d = policy.evaluate(ref, obs.inp)
    if d.rule_id in FAULT_RULES:
        return Judgement(obs, ref, None, fault_class(d), d.reason or d.rule_id)
    outcome = d.verdict.value
    spec = d.rate_limit
    if spec is not None and spec.active:
        key = spec.bucket(d.rule_id, obs.inp.agent_id, str(obs.inp.execution.get("id", "")), obs.inp.session)
        view: LimitOutcome
        if obs.limit is not None and key == obs.limit_key and spec == obs.active.rate_limit:
            view = obs.limit
        else:
            view = k.limiter.peek(key, spec)
        refused = spec.on_limiter_error == "deny" if view.error is not None else not view.admitted
        if refused:
            return Judgement(obs, ref, d, RATE_LIMITED)
    budget = d.budget
    if budget is not None and budget.max_tokens > 0 and d.verdict == Verdict.ALLOW:
        if budget.scope == "session" and obs.inp.session:
            # The session's executions' tokens as the step path counts them, read now: the
            # observation carries only this execution's.
            with k.store.read() as tx:
                spend = sum(tx.session_usage(obs.inp.session))
        else:
            spend = int(obs.inp.usage.get("input_tokens", 0)) + int(obs.inp.usage.get("output_tokens", 0))
        d = apply_budget(d, spend)
        outcome = d.verdict.value
    return Judgement(obs, ref, d, outcome)


# -- recording ---------------------------------------------------------------------------------


@dataclass
class Batch:
    """What one flush writes for one shadow: counters, disagreement rows, the latest fault."""

    tallies: dict[TallyKey, int] = field(default_factory=dict)
    disagreements: list[dict[str, Any]] = field(default_factory=list)
    last_error: str | None = None
    logged: list[Judgement] = field(default_factory=list)  # disagreements and faults: decision-log entries

    def add(self, j: Judgement) -> None:
        key = j.tally_key
        self.tallies[key] = self.tallies.get(key, 0) + 1
        if j.error is not None:
            self.last_error = j.error
            self.logged.append(j)
        elif not j.agreed:
            self.disagreements.append(disagreement_row(j))
            self.logged.append(j)

    def drop(self, active_outcome: str) -> None:
        key = ("dropped", active_outcome, "")
        self.tallies[key] = self.tallies.get(key, 0) + 1

    def skip(self, active_outcome: str) -> None:
        """Not evaluated: the shadow is paused after consecutive faults."""
        key = ("skipped", active_outcome, "")
        self.tallies[key] = self.tallies.get(key, 0) + 1

    def __len__(self) -> int:
        return sum(self.tallies.values())


def disagreement_row(j: Judgement) -> dict[str, Any]:
    a, s, o = j.obs.active, j.decision, j.obs
    assert s is not None
    return {
        "shadow_id": j.ref.id, "agent_id": o.inp.agent_id, "execution_id": o.execution_id, "step_id": o.step_id,
        "kind": o.inp.kind, "target": o.inp.target,
        "active_decision": o.outcome, "active_rule_id": a.rule_id, "active_reason": a.reason or None,
        "active_revision": a.policy_revision or None,
        "shadow_decision": j.outcome, "shadow_rule_id": s.rule_id, "shadow_reason": s.reason or None,
        "shadow_revision": s.policy_revision or j.ref.revision,
        "occurred_at": o.observed_at,
    }


def record(k: Kernel, batches: dict[int, Batch]) -> None:
    """One transaction per shadow, under the lock `shadow:<id>` (replicas add to one counter row)."""
    for shadow_id, b in batches.items():
        if not len(b):
            continue
        # The decision log gets the disagreements and faults once this transaction has committed.
        with dlog.collect(k), k.store.transaction(lock=f"shadow:{shadow_id}") as tx:
            if tx.get_shadow(shadow_id) is None:
                continue  # the agent was deleted meanwhile
            tx.add_shadow_tallies(shadow_id, b.tallies)
            tx.add_shadow_disagreements(b.disagreements)
            if b.last_error is not None:
                tx.set_shadow_error(shadow_id, b.last_error)
            for j in b.logged:
                dlog.note_shadow(
                    k, agent_id=j.obs.inp.agent_id, execution_id=j.obs.execution_id, step_id=j.obs.step_id,
                    inp=j.obs.inp, active=j.obs.active, active_outcome=j.obs.outcome, shadow=j.decision,
                    shadow_outcome=j.outcome,
                    shadow_revision=(j.decision.policy_revision if j.decision else "") or j.ref.revision,
                    now=j.obs.observed_at, error=j.error)


def delete_expired_disagreements(k: Kernel, batch: int = 1000, max_batches: int = 100) -> int:
    """Retention of the disagreement rows (`shadow_retention`; 0 keeps them for ever), in bounded
    batches. The tallies stay, so a report's totals still count what was deleted; its top targets,
    top rules and samples come from the rows kept."""
    if k.shadow_retention <= 0:
        return 0
    cutoff = k.clock.now() - timedelta(seconds=k.shadow_retention)
    return delete_in_batches(k, lambda tx, before, n: tx.delete_shadow_disagreements_before(before, n), cutoff,
                             batch, max_batches)


def shadowing_refs(k: Kernel) -> list[ShadowRef]:
    with k.store.read() as tx:
        return [ShadowRef(int(r.id), r.agent_id, r.kind, r.revision) for r in tx.shadowing_refs()]


# -- the report ----------------------------------------------------------------------------------


def shadow_report(k: Kernel, agent_id: str, shadow_id: int | None = None, *, samples: int = 20,
                  top: int = 10) -> dict[str, Any]:
    """Totals, disagreement pairs, fault classes, the most frequent disagreeing targets and rules,
    and the latest disagreements; of the current shadow, else the latest one (or `shadow_id`)."""
    with k.store.read() as tx:
        _known_agent(tx, agent_id)
        row = tx.get_shadow(shadow_id) if shadow_id is not None else (
            tx.current_shadow(agent_id) or tx.latest_shadow(agent_id))
        if row is None or row.agent_id != agent_id:
            raise NotFound(f"agent {agent_id!r} has no shadow bundle" if shadow_id is None
                           else f"agent {agent_id!r} has no shadow {shadow_id}")
        sid = int(row.id)
        tallies = tx.shadow_tallies(sid)
        targets = tx.shadow_disagreement_counts(sid, "target", top)
        active_rules = tx.shadow_disagreement_counts(sid, "active_rule_id", top)
        shadow_rules = tx.shadow_disagreement_counts(sid, "shadow_rule_id", top)
        recent = tx.shadow_disagreement_samples(sid, samples)
    return {
        "agent_id": agent_id,
        "shadow": _shadow(row),
        "totals": _totals(tallies),
        "disagreements": _pairs(tallies, "disagreed"),
        "agreements": _pairs(tallies, "agreed"),
        "errors": {r.shadow_decision: int(r.count) for r in tallies if r.outcome == "error"},
        "top_targets": targets,
        "top_active_rules": active_rules,
        "top_shadow_rules": shadow_rules,
        "samples": recent,
        "pending": k.shadow.backlog(),
    }


def pair(active: str, shadow: str) -> str:
    return f"{active}→{shadow}"


def _pairs(tallies: Iterable[Any], outcome: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in tallies:
        if r.outcome == outcome:
            key = pair(r.active_decision, r.shadow_decision)
            out[key] = out.get(key, 0) + int(r.count)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _totals(tallies: Iterable[Any]) -> dict[str, int]:
    by = {"agreed": 0, "disagreed": 0, "error": 0, "dropped": 0, "skipped": 0}
    for r in tallies:
        by[r.outcome] = by.get(r.outcome, 0) + int(r.count)
    return {
        "evaluated": by["agreed"] + by["disagreed"] + by["error"],
        "agreed": by["agreed"],
        "disagreed": by["disagreed"],
        "errors": by["error"],
        "dropped": by["dropped"],
        "skipped": by["skipped"],
    }
