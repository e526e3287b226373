"""Replay: the pure library, and loading recorded steps from the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import httpx

from kernel.core.kernel import Kernel
from kernel.core.policy_test import recorded_steps, replay_execution
from kernel.policy.backtest import RecordedStep, replay
from kernel.policy.resolver import yaml_revision
from kernel.policy.yaml import compile_yaml_bundle
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

STRICT = "default_action: deny\nrules:\n  - id: allow-ls\n    when: {target: ls}\n    then: {decision: allow}\n"
ASK = """\
default_action: allow
rules:
  - id: ask-deploy
    when: {target: deploy}
    then: {decision: require_approval}
"""


def _compiled(text: str) -> object:
    return compile_yaml_bundle(text, revision=yaml_revision(text))


def _step(seq: int, target: str, was: str, rule: str) -> RecordedStep:
    return RecordedStep(execution_id="e", step_id=f"s{seq}", seq=seq, agent_id="a", kind="tool_call",
                        target=target, args=None, was_decision=was, was_rule=rule)


def test_replay_reports_every_step_and_only_verdict_changes_count() -> None:
    steps = [_step(1, "ls", "allow", "permissive"), _step(2, "rm", "allow", "permissive"),
             _step(3, "cat", "deny", "old-deny")]
    rep = replay(_compiled(STRICT), steps)  # type: ignore[arg-type]
    assert len(rep.results) == 3 and rep.failed == 1 and not rep.truncated
    [c] = rep.changes
    assert (c.step.step_id, c.decision, c.rule_id, c.step.was_rule) == ("s2", "deny", "default", "permissive")
    same = rep.results[2]
    assert not same.changed and same.rule_changed  # deny by another rule is not a change


def test_replay_of_no_steps_is_empty() -> None:
    rep = replay(_compiled(STRICT), [])  # type: ignore[arg-type]
    assert rep.results == [] and rep.failed == 0



def test_first_decision_counts_not_the_grant(governed: Kernel, server: ServerThread, running: Running,
                                             agent_client: AgentClient) -> None:
    assert httpx.post(f"{server.url}/v0/policies/shell", json={"bundle": ASK}).status_code == 204
    eid, did, att = running.start({"ticket": 7})
    blocked = agent_client.lease(did, att).submit(eid, "deploy", {"env": "prod"}).json()
    assert blocked["decision"] == "blocked"
    assert httpx.post(f"{server.url}/v0/approvals/{blocked['approval_id']}/grant",
                      json={"decided_by": "alice"}).status_code in (200, 204)
    with governed.store.read() as tx:
        steps, truncated = recorded_steps(tx, eid, "shell")
    [s] = steps
    assert (s.was_decision, s.was_rule, s.args, truncated) == ("require_approval", "ask-deploy", {"env": "prod"}, False)
    assert s.execution["input"] == {"ticket": 7} and s.now
    rep = replay_execution(governed, "shell", eid, None)
    assert rep.failed == 0


def test_recorded_steps_carry_usage_so_far_and_respect_the_cap(governed: Kernel, server: ServerThread,
                                                               running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    llm = agent_client.submit(eid, "gpt", {"p": 1}, kind="llm_call").json()
    done = agent_client.complete_step(eid, llm["step_id"], {"usage": {"input_tokens": 5, "output_tokens": 7}})
    assert done.status_code == 200, done.text
    for n in range(3):
        agent_client.submit(eid, "ls", {"n": n})
    with governed.store.read() as tx:
        steps, truncated = recorded_steps(tx, eid, "shell")
        capped, capped_truncated = recorded_steps(tx, eid, "shell", limit=2)
    assert [s.target for s in steps] == ["gpt", "ls", "ls", "ls"] and not truncated
    assert steps[0].usage == {"input_tokens": 0, "output_tokens": 0}
    assert steps[1].usage == {"input_tokens": 5, "output_tokens": 7}
    assert [s.seq for s in steps] == sorted(s.seq for s in steps)
    assert len(capped) == 2 and capped_truncated
