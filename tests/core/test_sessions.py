"""Sessions and the sub-agent tree in the core, on SQLite and PostgreSQL: one running execution per
session, admission in creation order, the previous turn's state, suspend/resume, cancel cascades."""

from __future__ import annotations

import pytest

from kernel.core import executions, lifecycle, sessions, steps
from kernel.core.agents import register_agent
from kernel.core.dispatch import Claim, claim_due
from kernel.core.executions import Lineage
from kernel.core.kernel import Kernel
from kernel.domain import ExecutionStatus, Lease
from kernel.errors import ExecutionTerminal, NotFound
from kernel.identity import args_hash
from tests.conftest import Running

_MISSING = "00000000-0000-7000-8000-000000000000"


def _claim(k: Kernel, eid: str) -> Claim:
    claims = [c for c in claim_due(k, 100) if c.execution_id == eid]
    assert claims, f"no dispatch for {eid}"
    return claims[0]


def _status(k: Kernel, eid: str) -> ExecutionStatus:
    return executions.get_execution(k, eid).status


def _complete(k: Kernel, eid: str, output: object = None, state: object = None) -> None:
    c = _claim(k, eid)
    executions.finish_execution(k, Lease("shell", eid, c.dispatch_id, c.attempt), output=output, state=state)


def test_a_busy_session_queues_new_executions_pending_and_admits_them_in_order(running: Running) -> None:
    k = running.kernel
    ids = [executions.create_execution(k, "shell", i, lineage=Lineage(session="chat-1"))[0].id for i in range(4)]
    assert [_status(k, e) for e in ids] == ["running", "pending", "pending", "pending"]
    claims = claim_due(k, 100)
    assert [c.execution_id for c in claims] == [ids[0]]  # pending ones have no dispatch
    executions.finish_execution(k, Lease("shell", ids[0], claims[0].dispatch_id, claims[0].attempt), output="one")
    assert [_status(k, e) for e in ids] == ["completed", "running", "pending", "pending"]
    executions.cancel_execution(k, ids[1])
    assert [_status(k, e) for e in ids[2:]] == ["running", "pending"]


def test_the_next_turn_reads_the_previous_state_or_else_its_output(running: Running) -> None:
    k = running.kernel
    lin = Lineage(session="chat-2")
    a = executions.create_execution(k, "shell", "hi", lineage=lin)[0].id
    b = executions.create_execution(k, "shell", "again", lineage=lin)[0].id
    assert sessions.previous_state(k, a, "shell") == {"state": None}
    _complete(k, a, output="out-a", state={"history": ["hi"]})
    assert sessions.previous_state(k, b, "shell") == {"state": {"history": ["hi"]}, "execution_id": a}
    _complete(k, b, output="out-b")
    c = executions.create_execution(k, "shell", "third", lineage=lin)[0].id
    assert sessions.previous_state(k, c, "shell") == {"state": "out-b", "execution_id": b}


def test_different_sessions_run_at_once(running: Running) -> None:
    k = running.kernel
    a = executions.create_execution(k, "shell", None, lineage=Lineage(session="s-a"))[0].id
    b = executions.create_execution(k, "shell", None, lineage=Lineage(session="s-b"))[0].id
    assert _status(k, a) == _status(k, b) == "running"


def test_a_stalled_session_is_admitted_by_the_repair_sweep(running: Running) -> None:
    k = running.kernel
    lin = Lineage(session="s-stall")
    a = executions.create_execution(k, "shell", None, lineage=lin)[0].id
    b = executions.create_execution(k, "shell", None, lineage=lin)[0].id
    c = _claim(k, a)
    with k.store.transaction(lock=a) as tx:  # the end without its follow-up (a crash in between)
        tx.retire_dispatches(a, k.clock.now())
        tx.append(a, k.clock.now(), [], status=ExecutionStatus.COMPLETED)
    assert _status(k, b) == "pending" and c.attempt == 1
    assert sessions.repair(k) == 1
    assert _status(k, b) == "running"


def _spawn_step(k: Kernel, parent: str, claim: Claim, name: str) -> str:
    req = steps.StepRequest(kind="tool_call", target=name, args={}, args_text="{}", args_hash=args_hash("{}"))
    ans = steps.submit_step(k, Lease("shell", parent, claim.dispatch_id, claim.attempt), req)
    assert ans.decision == "proceed"
    return str(ans.step_id)


def test_a_suspended_parent_resumes_when_its_children_end_with_their_outputs_on_its_steps(
    running: Running,
) -> None:
    k = running.kernel
    parent = executions.create_execution(k, "shell", None)[0].id
    pc = _claim(k, parent)
    kids = []
    for i in range(3):
        sid = _spawn_step(k, parent, pc, f"spawn-{i}")
        kids.append((executions.create_execution(
            k, "shell", i, lineage=Lineage(parent_execution_id=parent, spawned_step_id=sid))[0].id, sid))
    assert sessions.suspend(k, Lease("shell", parent, pc.dispatch_id, pc.attempt)) is True
    assert executions.get_execution(k, parent).suspended
    leases = {c.execution_id: c for c in claim_due(k, 100)}
    for i, (kid, _) in enumerate(kids):
        executions.finish_execution(k, Lease("shell", kid, leases[kid].dispatch_id, leases[kid].attempt), output=f"child-{i}")
        if i < 2:
            assert not [c for c in claim_due(k, 100) if c.execution_id == parent]  # still waiting
    resumed = _claim(k, parent)
    assert resumed.dispatch_id != pc.dispatch_id
    for i, (_, sid) in enumerate(kids):
        s = steps.get_step(k, parent, sid, None)
        assert (s.status, s.result) == ("succeeded", f"child-{i}")
    e, children = executions.get_execution_tree(k, parent)
    assert not e.suspended and children == [kid for kid, _ in kids]


def test_cancelling_a_parent_cancels_its_children_and_theirs(running: Running) -> None:
    k = running.kernel
    parent = executions.create_execution(k, "shell", None)[0].id
    child = executions.create_execution(k, "shell", None, lineage=Lineage(parent_execution_id=parent))[0].id
    grandchild = executions.create_execution(k, "shell", None, lineage=Lineage(parent_execution_id=child))[0].id
    executions.cancel_execution(k, parent)
    for eid in (parent, child, grandchild):
        assert _status(k, eid) == "cancelled"
    assert executions.get_execution(k, grandchild).failure_reason == "parent_cancelled"


def test_a_child_of_a_missing_or_ended_parent_is_refused(running: Running) -> None:
    k = running.kernel
    with pytest.raises(NotFound):
        executions.create_execution(k, "shell", None, lineage=Lineage(parent_execution_id=_MISSING))
    done = executions.create_execution(k, "shell", None)[0].id
    executions.cancel_execution(k, done)
    with pytest.raises(ExecutionTerminal):
        executions.create_execution(k, "shell", None, lineage=Lineage(parent_execution_id=done))


def test_the_repair_sweep_cancels_the_live_children_of_a_cancelled_parent(running: Running) -> None:
    k = running.kernel
    parent = executions.create_execution(k, "shell", None)[0].id
    child = executions.create_execution(k, "shell", None, lineage=Lineage(parent_execution_id=parent))[0].id
    lifecycle.cancel_one(k, parent, "client_cancelled")  # the cancel without its cascade (a crash)
    assert _status(k, child) == "running"
    assert sessions.repair(k) == 1
    assert _status(k, child) == "cancelled"


def test_suspend_answers_false_only_once_the_ended_childrens_outcomes_are_on_their_steps(
    running: Running,
) -> None:
    k = running.kernel
    parent = executions.create_execution(k, "shell", None)[0].id
    pc = _claim(k, parent)
    sid = _spawn_step(k, parent, pc, "spawn-0")
    kid = executions.create_execution(k, "shell", 0, lineage=Lineage(parent_execution_id=parent,
                                                                       spawned_step_id=sid))[0].id
    kc = _claim(k, kid)
    with k.store.transaction(lock=kid) as tx:  # the child's end, before its follow-up settled the parent
        tx.retire_dispatches(kid, k.clock.now())
        tx.append(kid, k.clock.now(), [], status=ExecutionStatus.COMPLETED, output="child-0")
    assert kc.attempt == 1 and steps.get_step(k, parent, sid, None).status == "executing"
    # No live child: the parent goes on, and the step it reads next already holds the child's output.
    assert sessions.suspend(k, Lease("shell", parent, pc.dispatch_id, pc.attempt)) is False
    s = steps.get_step(k, parent, sid, None)
    assert (s.status, s.result) == ("succeeded", "child-0")
    assert sessions.settle(k, parent) is False  # the late follow-up records nothing twice
    with k.store.read() as tx:
        assert [e.type for e in tx.list_events(parent, 0, 100)].count("step.succeeded") == 1


def test_a_child_may_not_queue_in_a_session_its_live_ancestor_holds(running: Running) -> None:
    from kernel.errors import Conflict

    k = running.kernel
    parent = executions.create_execution(k, "shell", None, lineage=Lineage(session="chat"))[0].id
    child = executions.create_execution(k, "shell", None, lineage=Lineage(parent_execution_id=parent))[0].id
    for direct in (parent, child):  # the parent's own session, from its child or its grandchild
        with pytest.raises(Conflict):
            executions.create_execution(k, "shell", None, lineage=Lineage(session="chat", parent_execution_id=direct))
    other = executions.create_execution(k, "shell", None, lineage=Lineage(session="other", parent_execution_id=child))
    assert other[0].status == "running"


def test_asking_again_for_the_child_of_a_spawning_step_returns_the_same_child(running: Running) -> None:
    from kernel.errors import Conflict

    k = running.kernel
    parent = executions.create_execution(k, "shell", None)[0].id
    pc = _claim(k, parent)
    sid = _spawn_step(k, parent, pc, "spawn-0")
    lin = Lineage(parent_execution_id=parent, spawned_step_id=sid)
    first, created = executions.create_execution(k, "shell", {"i": 0}, lineage=lin)
    # The parent's handler lost its dispatch while it waited, and its rerun runs the spawn body again.
    again, created_again = executions.create_execution(k, "shell", {"i": 0}, lineage=lin)
    assert (created, created_again, again.id) == (True, False, first.id)
    assert executions.get_execution_tree(k, parent)[1] == [first.id]
    register_agent(k, "other", "http://127.0.0.1:9/webhook", "s", None, keep_policy=True)
    with pytest.raises(Conflict):
        executions.create_execution(k, "other", {"i": 0}, lineage=lin)


def test_a_fork_queued_behind_a_busy_session_keeps_its_sources_previous_turn(running: Running) -> None:
    from kernel.core import forks

    k = running.kernel
    chat = Lineage(session="chat")
    turn1 = executions.create_execution(k, "shell", "hi", lineage=chat)[0].id
    _complete(k, turn1, output="out-1", state={"history": ["hi"]})
    turn2 = executions.create_execution(k, "shell", "again", lineage=chat)[0].id
    _complete(k, turn2, output="out-2")
    busy = executions.create_execution(k, "shell", None, lineage=Lineage(session="retry"))[0].id
    fork = forks.fork_execution(k, turn2, 0, session="retry")
    assert (fork.status, fork.previous_execution_id) == ("pending", turn1)
    _complete(k, busy)  # the session frees: the fork is admitted, still continuing turn 1
    e = executions.get_execution(k, fork.id)
    assert (e.status, e.previous_execution_id) == ("running", turn1)
    assert sessions.previous_state(k, fork.id, "shell") == {"state": {"history": ["hi"]}, "execution_id": turn1}


def test_a_failed_or_cancelled_turn_is_never_the_previous_one(running: Running) -> None:
    k = running.kernel
    chat = Lineage(session="chat-3")
    ids = [executions.create_execution(k, "shell", i, lineage=chat)[0].id for i in range(4)]
    _complete(k, ids[0], output="out-0", state={"turns": 1})
    c = _claim(k, ids[1])
    executions.finish_execution(k, Lease("shell", ids[1], c.dispatch_id, c.attempt), error="agent_error: boom", failed=True)
    executions.cancel_execution(k, ids[2])
    assert executions.get_execution(k, ids[3]).previous_execution_id == ids[0]
    assert sessions.previous_state(k, ids[3], "shell") == {"state": {"turns": 1}, "execution_id": ids[0]}
