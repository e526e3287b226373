"""Forks: a new execution rerunning an existing one, recorded through an event seq and live after.

The fork copies the source's steps that reached a terminal outcome (succeeded, failed, denied) at
or before `at_seq`, under the step ids the fork computes for them, and their `step.*` events,
ahead of its own `execution.started`: its rerun replays them through the normal replay path and
runs everything after the fork point live, under policy (its own bundle, when it has one). The
copy is two bulk inserts (steps, events) in the transaction that creates the fork.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from kernel.core import events as ev
from kernel.core.dispatch import enqueue
from kernel.core.kernel import Kernel
from kernel.domain import EventType, Execution, ExecutionStatus
from kernel.domain.step import TERMINAL_STEP_STATUSES
from kernel.errors import NotFound, ValidationError
from kernel.identity import new_uuid7
from kernel.identity import step_id as compute_step_id
from kernel.store import codec
from kernel.store import tables as t

# The outcomes a fork point can follow, and the events copied with the steps they name.
_OUTCOME_EVENTS = frozenset({EventType.STEP_SUCCEEDED.value, EventType.STEP_FAILED.value, EventType.STEP_DENIED.value})
_REPLAYABLE = frozenset(s.value for s in TERMINAL_STEP_STATUSES) - {"cancelled"}


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
            raise ValidationError(f"validation error: at_seq must be between 0 and {last} (the last event)")
        rows = tx.events_upto(source_id, at_seq)
        outcome_ids = [json.loads(r.payload).get("step_id") for r in rows if r.type in _OUTCOME_EVENTS]
        steps = [s for s in tx.step_rows([i for i in outcome_ids if i]) if s.status in _REPLAYABLE]
    revision = k.policy.check(bundle.kind, bundle.content) if bundle is not None else None  # the load gate
    eid = new_uuid7()
    renamed = {s.step_id: compute_step_id(eid, s.kind, s.target, s.args_hash, s.occurrence) for s in steps}
    step_rows = [
        {**{c.key: getattr(s, c.key) for c in t.steps.c}, "step_id": renamed[s.step_id], "execution_id": eid}
        for s in steps
    ]
    copied = []
    for r in rows:
        if not r.type.startswith("step."):
            continue
        payload = json.loads(r.payload)
        new_id = renamed.get(payload.get("step_id", ""))
        if new_id is not None:
            payload["step_id"] = new_id
            copied.append((r.type, payload, r.occurred_at))
    usage_in = sum(int(s.usage_input or 0) for s in steps)
    usage_out = sum(int(s.usage_output or 0) for s in steps)
    with k.store.transaction(session=session) as tx:
        bundle_id = (tx.insert_fork_bundle(src.agent_id, bundle.kind, revision or "", bundle.content, now)
                     if bundle is not None else None)
        e = Execution(
            id=eid, agent_id=src.agent_id, input=src.input, status=ExecutionStatus.RUNNING, created_at=now,
            updated_at=now, deadline_at=src.deadline_at and now + (src.deadline_at - src.created_at),
            session=session, parent_execution_id=None, previous_execution_id=src.previous_execution_id,
            forked_from=src.id, fork_seq=at_seq, fork_bundle_id=bundle_id,
        )
        queued_behind = session is not None and tx.session_occupied(session)
        if queued_behind:
            e = dataclasses.replace(e, status=ExecutionStatus.PENDING)
        tx.insert_execution(e)
        tx.insert_many(t.steps, step_rows)
        head = [
            ev.execution(EventType.EXECUTION_CREATED, eid, ExecutionStatus.PENDING, session=session),
            *[(typ, payload) for typ, payload, _ in copied],
            ev.execution(EventType.EXECUTION_FORKED, eid, ExecutionStatus.PENDING, forked_from=src.id,
                         fork_seq=at_seq, steps_copied=len(step_rows), policy_revision=revision),
        ]
        times = [now, *[at for _, _, at in copied], now]
        tx.insert_many(t.events, [
            {"execution_id": eid, "event_seq": i + 1, "type": typ, "payload": codec.dumps(payload), "occurred_at": at}
            for i, ((typ, payload), at) in enumerate(zip(head, times, strict=True))
        ])
        tx.set_last_event_seq(eid, len(head))
        if usage_in or usage_out:
            tx.add_usage(eid, usage_in, usage_out)
        if not queued_behind:
            _, queued = enqueue(k, tx, eid, now)
            tx.append(eid, now, [
                ev.execution(EventType.EXECUTION_STARTED, eid, ExecutionStatus.RUNNING,
                             previous_execution_id=e.previous_execution_id),
                queued,
            ])
    return e


def fork_points(k: Kernel, execution_id: str) -> list[dict[str, Any]]:
    """Where a fork can start: before any step (seq 0), and after each recorded step outcome."""
    from kernel.clock import rfc3339

    with k.store.read() as tx:
        if tx.get_execution(execution_id) is None:
            raise NotFound("execution not found")
        rows = tx.events_upto(execution_id, 2**62)
    out: list[dict[str, Any]] = [{"event_seq": 0, "steps": 0, "covered": True}]
    n = 0
    for r in rows:
        if r.type not in _OUTCOME_EVENTS:
            continue
        n += 1
        p = json.loads(r.payload)
        out.append({"event_seq": int(r.event_seq), "type": r.type, "step_id": p.get("step_id"),
                    "target": p.get("target"), "steps": n, "occurred_at": rfc3339(r.occurred_at),
                    "covered": True})
    return out
