"""Fixtures written straight into a store before its server starts (SQLite allows one kernel
process per file, so the bench prepares, closes the store, then `regent serve` opens it).

Agents, executions and claims go through the core use cases (`register_agent`,
`create_execution`, `claim_due`, `claim_one`), as tests/conftest.py does. Recorded step history
is written in bulk (one transaction per execution) with the rows and events the core writes for
an allowed, completed step, so 10 000 steps take about a second rather than 20 000 commits.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert

from bench.client import Lease
from kernel.core import events as ev
from kernel.core.agents import register_agent
from kernel.core.dispatch import claim_due, claim_one
from kernel.core.executions import create_execution
from kernel.core.kernel import Kernel
from kernel.domain import Decision, DispatchStatus, EventType, StepStatus
from kernel.identity import args_hash, canonical_json, step_id
from kernel.store import SqlStore, codec
from kernel.store import tables as t

AGENT_ID = "bench-agent"
# An unroutable webhook: every execution is claimed here, so the dispatcher has nothing to send.
WEBHOOK = "http://127.0.0.1:9/webhook"
LEASE_SECONDS = 3600  # longer than any bench run: the lease reaper must never fire mid-measurement


@dataclass
class AgentCreds:
    agent_id: str
    secret: str


def new_agent(k: Kernel) -> AgentCreds:
    secret = secrets.token_hex(16)
    register_agent(k, AGENT_ID, WEBHOOK, secret, LEASE_SECONDS, keep_policy=True)
    return AgentCreds(AGENT_ID, secret)


def start_executions(k: Kernel, agent: AgentCreds, n: int, label: str) -> list[Lease]:
    """n new executions, each claimed (attempt 1): ready for agent calls under its lease."""
    ids = [create_execution(k, agent.agent_id, {"bench": label, "i": i})[0].id for i in range(n)]
    wanted = set(ids)
    claims = {c.execution_id: c for c in claim_due(k, 10_000) if c.execution_id in wanted}
    missing = wanted - claims.keys()
    if missing:
        raise RuntimeError(f"{len(missing)} new execution(s) could not be claimed")
    return [Lease(eid, claims[eid].dispatch_id, claims[eid].attempt) for eid in ids]


@dataclass(frozen=True)
class RecordedStep:
    target: str
    args: dict[str, str]
    result: dict[str, Any]
    step_id: str


def history_step(i: int) -> tuple[str, dict[str, str], dict[str, Any]]:
    """Step i of a recorded history: ten tools in turn, each call with its own args."""
    args = {"n": f"{i:010d}"}
    return f"bench.tool{i % 10}", args, {"ok": True, "i": i}


def sql_store(k: Kernel) -> SqlStore:
    """The kernel's concrete store: the bench writes fixtures below the core's ports (bulk inserts,
    raw SQL), which the core never does."""
    assert isinstance(k.store, SqlStore), k.store
    return k.store


def record_history(store: SqlStore, lease: Lease, count: int) -> list[RecordedStep]:
    """Write `count` succeeded steps (and their 4 events each) into a running execution."""
    permissive = ev.decision_fields(Decision.permissive())
    kind = "tool_call"
    rows: list[dict[str, Any]] = []
    events: list[ev.Ev] = []
    out: list[RecordedStep] = []
    now = datetime.now(UTC)
    for i in range(count):
        target, args, result = history_step(i)
        text = canonical_json(json.dumps(args))
        h = args_hash(text)
        sid = step_id(lease.execution_id, kind, target, h, 0)
        rows.append({
            "step_id": sid, "execution_id": lease.execution_id, "kind": kind, "target": target,
            "args_hash": h, "occurrence": 0, "status": StepStatus.SUCCEEDED.value,
            "idempotency": "safe_to_retry", "args": text, "result": codec.dumps(result), "error": None,
            "usage_input": 0, "usage_output": 0, "started_at": now, "completed_at": now,
        })
        events += [
            ev.step(EventType.STEP_PROPOSED, sid, kind, target),
            ev.step(EventType.STEP_ALLOWED, sid, kind, target, **permissive),
            ev.step(EventType.STEP_EXECUTING, sid, kind, target),
            ev.step(EventType.STEP_SUCCEEDED, sid, kind, target),
        ]
        out.append(RecordedStep(target, args, result, sid))
    with store.transaction(lock=lease.execution_id) as tx:
        for lo in range(0, len(rows), 2000):
            tx.w.execute(insert(t.steps), rows[lo:lo + 2000])
        for lo in range(0, len(events), 8000):
            tx.append(lease.execution_id, now, events[lo:lo + 8000])
    return out


def reclaim(k: Kernel, lease: Lease) -> Lease:
    """End the attempt as the lease reaper does (back to pending, same row), then claim it again:
    a fresh attempt with empty occurrence counters, so every recorded step replays."""
    now = k.clock.now()
    with k.store.transaction(lock=lease.execution_id) as tx:
        tx.set_dispatch(lease.dispatch_id, now, status=DispatchStatus.PENDING, locked_by=None, locked_at=None,
                        next_attempt_at=now)
    c = claim_one(k, lease.dispatch_id)
    if c is None or c.discarded or c.exhausted:
        raise RuntimeError(f"could not re-claim dispatch {lease.dispatch_id}: {c}")
    return Lease(lease.execution_id, c.dispatch_id, c.attempt)
