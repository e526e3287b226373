"""Resources and checkpoints in the core, on SQLite and PostgreSQL: generations on `proceed`,
`due` captures, stale captures, refusal of undeclared resources and a fork's restoration."""

from __future__ import annotations

import pytest

from kernel.core import executions, forks, resources, steps
from kernel.core.dispatch import claim_due
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.errors import ValidationError
from kernel.identity import args_hash
from tests.conftest import Running


def _req(target: str, *declared: str) -> steps.StepRequest:
    return steps.StepRequest(kind="tool_call", target=target, args={}, args_text="{}", args_hash=args_hash("{}"),
                             resources=declared)


def _started(k: Kernel) -> tuple[str, str, int]:
    eid = executions.create_execution(k, "shell", None)[0].id
    c = next(c for c in claim_due(k, 100) if c.execution_id == eid)
    return eid, c.dispatch_id, c.attempt


def test_proceed_answers_carry_generations_and_due_captures(running: Running) -> None:
    k = running.kernel
    eid, did, att = _started(k)
    view = resources.register(k, Lease("shell", eid, did, att), resources.Registration("db", "pg", every_steps=2))
    assert (view["generation"], view["covered"], view["binding"], view["checkpoint_ref"]) == (0, False, None, "")
    resources.bind(k, Lease("shell", eid, did, att), "db", {"dsn": "x"})
    assert resources.register(k, Lease("shell", eid, did, att), resources.Registration("db", "pg", every_steps=2))["binding"] == {"dsn": "x"}
    a = steps.submit_step(k, Lease("shell", eid, did, att), _req("t0", "db"))
    assert a.to_json()["resources"] == [{"key": "db", "generation": 1, "due": False}]
    steps.record_outcome(k, Lease("shell", eid, did, att), str(a.step_id), result=1)
    b = steps.submit_step(k, Lease("shell", eid, did, att), _req("t1", "db"))
    assert b.resources == [{"key": "db", "generation": 2, "due": True}]
    # A stale capture (an older generation) is logged and covers nothing; the current one covers.
    steps.record_outcome(k, Lease("shell", eid, did, att), str(b.step_id), result=2,
                         captures=[resources.Capture("db", 1, "old"), resources.Capture("db", 2, "cp-2")])
    [row] = resources.list_views(k, eid, None)
    assert (row["covered"], row["checkpoint_ref"], row["generation"]) == (True, "cp-2", 2)
    with k.store.read() as tx:
        done = [e.payload for e in tx.list_events(eid, 0, 100) if e.type == "resource.checkpointed"]
    assert done == [{"key": "db", "generation": 1, "checkpoint_ref": "old", "stale": True},
                    {"key": "db", "generation": 2, "checkpoint_ref": "cp-2"}]
    # A step without resources carries none; one naming an unregistered resource is refused.
    assert steps.submit_step(k, Lease("shell", eid, did, att), _req("plain")).resources is None
    with pytest.raises(ValidationError):
        steps.submit_step(k, Lease("shell", eid, did, att), _req("t2", "nope"))


def test_a_driver_with_coverage_reuse_restores_an_older_checkpoint_reported_not_covered(running: Running) -> None:
    k = running.kernel
    eid, did, att = _started(k)
    resources.register(k, Lease("shell", eid, did, att), resources.Registration("a", "d", every_steps=1))
    resources.register(k, Lease("shell", eid, did, att), resources.Registration("b", "d", every_steps=1, coverage_reuse=True))
    resources.publish(k, Lease("shell", eid, did, att), [resources.Capture("a", 0, "a0"), resources.Capture("b", 0, "b0")], [])
    s = steps.submit_step(k, Lease("shell", eid, did, att), _req("t0", "a", "b"))
    with k.store.read() as tx:
        inside = tx.last_event_seq(eid)
    steps.record_outcome(k, Lease("shell", eid, did, att), str(s.step_id), result=0,
                         capture_failures=[resources.CaptureFailure("a", 1, "disk full"),
                                           resources.CaptureFailure("b", 1, "disk full")])
    fork = forks.fork_execution(k, eid, inside)
    assert fork.restoration == {"a": {"covered": False},
                                "b": {"covered": False, "checkpoint_ref": "b0", "generation": 0}}
    before = forks.fork_execution(k, eid, inside - 3)  # before the step: both covered at generation 0
    assert before.restoration == {"a": {"covered": True, "checkpoint_ref": "a0", "generation": 0},
                                  "b": {"covered": True, "checkpoint_ref": "b0", "generation": 0}}
    points = forks.fork_points(k, eid)
    assert points[-1]["resources"] == {"a": False, "b": False}  # the captures failed


def test_a_session_turn_inherits_its_previous_turns_resources_and_bindings(running: Running) -> None:
    from kernel.core.executions import Lineage

    k = running.kernel
    chat = Lineage(session="sandboxed")
    turn1, turn2, turn3 = (executions.create_execution(k, "shell", i, lineage=chat)[0].id for i in range(3))
    c1 = next(c for c in claim_due(k, 100) if c.execution_id == turn1)
    resources.register(k, Lease("shell", turn1, c1.dispatch_id, c1.attempt),
                       resources.Registration("box", "dir", every_steps=1, on_completion=True))
    resources.bind(k, Lease("shell", turn1, c1.dispatch_id, c1.attempt), "box", {"path": "/tmp/box-1"})
    a = steps.submit_step(k, Lease("shell", turn1, c1.dispatch_id, c1.attempt), _req("t0", "box"))
    steps.record_outcome(k, Lease("shell", turn1, c1.dispatch_id, c1.attempt), str(a.step_id), result=1,
                         captures=[resources.Capture("box", 1, "snap-1")])
    executions.finish_execution(k, Lease("shell", turn1, c1.dispatch_id, c1.attempt), output="one")
    # Admitted now: the same box (registration and binding), its own generations, not covered yet.
    c2 = next(c for c in claim_due(k, 100) if c.execution_id == turn2)
    view = resources.register(k, Lease("shell", turn2, c2.dispatch_id, c2.attempt),
                              resources.Registration("box", "dir", every_steps=1, on_completion=True))
    assert (view["binding"], view["generation"], view["covered"], view["checkpoint_ref"]) == (
        {"path": "/tmp/box-1"}, 0, False, "")
    with k.store.read() as tx:
        [registered] = [e.payload for e in tx.list_events(turn2, 0, 100) if e.type == "resource.registered"]
    assert (registered["key"], registered["inherited_from"]) == ("box", turn1)
    assert forks.fork_points(k, turn2)[0]["covered"] is True  # registered after seq 0
    # Turn 3 inherits from turn 2, which inherited the box: still the same binding.
    executions.finish_execution(k, Lease("shell", turn2, c2.dispatch_id, c2.attempt), output="two")
    c3 = next(c for c in claim_due(k, 100) if c.execution_id == turn3)
    assert resources.list_views(k, turn3, "shell")[0]["binding"] == {"path": "/tmp/box-1"}
    assert c3.attempt == 1


def test_a_turn_without_a_previous_one_or_outside_a_session_starts_with_no_resources(running: Running) -> None:
    from kernel.core.executions import Lineage

    k = running.kernel
    first = executions.create_execution(k, "shell", None, lineage=Lineage(session="fresh"))[0].id
    alone = executions.create_execution(k, "shell", None)[0].id
    assert resources.list_views(k, first, "shell") == resources.list_views(k, alone, "shell") == []
