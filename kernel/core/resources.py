"""Resources and checkpoints (docs/api.md, "Resources and checkpoints").

An execution registers the external resources its steps change (a sandbox, a scratch database)
under a key. Every step that declares a resource and is told to `proceed` moves that resource to
its next *generation*; the answer carries each declared resource's generation and whether a
capture is `due` (after every `every_steps` affecting steps). The agent captures the resource
(its driver's checkpoint) and reports `captures` / `capture_failures` with the step's outcome, or
on their own through `POST …/resources/checkpoints`. A capture of the current generation covers
the event seqs from the step's outcome (or the capture's own event) until the next step that
changes the resource. A fork restores each resource from the checkpoint that covers its fork
point, and reports per resource whether one did (`restoration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kernel import jsontext
from kernel.core import events as ev
from kernel.core.executions import load_owned
from kernel.core.kernel import Kernel
from kernel.core.leases import require_live_lease
from kernel.core.store_ports import ResourceStore, Transaction
from kernel.domain import EventType, Execution, Lease
from kernel.errors import Conflict, ExecutionTerminal, NotFound, invalid

# The seq of a fork's `execution.forked` event (created, forked, started: 1, 2, 3).
FORKED_SEQ = 2


@dataclass(frozen=True, slots=True)
class Registration:
    key: str
    driver_id: str
    configuration: Any = None
    coverage_reuse: bool = False
    every_steps: int = 0
    on_completion: bool = False


@dataclass(frozen=True, slots=True)
class Capture:
    key: str
    generation: int
    checkpoint_ref: str


@dataclass(frozen=True, slots=True)
class CaptureFailure:
    key: str
    generation: int
    error: str


def view(r: Any) -> dict[str, Any]:
    """The resource as the SDK reads it (`rebuno.types.Resource`)."""
    return {
        "key": r.key,
        "generation": int(r.generation),
        "binding": jsontext.loads(r.binding),
        "checkpoint_ref": r.checkpoint_ref or "",
        "covered": bool(r.covered),
        "every_steps": int(r.every_steps),
        "on_completion": bool(r.on_completion),
    }


def _live(tx: Transaction, lease: Lease, now: datetime) -> Execution:
    e = load_owned(tx, lease.execution_id, lease.agent_id)
    if e.status.is_terminal:
        raise ExecutionTerminal("execution is terminal")
    require_live_lease(tx, lease, now)
    return e


def register(k: Kernel, lease: Lease, reg: Registration) -> dict[str, Any]:
    """Register a resource, or read it back (a later dispatch, the on-completion check). A fork's
    restored resources exist from its creation: registering one returns its `checkpoint_ref`."""
    now = k.clock.now()
    execution_id = lease.execution_id
    with k.store.transaction(lock=execution_id) as tx:
        _live(tx, lease, now)
        r = tx.get_resource(execution_id, reg.key)
        settings = {"configuration": jsontext.dumps_or_none(reg.configuration), "coverage_reuse": reg.coverage_reuse,
                    "every_steps": reg.every_steps, "on_completion": reg.on_completion}
        if r is None:
            seq = tx.last_event_seq(execution_id) + 1
            tx.insert_resource({
                "execution_id": execution_id, "key": reg.key, "driver_id": reg.driver_id, **settings,
                "generation": 0, "binding": None, "checkpoint_ref": None, "covered": False,
                "steps_since_capture": 0, "created_at": now, "registered_seq": seq,
            })
            tx.append(execution_id, now, [(EventType.RESOURCE_REGISTERED.value, {
                "key": reg.key, "driver_id": reg.driver_id, "generation": 0,
                "every_steps": reg.every_steps, "on_completion": reg.on_completion})])
        else:
            if r.driver_id != reg.driver_id:
                raise Conflict(f"conflict: resource {reg.key!r} is registered with driver {r.driver_id!r}")
            tx.update_resource(execution_id, reg.key, **settings)
        r = tx.get_resource(execution_id, reg.key)
        return view(r)


def bind(k: Kernel, lease: Lease, key: str, binding: Any) -> None:
    """Record how to reopen the resource (the driver's binding; never written into events)."""
    now = k.clock.now()
    execution_id = lease.execution_id
    with k.store.transaction(lock=execution_id) as tx:
        _live(tx, lease, now)
        if tx.get_resource(execution_id, key) is None:
            raise NotFound("resource not found")
        tx.update_resource(execution_id, key, binding=jsontext.dumps_or_none(binding))
        tx.append(execution_id, now, [(EventType.RESOURCE_BOUND.value, {"key": key})])


def publish(k: Kernel, lease: Lease, captures: list[Capture], failures: list[CaptureFailure]) -> None:
    """Captures made outside a step (at registration, on completion)."""
    now = k.clock.now()
    with k.store.transaction(lock=lease.execution_id) as tx:
        _live(tx, lease, now)
        record_captures(tx, lease.execution_id, now, captures, failures, at_seq=None)


def record_captures(tx: Transaction, execution_id: str, now: datetime, captures: list[Capture],
                    failures: list[CaptureFailure], at_seq: int | None) -> None:
    """Apply captures: one of the resource's current generation covers from `at_seq` (the step's
    outcome event) or, without one, from its own `resource.checkpointed` event; an older
    generation's capture is recorded as `stale` and covers nothing."""
    if not captures and not failures:
        return
    rows = {key: tx.get_resource(execution_id, key) for key in {c.key for c in captures} | {f.key for f in failures}}
    missing = sorted(key for key, r in rows.items() if r is None)
    if missing:
        raise invalid(f"resource {missing[0]!r} is not registered for this execution")
    base = tx.last_event_seq(execution_id)
    out: list[ev.Ev] = []
    for c in captures:
        r = rows[c.key]
        seq = base + len(out) + 1
        payload: dict[str, Any] = {"key": c.key, "generation": c.generation, "checkpoint_ref": c.checkpoint_ref}
        if c.generation == int(r.generation):
            tx.insert_checkpoint(execution_id, c.key, c.generation, c.checkpoint_ref, at_seq or seq, now)
            tx.update_resource(execution_id, c.key, covered=True, steps_since_capture=0,
                               checkpoint_ref=c.checkpoint_ref)
        else:
            payload["stale"] = True
        out.append((EventType.RESOURCE_CHECKPOINTED.value, payload))
    for f in failures:
        out.append((EventType.RESOURCE_CAPTURE_FAILED.value,
                     {"key": f.key, "generation": f.generation, "error": f.error}))
    tx.append(execution_id, now, out)


def require_registered(tx: ResourceStore, execution_id: str, keys: tuple[str, ...]) -> list[Any]:
    rows = [tx.get_resource(execution_id, key) for key in keys]
    for key, r in zip(keys, rows, strict=True):
        if r is None:
            raise invalid(f"resource {key!r} is not registered for this execution")
    return rows


def advance(tx: Transaction, execution_id: str, rows: list[Any], bump: bool) -> list[dict[str, Any]]:
    """What a `proceed` answer carries for the step's declared resources. A new step moves each
    to its next generation (its checkpoints stop covering from the step's `step.executing`); a
    retried step reads them as they are."""
    out = []
    seq = tx.last_event_seq(execution_id) if bump else 0
    for r in rows:
        generation, since = int(r.generation), int(r.steps_since_capture)
        if bump:
            generation, since = generation + 1, since + 1
            if r.covered:
                tx.supersede_checkpoints(execution_id, r.key, seq)
            tx.update_resource(execution_id, r.key, generation=generation, steps_since_capture=since, covered=False)
        due = int(r.every_steps) > 0 and since >= int(r.every_steps)
        out.append({"key": r.key, "generation": generation, "due": due})
    return out


@dataclass(frozen=True, slots=True)
class Restored:
    resource: Any  # the source's resources row
    checkpoint: Any  # the checkpoints row it is restored from, or None (a fresh resource)
    covered: bool


def plan_restoration(tx: ResourceStore, source_id: str, at_seq: int) -> list[Restored]:
    """The source's resources that existed at `at_seq`, each with the checkpoint covering
    `at_seq` (or, for a driver that allows `coverage_reuse`, the newest one before it)."""
    out = []
    for r in tx.list_resources(source_id):
        if int(r.registered_seq) > at_seq:
            continue
        cp = tx.checkpoint_at(source_id, r.key, at_seq, covering=True)
        covered = cp is not None
        if cp is None and r.coverage_reuse:
            cp = tx.checkpoint_at(source_id, r.key, at_seq, covering=False)
        out.append(Restored(r, cp, covered))
    return out


def restoration(plan: list[Restored]) -> dict[str, Any] | None:
    """The fork's `restoration`: {key: {covered, checkpoint_ref?, generation?}}."""
    out: dict[str, Any] = {}
    for p in plan:
        entry: dict[str, Any] = {"covered": p.covered}
        if p.checkpoint is not None:
            entry.update(checkpoint_ref=p.checkpoint.checkpoint_ref, generation=int(p.checkpoint.generation))
        out[p.resource.key] = entry
    return out or None


def restore_into_fork(tx: ResourceStore, plan: list[Restored], fork_id: str, now: datetime) -> None:
    """The fork's own resources rows: registered from its `execution.forked`, at the restored
    checkpoint's generation, unbound (the agent creates each from its `checkpoint_ref`)."""
    for p in plan:
        r, cp = p.resource, p.checkpoint
        generation = int(cp.generation) if cp is not None else 0
        tx.insert_resource({
            "execution_id": fork_id, "key": r.key, "driver_id": r.driver_id, "configuration": r.configuration,
            "coverage_reuse": r.coverage_reuse, "every_steps": r.every_steps, "on_completion": r.on_completion,
            "generation": generation, "binding": None,
            "checkpoint_ref": cp.checkpoint_ref if cp is not None else None, "covered": p.covered,
            "steps_since_capture": 0, "created_at": now, "registered_seq": FORKED_SEQ,
        })
        if p.covered:
            tx.insert_checkpoint(fork_id, r.key, generation, cp.checkpoint_ref, FORKED_SEQ, now)


def coverage(tx: ResourceStore, execution_id: str) -> Any:
    """A function of an event seq: {key: covered} for the resources registered by then."""
    resources = tx.list_resources(execution_id)
    checkpoints = tx.list_checkpoints(execution_id)

    def at(seq: int) -> dict[str, bool]:
        return {
            r.key: any(c.key == r.key and c.event_seq <= seq and (c.superseded_seq is None or c.superseded_seq > seq)
                       for c in checkpoints)
            for r in resources if int(r.registered_seq) <= seq
        }

    return at


def list_views(k: Kernel, execution_id: str, agent_id: str | None) -> list[dict[str, Any]]:
    """The execution's resources; the binding (how to reopen one, possibly a credential) only
    for the owning agent."""
    with k.store.read() as tx:
        load_owned(tx, execution_id, agent_id)
        rows = tx.list_resources(execution_id)
    out = []
    for r in rows:
        v = view(r)
        if agent_id is None:
            v.pop("binding")
        out.append(v)
    return out
