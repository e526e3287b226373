"""Forks: a new execution rerunning an existing one, recorded through an event seq and live after.

A fork copies nothing when it is created: it names its source and the fork point (`forked_from`,
`fork_seq`), and that is its lineage. Its rerun looks each step up in its own steps first (one
primary-key lookup, as any execution's does); a step it has not recorded yet is looked up, by
the id the source gave it, among the source's steps whose outcome event (succeeded, failed,
denied) is at or before `fork_seq` (`steps.outcome_seq`, set when the outcome is appended). A hit
is written into the fork, with its `step.proposed` and outcome events, and replayed; a miss runs
live, under policy (the fork's own bundle, when it has one). Creating a fork therefore costs the
same whatever the length of the source's history (docs/api.md, "Forks").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from kernel.core import events as ev
from kernel.core import resources
from kernel.core.kernel import Kernel
from kernel.core.leases import enqueue
from kernel.domain import EventType, Execution, ExecutionStatus
from kernel.errors import NotFound, invalid
from kernel.ids import new_uuid7

# The outcomes a fork point can follow.
_OUTCOME_EVENTS = frozenset({EventType.STEP_SUCCEEDED.value, EventType.STEP_FAILED.value, EventType.STEP_DENIED.value})


@dataclass(frozen=True, slots=True)
class ForkBundle:
    kind: str  # yaml | rego
    content: str  # YAML text, or the Rego bundle's canonical JSON


def fork_execution(
    k: Kernel, source_id: str, at_seq: int, session: str | None = None, bundle: ForkBundle | None = None,
) -> Execution:
    now = k.clock.now()
    with k.store.read() as tx:
        src = tx.get_execution(source_id)
        if src is None:
            raise NotFound("execution not found")
        last = tx.last_event_seq(source_id)
        if not 0 <= at_seq <= last:
            raise invalid(f"at_seq must be between 0 and {last} (the last event)")
    revision = k.policy.check(bundle.kind, bundle.content) if bundle is not None else None  # the load gate
    eid = new_uuid7()
    with k.store.transaction(session=session) as tx:
        plan = resources.plan_restoration(tx, src.id, at_seq)
        bundle_id = (tx.insert_fork_bundle(src.agent_id, bundle.kind, revision or "", bundle.content, now)
                     if bundle is not None else None)
        e = Execution(
            id=eid, agent_id=src.agent_id, input=src.input, status=ExecutionStatus.RUNNING, created_at=now,
            updated_at=now, deadline_at=src.deadline_at and now + (src.deadline_at - src.created_at),
            session=session, parent_execution_id=None, previous_execution_id=src.previous_execution_id,
            forked_from=src.id, fork_seq=at_seq, fork_bundle_id=bundle_id,
            restoration=resources.restoration(plan),
        )
        queued_behind = session is not None and tx.session_occupied(session)
        if queued_behind:
            e = dataclasses.replace(e, status=ExecutionStatus.PENDING)
        tx.insert_execution(e)
        resources.restore_into_fork(tx, plan, eid, now)
        head = [
            ev.execution(EventType.EXECUTION_CREATED, eid, ExecutionStatus.PENDING, session=session),
            ev.execution(EventType.EXECUTION_FORKED, eid, ExecutionStatus.PENDING, forked_from=src.id,
                         fork_seq=at_seq, policy_revision=revision, restoration=e.restoration),
        ]
        if not queued_behind:
            _, queued = enqueue(k, tx, eid, now)
            head += [
                ev.execution(EventType.EXECUTION_STARTED, eid, ExecutionStatus.RUNNING,
                             previous_execution_id=e.previous_execution_id),
                queued,
            ]
        tx.append(eid, now, head)
    return e


def fork_points(k: Kernel, execution_id: str) -> list[dict[str, Any]]:
    """Where a fork can start: before any step (seq 0), and after each recorded step outcome.
    `covered`: every resource registered by then has a checkpoint covering that seq (true when
    there are none); `resources` has the answer per resource when the execution has any."""
    from kernel.clock import rfc3339

    with k.store.read() as tx:
        if tx.get_execution(execution_id) is None:
            raise NotFound("execution not found")
        rows = tx.events_upto(execution_id, 2**62)
        covered_at = resources.coverage(tx, execution_id)

    def point(seq: int, **fields: Any) -> dict[str, Any]:
        per = covered_at(seq)
        out = {"event_seq": seq, **fields, "covered": all(per.values())}
        if per:
            out["resources"] = per
        return out

    out: list[dict[str, Any]] = [point(0, steps=0)]
    n = 0
    for r in rows:
        if r.type not in _OUTCOME_EVENTS:
            continue
        n += 1
        p = json.loads(r.payload)
        out.append(point(int(r.event_seq), type=r.type, step_id=p.get("step_id"), target=p.get("target"), steps=n,
                         occurred_at=rfc3339(r.occurred_at)))
    return out
