"""POST /v0/policies/{agent_id}/test over real HTTP: replay a recorded execution, cases, errors."""

from __future__ import annotations

import httpx
import pytest

from kernel.core.kernel import Kernel
from kernel.domain import Lease
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

PERMISSIVE = """\
default_action: deny
rules:
  - id: allow-shell
    when: {target: shell_exec}
    then: {decision: allow}
  - id: allow-read
    when: {target: read_file}
    then: {decision: allow}
"""

STRICTER = """\
default_action: deny
rules:
  - id: allow-ls
    when:
      target: shell_exec
      arguments:
        command: {regex: "^ls( |$)"}
    then: {decision: allow}
  - id: deny-rm
    when: {target: shell_exec}
    then: {decision: deny, reason: destructive}
  - id: allow-read
    when: {target: read_file}
    then: {decision: allow}
"""

REGO_STRICTER = {
    "modules": {"cand.rego": """\
package cand

import rego.v1

decision := {"decision": "allow", "rule_id": "rego-ls"} if {
	input.target == "shell_exec"
	startswith(input.args.command, "ls")
} else := {"decision": "allow", "rule_id": "rego-read"} if {
	input.target == "read_file"
} else := {"decision": "deny", "rule_id": "rego-default"}
"""},
    "data": {},
    "manifest": {"roots": ["cand"], "metadata": {"regent": {"entrypoint": "cand/decision"}}},
}



@pytest.fixture
def recorded(governed: Kernel, server: ServerThread, running: Running, agent_client: AgentClient) -> str:
    """An execution under PERMISSIVE: ls, rm and read allowed, curl denied by default."""
    assert httpx.post(f"{server.url}/v0/policies/shell", json={"bundle": PERMISSIVE}).status_code == 204
    eid, did, att = running.start()
    agent_client.lease(did, att)
    answers = [agent_client.submit(eid, "shell_exec", {"command": "ls -la"}).json(),
               agent_client.submit(eid, "shell_exec", {"command": "rm -rf /"}).json(),
               agent_client.submit(eid, "read_file", {"path": "/etc/hosts"}).json(),
               agent_client.submit(eid, "curl", {"url": "http://x"}).json()]
    assert [a["decision"] for a in answers] == ["proceed", "proceed", "proceed", "denied"]
    return eid


def _test(server: ServerThread, body: dict, agent: str = "shell") -> httpx.Response:
    return httpx.post(f"{server.url}/v0/policies/{agent}/test", json=body, timeout=30)


def test_replay_against_stricter_bundle_lists_exactly_the_changed_steps(server: ServerThread, recorded: str) -> None:
    r = _test(server, {"bundle": STRICTER, "execution_id": recorded})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["steps"] == 4 and body["failed"] == 1 and body["truncated"] is False
    changed = [x for x in body["results"] if not x["pass"]]
    assert [(x["target"], x["args"], x["expect"], x["was_rule"], x["decision"], x["rule_id"], x["reason"])
            for x in changed] == [("shell_exec", {"command": "rm -rf /"}, "allow", "allow-shell", "deny",
                                   "deny-rm", "destructive")]
    assert changed[0]["failure"] == "deny, want allow"
    ls = next(x for x in body["results"] if x.get("args") == {"command": "ls -la"})
    assert ls["pass"] and ls["rule_changed"] and (ls["was_rule"], ls["rule_id"]) == ("allow-shell", "allow-ls")


def test_replay_with_the_active_bundle_changes_nothing(server: ServerThread, recorded: str) -> None:
    body = _test(server, {"execution_id": recorded}).json()
    assert body["failed"] == 0 and body["steps"] == 4
    assert all(x["pass"] and not x["rule_changed"] for x in body["results"])


def test_replay_against_more_permissive_bundle_shows_the_denied_step(server: ServerThread, recorded: str) -> None:
    body = _test(server, {"bundle": "default_action: allow\n", "execution_id": recorded}).json()
    changed = [x for x in body["results"] if not x["pass"]]
    assert [(x["target"], x["expect"], x["was_rule"], x["decision"]) for x in changed] == [
        ("curl", "deny", "default", "allow")]


def test_replay_against_rego_candidate(server: ServerThread, recorded: str) -> None:
    r = _test(server, {"bundle": REGO_STRICTER, "kind": "rego", "execution_id": recorded})
    assert r.status_code == 200, r.text
    changed = [(x["target"], x["decision"], x["rule_id"]) for x in r.json()["results"] if not x["pass"]]
    assert changed == [("shell_exec", "deny", "rego-default")]


def test_cases_run_against_candidate(server: ServerThread, recorded: str) -> None:
    r = _test(server, {"bundle": STRICTER, "cases": [
        {"name": "ls", "target": "shell_exec", "args": {"command": "ls"}, "expect": "allow", "expect_rule": "allow-ls"},
        {"target": "shell_exec", "args": {"command": "rm x"}, "expect": "allow"},
    ]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["failed"] == 1
    assert [(x["pass"], x["rule_id"]) for x in body["results"]] == [(True, "allow-ls"), (False, "deny-rm")]
    assert body["results"][1]["failure"] == "deny, want allow" and body["results"][0]["agent_id"] == "shell"
    assert body["unexercised_rules"] == ["allow-read"]


def test_bad_bundle_is_400_envelope_with_diagnostics(server: ServerThread, recorded: str) -> None:
    r = _test(server, {"bundle": "rules:\n  - id: x\n    then: {decison: allow}\n", "execution_id": recorded})
    assert r.status_code == 400 and r.json()["code"] == "validation_error" and "line" in r.json()["message"]


def test_unknown_case_key_and_unknown_body_field_are_400(server: ServerThread, recorded: str) -> None:
    assert _test(server, {"cases": [{"target": "x", "expects": "allow"}]}).status_code == 400
    assert _test(server, {"bundel": PERMISSIVE}).json()["code"] == "validation_error"


def test_unknown_execution_or_agent_is_404(server: ServerThread, recorded: str) -> None:
    r = _test(server, {"execution_id": "01890000-0000-7000-8000-000000000000"})
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert _test(server, {"bundle": PERMISSIVE}, agent="nobody").status_code == 404


def test_execution_of_another_agent_is_404(governed: Kernel, server: ServerThread, recorded: str) -> None:
    other = Running(governed, agent_id="other")
    assert httpx.post(f"{server.url}/v0/policies/other", json={"bundle": PERMISSIVE}).status_code == 204
    assert other and _test(server, {"execution_id": recorded}, agent="other").status_code == 404


def test_agent_without_bundle_and_no_candidate_is_400(governed: Kernel, server: ServerThread) -> None:
    Running(governed, agent_id="bare")
    r = _test(server, {"cases": [{"target": "x"}]}, agent="bare")
    assert r.status_code == 400 and "has no policy bundle" in r.json()["message"]


def test_execution_id_that_is_not_a_uuid_is_400(server: ServerThread, recorded: str) -> None:
    assert _test(server, {"execution_id": "nope"}).status_code == 400


def test_replay_writes_no_events(server: ServerThread, recorded: str) -> None:
    before = httpx.get(f"{server.url}/v0/executions/{recorded}/events").json()
    _test(server, {"bundle": STRICTER, "execution_id": recorded})
    assert httpx.get(f"{server.url}/v0/executions/{recorded}/events").json() == before


def test_backtest_replays_the_agents_executions_newest_first_within_session_since_and_limit(
    governed: Kernel, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    from kernel.core import executions
    from kernel.core.dispatch import claim_due
    from kernel.core.executions import Lineage

    assert httpx.post(f"{server.url}/v0/policies/shell", json={"bundle": PERMISSIVE}).status_code == 204
    ids, leases = [], {}
    for i, session in enumerate(("s1", "s1", None)):
        e, _ = executions.create_execution(governed, "shell", i, lineage=Lineage(session=session))
        if i == 1:  # queued behind the first one of s1: admit it by ending the first
            c0 = leases[ids[0]]
            executions.finish_execution(governed, Lease("shell", ids[0], c0.dispatch_id, c0.attempt), output=None)
        c = leases[e.id] = next(c for c in claim_due(governed, 10) if c.execution_id == e.id)
        agent_client.lease(c.dispatch_id, c.attempt)
        agent_client.submit(e.id, "shell_exec", {"command": f"rm -rf /{i}"})
        ids.append(e.id)
    body = _test(server, {"bundle": STRICTER, "executions": {}}).json()
    assert (body["executions"], body["steps"], body["failed"]) == (3, 3, 3)
    assert [x["execution_id"] for x in body["results"]] == list(reversed(ids))  # newest first
    body = _test(server, {"bundle": STRICTER, "executions": {"session": "s1", "limit": 1}}).json()
    assert body["executions"] == 1 and [x["execution_id"] for x in body["results"]] == [ids[1]]
    body = _test(server, {"bundle": STRICTER, "executions": {"since": "2999-01-01T00:00:00Z"}}).json()
    assert body["executions"] == 0 and body["results"] == []
    assert _test(server, {"executions": {"limit": 1001}}).status_code == 400
    assert _test(server, {"executions": {"since": "yesterday"}}).status_code == 400
