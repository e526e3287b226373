"""The policy admin API and the resolver, over real HTTP: store, audit fields, revisions, fail closed."""

from __future__ import annotations

import httpx
import pytest

from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

SHELL = """\
default_action: deny
rules:
  - id: allow-ls
    when:
      target: shell_exec
      arguments:
        command: {regex: "^ls( |$)"}
    then:
      decision: allow
  - id: ask-rm
    when:
      target: shell_exec
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 5m}
"""



def _post(server: ServerThread, agent: str, bundle: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v0/policies/{agent}", json={"bundle": bundle})


def test_stored_bundle_decides_and_events_carry_audit_fields(governed: Kernel, server: ServerThread,
                                                             running: Running, agent_client: AgentClient) -> None:
    assert _post(server, "shell", SHELL).status_code == 204
    active = httpx.get(f"{server.url}/v0/policies/shell").json()
    assert active["kind"] == "yaml" and active["bundle"] == SHELL and len(active["revision"]) == 64
    eid, did, att = running.start()
    agent_client.lease(did, att)
    assert agent_client.submit(eid, "shell_exec", {"command": "ls -la"}).json()["decision"] == "proceed"
    denied = agent_client.submit(eid, "curl", {}).json()
    assert (denied["decision"], denied["rule_id"], denied["reason"]) == ("denied", "default", "no explicit allow rule matched")
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events").json()
    allowed = next(e for e in events if e["type"] == "step.allowed")["payload"]
    assert (allowed["rule_id"], allowed["policy_kind"], allowed["policy_revision"]) == (
        "allow-ls", "yaml", active["revision"])
    blocked = agent_client.submit(eid, "shell_exec", {"command": "rm -rf /"}).json()
    assert blocked["decision"] == "blocked" and blocked["approval_id"]
    approval = httpx.get(f"{server.url}/v0/approvals/{blocked['approval_id']}").json()
    assert approval["approvers"] == ["alice"]


def test_invalid_bundle_is_400_with_line_and_active_revision_keeps_deciding(
        governed: Kernel, server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    _post(server, "shell", SHELL)
    bad = _post(server, "shell", "rules:\n  - id: x\n    then: {decison: allow}\n")
    assert bad.status_code == 400 and bad.json()["code"] == "validation_error"
    assert "line" in bad.json()["message"]
    eid, did, att = running.start()
    assert agent_client.lease(did, att).submit(eid, "shell_exec", {"command": "ls"}).json()["decision"] == "proceed"


def test_judge_rule_loads_and_denies_without_a_judge(governed: Kernel, server: ServerThread, running: Running,
                                                      agent_client: AgentClient) -> None:
    assert _post(server, "shell", "rules:\n  - id: j\n    then: {decision: judge}\n").status_code == 204
    eid, did, att = running.start()
    answer = agent_client.lease(did, att).submit(eid, "shell_exec", {"command": "ls"}).json()
    assert (answer["decision"], answer["rule_id"], answer["reason"]) == ("denied", "j", "judge not configured")


def test_revisions_are_kept_and_an_earlier_one_can_be_reactivated(governed: Kernel, server: ServerThread,
                                                                  running: Running, agent_client: AgentClient) -> None:
    _post(server, "shell", SHELL)
    _post(server, "shell", "default_action: allow\n")
    revs = httpx.get(f"{server.url}/v0/policies/shell/revisions").json()
    assert [(r["seq"], r["active"]) for r in revs] == [(1, False), (2, True)]
    eid, did, att = running.start()
    agent_client.lease(did, att)
    assert agent_client.submit(eid, "curl").json()["decision"] == "proceed"
    assert httpx.post(f"{server.url}/v0/policies/shell/revisions/1/activate").status_code == 204
    assert agent_client.submit(eid, "wget").json()["decision"] == "denied"
    assert httpx.post(f"{server.url}/v0/policies/shell/revisions/9/activate").status_code == 404


@pytest.mark.parametrize("seq", ["2147483648", "9223372036854775806", "9223372036854775808", "99999999999999999999",
                                 "1000000000", "0", "-1", "x"])
def test_activate_with_a_seq_outside_its_bounds_is_400(governed: Kernel, server: ServerThread,
                                                                  seq: str) -> None:
    r = httpx.post(f"{server.url}/v0/policies/shell/revisions/{seq}/activate")
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "validation_error"


def test_empty_bundle_clears_the_policy(governed: Kernel, server: ServerThread, running: Running,
                                        agent_client: AgentClient) -> None:
    _post(server, "shell", SHELL)
    assert _post(server, "shell", "").status_code == 204
    assert httpx.get(f"{server.url}/v0/policies/shell").status_code == 404
    eid, did, att = running.start()
    r = agent_client.lease(did, att).submit(eid, "anything").json()
    assert (r["decision"], "rule_id" in r) == ("proceed", False)


def test_unknown_agent_is_404(governed: Kernel, server: ServerThread) -> None:
    assert _post(server, "ghost", SHELL).status_code == 404


def test_replaced_bundle_does_not_regate_replayed_steps(governed: Kernel, server: ServerThread, running: Running,
                                                        agent_client: AgentClient) -> None:
    _post(server, "shell", "default_action: allow\n")
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "deploy", {"env": "prod"}).json()["step_id"]
    agent_client.complete_step(eid, sid, {"ok": True})
    _post(server, "shell", "default_action: deny\n")
    # A fresh attempt replays from occurrence 0: the recorded result comes back, policy is not asked.
    governed.clock.advance(governed.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
    from kernel.core.dispatch import claim_due, reap_expired_leases

    reap_expired_leases(governed)
    [c] = [c for c in claim_due(governed, 10) if c.execution_id == eid]
    again = agent_client.lease(c.dispatch_id, c.attempt).submit(eid, "deploy", {"env": "prod"}).json()
    assert (again["decision"], again["result"]) == ("replay", {"ok": True})
    assert agent_client.submit(eid, "deploy", {"env": "prod"}).json()["decision"] == "denied"


def test_stored_bundle_that_no_longer_compiles_denies_bundle_error(governed: Kernel, running: Running) -> None:
    from kernel.domain import PolicyInput

    with governed.store.transaction() as tx:
        tx.add_policy_revision("shell", "yaml", "r-broken", "rules: [{id: x}]", governed.clock.now())
    d = governed.policy.decide(PolicyInput(agent_id="shell", kind="tool_call", target="t", args=None))
    assert (d.verdict, d.rule_id, d.reason) == ("deny", "bundle-error", "policy_bundle_invalid")


def test_re_registering_an_agent_clears_its_policy_as_an_audited_event(
        governed: Kernel, server: ServerThread, running: Running, caplog: pytest.LogCaptureFixture) -> None:
    assert _post(server, "shell", SHELL).status_code == 204
    again = {"id": "shell", "webhook_url": "http://127.0.0.1:9/webhook", "secret": "s3cret"}
    with caplog.at_level("WARNING", logger="kernel.agents"):
        assert httpx.post(f"{server.url}/v0/agents", json=again).status_code == 200
    assert httpx.get(f"{server.url}/v0/policies/shell").status_code == 404  # permissive now, as in Rebuno
    events = httpx.get(f"{server.url}/v0/policies/shell/events").json()
    assert [(e["type"], e["payload"]) for e in events][:2] == [
        ("policy.cleared", {"reason": "agent_reregistered"}), ("policy.activated", events[1]["payload"])]
    assert events[0]["credential"] == "dev"
    assert any("re-registered" in r.getMessage() and "permissive" in r.getMessage() for r in caplog.records)
    # a second registration finds nothing to clear: no second event
    assert httpx.post(f"{server.url}/v0/agents", json=again).status_code == 200
    assert [e["type"] for e in httpx.get(f"{server.url}/v0/policies/shell/events").json()].count("policy.cleared") == 1
