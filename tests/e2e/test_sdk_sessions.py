"""Sessions and sub-agents end to end: a real `regent dev`, official-SDK agents
(tests/e2e/session_agent.py) on loopback, the official SDK `Client` creating the executions."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rebuno

from tests.e2e.conftest import DevKernel, dev_kernel_for, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

AGENT = Path(__file__).with_name("session_agent.py")
MODES = {"chat": "chat", "boss": "orchestrator", "kid": "child", "steps": "steps", "five": "steps"}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevKernel]:
    tmp = tmp_path_factory.mktemp("sessions")
    with dev_kernel_for(tuple(MODES), tmp) as k:
        for agent_id, mode in MODES.items():
            k.agent(agent_id, script=AGENT, MODE=mode)
        yield k


def _sdk(k: DevKernel, fn: Any) -> Any:
    async def run() -> Any:
        async with rebuno.Client(base_url=k.url) as client:
            return await fn(client)

    return asyncio.run(run())


def test_a_three_turn_chat_session_runs_one_turn_at_a_time_and_each_sees_the_previous_state(
    kernel: DevKernel,
) -> None:
    async def create(client: rebuno.Client) -> list[rebuno.Execution]:
        return [await client.create("chat", f"msg-{i}", session="conv-1") for i in range(3)]

    turns = _sdk(kernel, create)
    assert [t.session for t in turns] == ["conv-1"] * 3
    assert [t.status for t in turns][1:] == ["pending", "pending"]  # queued behind the first
    done = [kernel.api.wait_status(t.id, "completed") for t in turns]
    assert [d["output"] for d in done] == [
        {"turn": 1, "seen": []},
        {"turn": 2, "seen": ["msg-0"]},
        {"turn": 3, "seen": ["msg-0", "msg-1"]},
    ]
    assert [d.get("previous_execution_id") for d in done] == [None, turns[0].id, turns[1].id]
    # Never two at once: each turn started after the one before it completed.
    started = [next(e for e in kernel.api.events(t.id) if e["type"] == "execution.started") for t in turns]
    ended = [next(e for e in kernel.api.events(t.id) if e["type"] == "execution.completed") for t in turns]
    for i in (1, 2):
        assert started[i]["occurred_at"] >= ended[i - 1]["occurred_at"]
    listed = kernel.api.http.get("/v0/executions", params={"session": "conv-1"}).json()["executions"]
    assert [e["id"] for e in listed] == [t.id for t in reversed(turns)]


def test_a_parent_spawns_three_children_suspends_and_resumes_with_their_outputs(kernel: DevKernel) -> None:
    async def create(client: rebuno.Client) -> rebuno.Execution:
        return await client.create("boss", {"children": 3, "child_agent": "kid"})

    boss = _sdk(kernel, create)
    done = kernel.api.wait_status(boss.id, "completed", "failed", timeout=60)
    assert done["status"] == "completed", done
    assert done["output"] == {"children": [{"echo": {"i": i}} for i in range(3)]}
    assert len(done["children"]) == 3
    kids = [kernel.api.get(c) for c in done["children"]]
    assert {k["status"] for k in kids} == {"completed"}
    assert {k["parent_execution_id"] for k in kids} == {boss.id}
    types = kernel.api.types(boss.id)
    assert "execution.suspended" in types and "execution.resumed" in types
    # Each spawn body ran once: the rerun replayed the children's outcomes.
    boss_agent = next(a for a in kernel.agents if a.port == kernel.ports["boss"])
    spawns = [line for line in boss_agent.effect_lines() if line.startswith(boss.id)]
    assert sorted(s.split()[1] for s in spawns) == ["spawn-0", "spawn-1", "spawn-2"]


def test_cancelling_a_waiting_parent_cancels_its_children(kernel: DevKernel) -> None:
    async def create(client: rebuno.Client) -> rebuno.Execution:
        return await client.create("boss", {"children": 3, "child_agent": "kid", "child": {"sleep": -1}})

    boss = _sdk(kernel, create)
    e = wait_for(lambda: (x := kernel.api.get(boss.id)).get("suspended") and len(x["children"]) == 3 and x,
                 "the parent to suspend with three children", timeout=30)
    _sdk(kernel, lambda client: client.cancel(boss.id))
    for c in e["children"]:
        kid = kernel.api.wait_status(c, "cancelled", timeout=10)
        assert kid["failure_reason"] == "parent_cancelled"
    assert kernel.api.get(boss.id)["status"] == "cancelled"


SESSION_LIMIT = """
default_action: allow
rules:
  - id: per-session
    when: {target: "step-*"}
    then:
      decision: allow
      rate_limit: {max_calls: 3, window: 1m, per_what: session}
"""


def test_a_session_rate_limit_is_shared_by_the_executions_of_the_session(kernel: DevKernel) -> None:
    r = kernel.api.http.post("/v0/policies/steps", json={"bundle": SESSION_LIMIT})
    assert r.status_code == 204, r.text

    async def create(client: rebuno.Client) -> list[rebuno.Execution]:
        return [await client.create("steps", {"steps": 2}, session="rl-session") for _ in range(2)] + [
            await client.create("steps", {"steps": 2}, session="other-session")]

    a, b, other = _sdk(kernel, create)
    finals = [kernel.api.wait_status(x.id, "completed", "failed", timeout=30) for x in (a, b, other)]
    # Two calls in the first execution, one more in the second, then the session's bucket is empty.
    assert finals[0]["status"] == "completed" and finals[0]["output"] == {"results": ["did 0", "did 1"]}
    assert finals[1]["status"] == "failed" and finals[1]["failure_reason"].startswith("rate_limit_exceeded")
    assert [s["target"] for s in kernel.api.steps(b.id)] == ["step-0"]
    # Another session has a bucket of its own.
    assert finals[2]["status"] == "completed", finals[2]
    r = kernel.api.http.post("/v0/policies/steps", json={"bundle": ""})
    assert r.status_code == 204, r.text


STRICT_FORK_BUNDLE = """
default_action: allow
rules:
  - id: no-step-3
    when: {target: step-3}
    then: {decision: deny, reason: step 3 is off in the fork}
"""


def test_a_fork_at_the_middle_replays_the_first_steps_and_runs_the_rest_under_its_own_bundle(
    kernel: DevKernel,
) -> None:
    src = _sdk(kernel, lambda client: client.create("five", {"steps": 5}))
    done = kernel.api.wait_status(src.id, "completed", timeout=30)
    assert done["output"] == {"results": [f"did {i}" for i in range(5)]}
    points = kernel.api.http.get(f"/v0/executions/{src.id}/fork-points").json()
    assert [p["target"] for p in points[1:]] == [f"step-{i}" for i in range(5)]
    at = points[2]["event_seq"]  # after step-1's outcome: two steps recorded, three to go

    fork = _sdk(kernel, lambda client: client.fork(src.id, at_seq=at, policy_bundle=STRICT_FORK_BUNDLE))
    assert (fork.forked_from, fork.fork_seq) == (src.id, at)
    out = kernel.api.wait_status(fork.id, "completed", timeout=30)
    assert out["output"] == {"results": ["did 0", "did 1", "did 2", {"denied": "no-step-3"}, "did 4"]}
    # The first two bodies did not run again; step-2 and step-4 ran live, step-3 was denied.
    five = next(a for a in kernel.agents if a.port == kernel.ports["five"])
    ran = [line.split()[1] for line in five.effect_lines() if line.startswith(fork.id)]
    assert ran == ["step-2", "step-4"]
    # The fork's log is complete on its own: created, forked, started, then its rerun, where the
    # two replayed steps are recorded (marked with the source's step ids) as it reaches them.
    types = kernel.api.types(fork.id)
    assert types[:3] == ["execution.created", "execution.forked", "execution.started"]
    replayed = [(e["type"], e["payload"]) for e in kernel.api.events(fork.id) if "replayed_from" in e["payload"]]
    assert [(typ, p["target"]) for typ, p in replayed] == [
        ("step.proposed", "step-0"), ("step.succeeded", "step-0"), ("step.proposed", "step-1"),
        ("step.succeeded", "step-1")]
    source_ids = {s["target"]: s["step_id"] for s in kernel.api.steps(src.id)}
    assert {p["replayed_from"] for _, p in replayed} == {source_ids["step-0"], source_ids["step-1"]}
    denied = [e["payload"] for e in kernel.api.events(fork.id) if e["type"] == "step.denied"]
    assert [(d["target"], d["rule_id"]) for d in denied] == [("step-3", "no-step-3")]
    # Decided by the fork's own bundle: its events name that bundle by the hash of its text.
    fork_hash = hashlib.sha256(STRICT_FORK_BUNDLE.encode()).hexdigest()
    allowed = [e["payload"] for e in kernel.api.events(fork.id) if e["type"] == "step.allowed"]
    assert [a["target"] for a in allowed] == ["step-2", "step-4"]
    assert {d["policy_hash"] for d in denied + allowed} == {fork_hash}
    # The agent's own bundle was not touched: it still has none.
    assert kernel.api.http.get("/v0/policies/five").status_code == 404
    steps = {s["target"]: s["status"] for s in kernel.api.steps(fork.id)}
    assert steps == {"step-0": "succeeded", "step-1": "succeeded", "step-2": "succeeded", "step-3": "denied",
                     "step-4": "succeeded"}


def test_a_fork_bundle_that_does_not_compile_is_refused_by_the_load_gate(kernel: DevKernel) -> None:
    src = _sdk(kernel, lambda client: client.create("five", {"steps": 1}))
    kernel.api.wait_status(src.id, "completed", timeout=30)
    r = kernel.api.http.post(f"/v0/executions/{src.id}/fork", json={"at_seq": 0, "policy_bundle": "rules: [1"})
    assert r.status_code == 400 and r.json()["code"] == "validation_error", r.text
    r = kernel.api.http.post(f"/v0/executions/{src.id}/fork", json={"at_seq": 10_000})
    assert r.status_code == 400, r.text


def _fork_before_the_payment(kernel: DevKernel) -> tuple[rebuno.Execution, rebuno.Execution]:
    """A three-step source whose step-1 is `at_most_once`, and its fork at the start of step-1."""
    src = _sdk(kernel, lambda client: client.create("five", {"steps": 3, "at_most_once": [1]}))
    kernel.api.wait_status(src.id, "completed", timeout=30)
    points = kernel.api.http.get(f"/v0/executions/{src.id}/fork-points").json()
    at = points[1]["event_seq"]  # after step-0: the fork reaches step-1, already performed, live
    fork = _sdk(kernel, lambda client: client.fork(src.id, at_seq=at))
    return src, fork


def _pending_approval(kernel: DevKernel, eid: str) -> rebuno.Approval:
    async def find(client: rebuno.Client) -> rebuno.Approval | None:
        return next((a for a in await client.list_approvals() if a.execution_id == eid), None)

    return wait_for(lambda: _sdk(kernel, find), f"a pending approval for {eid}", timeout=30)


def test_a_fork_asks_before_repeating_an_at_most_once_effect_and_runs_it_once_granted(kernel: DevKernel) -> None:
    src, fork = _fork_before_the_payment(kernel)
    approval = _pending_approval(kernel, fork.id)
    assert kernel.api.get(fork.id)["status"] == "blocked"
    [asked] = [e["payload"] for e in kernel.api.events(fork.id) if e["type"] == "step.awaiting_approval"]
    assert (asked["target"], asked["rule_id"]) == ("step-1", "__fork_effect")
    _sdk(kernel, lambda client: client.grant_approval(approval.id, decided_by="ops", rationale="rerun it"))
    out = kernel.api.wait_status(fork.id, "completed", timeout=30)
    assert out["output"] == {"results": ["did 0", "did 1", "did 2"]}
    five = next(a for a in kernel.agents if a.port == kernel.ports["five"])
    # step-0 replayed (not re-run); step-1 ran once more, after a person granted it; step-2 is safe_to_retry.
    assert [line.split()[1] for line in five.effect_lines() if line.startswith(fork.id)] == ["step-1", "step-2"]
    assert [line.split()[1] for line in five.effect_lines() if line.startswith(src.id)] == [
        "step-0", "step-1", "step-2"]


def test_a_fork_whose_at_most_once_repeat_is_denied_tells_the_agent_the_rule(kernel: DevKernel) -> None:
    _, fork = _fork_before_the_payment(kernel)
    approval = _pending_approval(kernel, fork.id)
    _sdk(kernel, lambda client: client.deny_approval(approval.id, decided_by="ops", rationale="paid already"))
    out = kernel.api.wait_status(fork.id, "completed", timeout=30)
    # The SDK's PolicyError carries the rule that asked (every denied answer names one).
    assert out["output"] == {"results": ["did 0", {"denied": "__fork_effect"}, "did 2"]}
    five = next(a for a in kernel.agents if a.port == kernel.ports["five"])
    assert [line.split()[1] for line in five.effect_lines() if line.startswith(fork.id)] == ["step-2"]


def test_sub_agents_started_in_one_session_continue_one_conversation(kernel: DevKernel) -> None:
    # SDK subagent(session=…): each boss spawns one chat child in "sub-conv"; the second child
    # reads the first one's state.
    outs = []
    for _ in range(2):
        boss = _sdk(kernel, lambda client: client.create(
            "boss", {"children": 1, "child_agent": "chat", "child_session": "sub-conv"}))
        outs.append(kernel.api.wait_status(boss.id, "completed", "failed", timeout=60))
    assert [o["status"] for o in outs] == ["completed", "completed"], outs
    assert [o["output"] for o in outs] == [{"children": [{"turn": 1, "seen": []}]},
                                           {"children": [{"turn": 2, "seen": [{"i": 0}]}]}]
    kids = [kernel.api.get(o["children"][0]) for o in outs]
    assert [k["session"] for k in kids] == ["sub-conv", "sub-conv"]
    assert kids[1]["previous_execution_id"] == kids[0]["id"]
