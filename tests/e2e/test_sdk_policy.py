"""Policy end to end: a real `regent dev`, official-SDK agents (tests/e2e/policy_agent.py) on
loopback, YAML and Rego bundles posted through the admin API, and approvals decided over HTTP:
deny-by-default, approval grant / deny / expiry by the sweep, and the Rego twin of the shell bundle."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import (
    DEV_KERNEL_ENV,
    REPO,
    SECRET,
    AgentProc,
    DevKernel,
    KernelProc,
    wait_for,
)
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

POLICY_AGENT = Path(__file__).with_name("policy_agent.py")
YAML_AGENT, REGO_AGENT = "pol-yaml", "pol-rego"

# bundles/shell.yaml plus one rule whose approval times out quickly, so the sweep expires it.
TIMED_RULE = """
  - id: approve-timed
    when:
      target: timed_exec
    then:
      decision: require_approval
      reason: a quick human
      approval_config:
        approvers: [oncall]
        timeout: 2s
"""


def rego_bundle() -> dict[str, Any]:
    d = REPO / "bundles" / "shell-rego"
    return {"kind": "rego", "bundle": {
        "modules": {"policy.rego": (d / "policy.rego").read_text()},
        "data": json.loads((d / "data.json").read_text()),
        "manifest": {"revision": "e2e", "roots": ["shell"],
                     "metadata": {"regent": {"entrypoint": "shell/decision", "default_action": "deny"}}},
    }}


class PolicyKernel(DevKernel):
    def __init__(self, proc: KernelProc, ports: dict[str, int], tmp: Path):
        super().__init__(proc, ports, tmp)
        self.by_id: dict[str, AgentProc] = {}

    def run(self, agent_id: str, input: Any, *statuses: str) -> tuple[str, dict[str, Any]]:
        eid = self.api.create(agent_id, input)
        return eid, self.api.wait_status(eid, *(statuses or ("completed", "failed", "cancelled")), timeout=30)

    def effects(self, agent_id: str, eid: str) -> list[str]:
        return [line for line in self.by_id[agent_id].effect_lines() if line.startswith(f"{eid} ")]

    def logs(self, agent_id: str, eid: str, event: str) -> list[dict[str, Any]]:
        return [r for r in self.by_id[agent_id].log_lines(event) if r.get("execution_id") == eid]

    def decisions(self, eid: str, typ: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.api.events(eid) if e["type"] == typ]

    def pending(self, eid: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            rows = self.api.http.get("/v0/approvals", params={"status": "pending"}).json()
            return next((a for a in rows if a["execution_id"] == eid), None)
        return dict(wait_for(find, f"a pending approval for {eid}", timeout=10))

    def decide(self, approval_id: str, verb: str, decided_by: str, rationale: str) -> int:
        r = self.api.http.post(f"/v0/approvals/{approval_id}/{verb}",
                               json={"decided_by": decided_by, "rationale": rationale})
        return r.status_code


@pytest.fixture(scope="module")
def pk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyKernel]:
    """One `regent dev` with a 1 s cleanup sweep; one policy agent per bundle kind."""
    tmp = tmp_path_factory.mktemp("policy")
    ports = {a: free_port() for a in (YAML_AGENT, REGO_AGENT)}
    lines = ["agents:"]
    for agent_id, port in ports.items():
        lines += [f"  - id: {agent_id}", f"    webhook_url: http://127.0.0.1:{port}/webhook",
                  "    secret: ${E2E_SECRET}"]
    manifest = tmp / "regent.yaml"
    manifest.write_text("\n".join(lines) + "\n")
    proc = KernelProc("dev", free_port(), f"sqlite:///{tmp}/regent.db", manifest, tmp / "kernel.out",
                      E2E_SECRET=SECRET, REGENT_CLEANUP_INTERVAL="1s", **DEV_KERNEL_ENV)
    k = PolicyKernel(proc, ports, tmp)
    try:
        for agent_id in ports:
            k.by_id[agent_id] = k.agent(agent_id, script=POLICY_AGENT)
        yaml_bundle = (REPO / "bundles" / "shell.yaml").read_text().rstrip("\n") + "\n" + TIMED_RULE
        r = k.api.http.post(f"/v0/policies/{YAML_AGENT}", json={"bundle": yaml_bundle})
        assert r.status_code == 204, r.text
        r = k.api.http.post(f"/v0/policies/{REGO_AGENT}", json=rego_bundle())
        assert r.status_code == 204, r.text
        yield k
    finally:
        for a in k.agents:
            a.stop(signal.SIGKILL)
        k.api.close()
        proc.stop_gracefully()


def test_yaml_allows_a_read_only_command_and_runs_the_tool_once(pk: PolicyKernel) -> None:
    eid, e = pk.run(YAML_AGENT, {"tool": "shell_exec", "command": "ls"})
    assert e["status"] == "completed", e
    assert e["output"] == {"denied": False, "result": "ran shell_exec"}
    assert pk.effects(YAML_AGENT, eid) == [f'{eid} shell_exec {{"command": "ls"}}']
    [allowed] = pk.decisions(eid, "step.allowed")
    assert (allowed["rule_id"], allowed["policy_kind"]) == ("allow-read-only", "yaml")


def test_yaml_denies_an_unknown_tool_by_default(pk: PolicyKernel) -> None:
    eid, e = pk.run(YAML_AGENT, {"tool": "fs_delete", "path": "/etc"})
    assert e["status"] == "completed", e
    assert e["output"]["denied"] is True and e["output"]["rule_id"] == "default"
    [seen] = pk.logs(YAML_AGENT, eid, "policy_denied")
    assert (seen["code"], seen["rule_id"]) == ("policy_denied", "default")
    [denied] = pk.decisions(eid, "step.denied")
    assert (denied["rule_id"], denied["policy_kind"], denied["target"]) == ("default", "yaml", "fs_delete")
    assert pk.effects(YAML_AGENT, eid) == []
    assert "step.executing" not in pk.api.types(eid)


def test_yaml_approval_grant_resumes_and_the_tool_runs_exactly_once(pk: PolicyKernel) -> None:
    eid, e = pk.run(YAML_AGENT, {"tool": "shell_exec", "command": "rm -rf /nonexistent"}, "blocked")
    approval = pk.pending(eid)
    assert approval["approvers"] == ["oncall"]
    assert pk.effects(YAML_AGENT, eid) == []
    [asked] = pk.decisions(eid, "step.awaiting_approval")
    assert asked["rule_id"] == "approve-other-commands" and asked["policy_kind"] == "yaml"
    assert pk.decide(approval["id"], "grant", "mallory", "let me") == 403
    assert pk.api.get(eid)["status"] == "blocked"
    assert pk.decide(approval["id"], "grant", "oncall", "looks fine") in (200, 204)
    e = pk.api.wait_status(eid, "completed", "failed", timeout=30)
    assert e["status"] == "completed", e
    assert e["output"] == {"denied": False, "result": "ran shell_exec"}
    assert pk.effects(YAML_AGENT, eid) == [f'{eid} shell_exec {{"command": "rm -rf /nonexistent"}}']
    assert len(pk.logs(YAML_AGENT, eid, "calling")) == 2  # blocked once, re-delivered once
    decided = pk.api.http.get(f"/v0/approvals/{approval['id']}").json()
    assert (decided["status"], decided["decided_by"]) == ("granted", "oncall")


def test_yaml_approval_deny_resumes_with_the_rationale_as_the_reason(pk: PolicyKernel) -> None:
    eid, _ = pk.run(YAML_AGENT, {"tool": "shell_exec", "command": "ls; cat /etc/shadow"}, "blocked")
    approval = pk.pending(eid)
    assert approval["approvers"] == ["oncall"]
    assert approval["message"] == "The shell agent wants to run a compound command."
    assert pk.decide(approval["id"], "deny", "oncall", "not on my watch") in (200, 204)
    e = pk.api.wait_status(eid, "completed", "failed", timeout=30)
    assert e["status"] == "completed", e
    assert e["output"]["denied"] is True and e["output"]["reason"] == "not on my watch"
    [seen] = pk.logs(YAML_AGENT, eid, "policy_denied")
    assert (seen["reason"], seen["rule_id"]) == ("not on my watch", approval["rule_id"])  # the SDK's PolicyError
    # the approver's decision, not a bundle's, denies the step: the event carries the error
    [denied] = pk.decisions(eid, "step.denied")
    assert denied["error"] == {"reason": "not on my watch", "rule_id": approval["rule_id"]}
    assert [p["decided_by"] for p in pk.decisions(eid, "approval.denied")] == ["oncall"]
    assert pk.effects(YAML_AGENT, eid) == []


def test_yaml_approval_with_a_short_timeout_is_expired_by_the_sweep(pk: PolicyKernel) -> None:
    eid, _ = pk.run(YAML_AGENT, {"tool": "timed_exec", "command": "deploy"}, "blocked")
    approval = pk.pending(eid)
    e = pk.api.wait_status(eid, "completed", "failed", timeout=20)
    assert e["status"] == "completed", e
    assert e["output"]["denied"] is True and e["output"]["reason"] == "approval_timeout"
    [seen] = pk.logs(YAML_AGENT, eid, "policy_denied")
    assert (seen["reason"], seen["rule_id"]) == ("approval_timeout", approval["rule_id"])
    assert "approval.expired" in pk.api.types(eid)
    [denied] = pk.decisions(eid, "step.denied")
    assert denied["error"] == {"reason": "approval_timeout", "rule_id": approval["rule_id"]}
    assert pk.api.http.get(f"/v0/approvals/{approval['id']}").json()["status"] == "expired"
    assert pk.effects(YAML_AGENT, eid) == []


def test_rego_bundle_allows_denies_and_asks_for_approval(pk: PolicyKernel) -> None:
    eid, e = pk.run(REGO_AGENT, {"tool": "shell_exec", "command": "ls -la"})
    assert e["output"] == {"denied": False, "result": "ran shell_exec"}, e
    [allowed] = pk.decisions(eid, "step.allowed")
    assert (allowed["rule_id"], allowed["policy_kind"]) == ("allow-read-only", "rego")
    assert len(pk.effects(REGO_AGENT, eid)) == 1

    eid, e = pk.run(REGO_AGENT, {"tool": "fs_delete", "path": "/etc"})
    assert e["output"]["denied"] is True and e["output"]["rule_id"] == "default", e
    [denied] = pk.decisions(eid, "step.denied")
    assert (denied["rule_id"], denied["policy_kind"]) == ("default", "rego")
    assert [r["rule_id"] for r in pk.logs(REGO_AGENT, eid, "policy_denied")] == ["default"]
    assert pk.effects(REGO_AGENT, eid) == []

    eid, _ = pk.run(REGO_AGENT, {"tool": "shell_exec", "command": "rm -rf /nonexistent"}, "blocked")
    approval = pk.pending(eid)
    assert approval["approvers"] == ["oncall"]
    [asked] = pk.decisions(eid, "step.awaiting_approval")
    assert (asked["rule_id"], asked["policy_kind"]) == ("approve-other-commands", "rego")
    assert pk.decide(approval["id"], "grant", "mallory", "") == 403
    assert pk.decide(approval["id"], "grant", "oncall", "ok") in (200, 204)
    e = pk.api.wait_status(eid, "completed", "failed", timeout=30)
    assert e["output"] == {"denied": False, "result": "ran shell_exec"}, e
    assert len(pk.effects(REGO_AGENT, eid)) == 1
    assert [p["decided_by"] for p in pk.decisions(eid, "approval.granted")] == ["oncall"]
