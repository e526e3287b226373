"""The judge decision end to end: a real kernel over HTTP asks a real judge process (rebuno-v0 §3.6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel.core.kernel import Kernel
from kernel.core.policies import store_policy
from kernel.core.ports import NoJudge
from tests.conftest import Running
from tests.judge.conftest import BUNDLE, JudgeServer, make_judge
from tests.support import AgentClient, ServerThread, free_port


def _start(k: Kernel, running: Running, client: AgentClient) -> str:
    store_policy(k, "shell", "yaml", BUNDLE)
    eid, did, att = running.start()
    client.lease(did, att)
    return eid


def _decision_event(server: ServerThread, eid: str) -> dict[str, Any]:
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events").json()
    types = ("step.allowed", "step.denied", "step.awaiting_approval")
    return next(e for e in reversed(events) if e["type"] in types)["payload"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("probabilities", "decision", "reason"),
    [
        ({"allow": 0.9, "deny": 0.05}, "proceed", "judge: allow 0.90"),
        ({"allow": 0.04, "deny": 0.91}, "denied", "judge: deny 0.91"),
        ({"require_approval": 0.8, "allow": 0.2}, "blocked", "judge: require_approval 0.80"),
        ({"allow": 0.4, "deny": 0.3, "require_approval": 0.3}, "blocked", "judge: allow 0.40 below threshold 0.60"),
        ({"allow": 0.6}, "proceed", "judge: allow 0.60"),  # at the threshold counts
        ({"allow": 0.45, "deny": 0.45}, "blocked", "judge: deny 0.45 below threshold 0.60"),  # ties: the careful one
    ],
    ids=["allow", "deny", "require-approval", "below-threshold", "at-threshold", "tie"],
)
def test_judge_outcome_follows_probabilities_and_threshold(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
    probabilities: dict[str, float], decision: str, reason: str,
) -> None:
    judge_server.set(probabilities=probabilities)
    eid = _start(judged, running, agent_client)
    answer = agent_client.submit(eid, "send_email", {"to": "a@example.com"}).json()
    assert answer["decision"] == decision
    event = _decision_event(server, eid)
    assert (event["rule_id"], event["reason"]) == ("ask-model", reason)
    record = event["judge"]
    assert record["probabilities"] == probabilities and record["threshold"] == 0.6
    assert record["outcome"] == {"proceed": "allow", "denied": "deny", "blocked": "require_approval"}[decision]
    assert record["request"]["tool_call"] == {"agent_id": "shell", "tool": "send_email",
                                              "arguments": {"to": "a@example.com"}}
    assert record["latency_ms"] >= 0
    # The decisions record carries the same judge record, so an auditor sees why without the log.
    [row] = httpx.get(f"{server.url}/v0/decisions", params={"execution_id": eid}).json()["decisions"]
    assert (row["rule_id"], row["reason"], row["judge"]) == ("ask-model", reason, record)
    judged = httpx.get(f"{server.url}/v0/decisions", params={"judged": "true"}).json()["decisions"]
    assert [d["id"] for d in judged] == [row["id"]]
    if decision == "denied":
        assert (answer["reason"], answer["rule_id"]) == (reason, "ask-model")


def test_require_approval_outcome_uses_the_rule_approval_config(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    judge_server.set(probabilities={"require_approval": 0.95})
    eid = _start(judged, running, agent_client)
    answer = agent_client.submit(eid, "send_email", {"to": "a@example.com"}).json()
    approval = httpx.get(f"{server.url}/v0/approvals/{answer['approval_id']}").json()
    assert approval["approvers"] == ["alice"] and approval["message"] == "the model was unsure"


def test_rendered_body_and_headers_are_what_the_judge_receives(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    eid = _start(judged, running, agent_client)
    agent_client.submit(eid, "send_email", {"to": "a@example.com", "n": 2})
    agent_client.submit(eid, "wire_funds", {"amount": 5})
    first, second = judge_server.received()
    assert first["authorization"] == "Bearer test-key-123"
    body = json.loads(first["body"])
    assert body["model"] == "test-judge"
    assert body["state"] == {"tool_call": {"agent_id": "shell", "tool": "send_email",
                                           "arguments": {"to": "a@example.com", "n": 2}}}
    question = body["questions"]["decision"]
    assert question["instructions"]["note"] == "Does this email leak customer data?"
    assert question["instructions"]["question"].startswith("Should `tool_call` run automatically")
    assert set(question["criteria"]) == {"allow", "deny", "require_approval"}
    # No instructions on the rule: the template's {{else}} branch asks the bare question.
    assert json.loads(second["body"])["questions"]["decision"]["instructions"].startswith("Should")
    # The provider's secret header is sent, never recorded.
    assert "test-key-123" not in httpx.get(f"{server.url}/v0/executions/{eid}/events").text


@pytest.mark.parametrize(
    ("mode", "why"),
    [("error", "judge returned 500"), ("malformed", "judge answer is not JSON"),
     ("no-probabilities", "judge response has no probabilities at answers.decision.probabilities")],
    ids=["status-500", "malformed", "no-probabilities"],
)
def test_broken_judge_falls_back_with_the_reason(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
    mode: str, why: str,
) -> None:
    judge_server.set(mode=mode)
    eid = _start(judged, running, agent_client)
    strict = agent_client.submit(eid, "wire_funds", {"amount": 5}).json()  # fallback: deny
    assert (strict["decision"], strict["reason"]) == ("denied", f"judge unavailable: {why}")
    lenient = agent_client.submit(eid, "send_email", {"to": "x"}).json()  # fallback: require_approval
    assert lenient["decision"] == "blocked"
    assert _decision_event(server, eid)["judge"]["error"] == why


def test_judge_timeout_falls_back(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    judged.judge = make_judge(judge_server.url, timeout_seconds=0.3)
    judge_server.set(delay=3.0)
    eid = _start(judged, running, agent_client)
    answer = agent_client.submit(eid, "wire_funds", {"amount": 5}).json()
    assert (answer["decision"], answer["reason"]) == ("denied", "judge unavailable: timeout after 0.3s")


def test_refused_connection_falls_back(
    judged: Kernel, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    judged.judge = make_judge(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    eid = _start(judged, running, agent_client)
    answer = agent_client.submit(eid, "wire_funds", {"amount": 5}).json()
    assert answer["decision"] == "denied"
    assert answer["reason"].startswith("judge unavailable: cannot connect")


def test_judge_not_configured_denies(
    judged: Kernel, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    judged.judge = NoJudge()
    eid = _start(judged, running, agent_client)
    answer = agent_client.submit(eid, "send_email", {"to": "x"}).json()  # even with a lenient fallback
    assert (answer["decision"], answer["reason"], answer["rule_id"]) == ("denied", "judge not configured", "ask-model")


def test_replayed_step_does_not_ask_the_judge_again(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    from kernel.core.dispatch import claim_due, reap_expired_leases

    judge_server.set(probabilities={"deny": 0.99})
    eid = _start(judged, running, agent_client)
    first = agent_client.submit(eid, "wire_funds", {"amount": 5}).json()
    assert first["decision"] == "denied" and len(judge_server.received()) == 1
    judged.clock.advance(judged.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
    reap_expired_leases(judged)
    [claim] = [c for c in claim_due(judged, 10) if c.execution_id == eid]
    judge_server.set(probabilities={"allow": 0.99})  # would now allow: a replay must not ask
    again = agent_client.lease(claim.dispatch_id, claim.attempt).submit(eid, "wire_funds", {"amount": 5}).json()
    assert (again["decision"], again["step_id"], again["reason"]) == ("denied", first["step_id"], "judge: deny 0.99")
    assert judge_server.received() == []


def test_plain_rules_never_call_the_judge(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    eid = _start(judged, running, agent_client)
    assert agent_client.submit(eid, "read_file", {"p": "/etc/hosts"}).json()["decision"] == "proceed"
    assert agent_client.submit(eid, "curl", {}).json()["decision"] == "denied"
    assert judge_server.received() == []
    assert "judge" not in _decision_event(server, eid)


def test_rego_bundle_judge_decision_asks_the_judge(
    judged: Kernel, judge_server: JudgeServer, server: ServerThread, running: Running, agent_client: AgentClient,
    tmp_path: Path,
) -> None:
    from kernel.manifest import policy_content
    from kernel.policy.resolver import BundleResolver, LazyRegoEngine

    b = tmp_path / "mail"
    b.mkdir()
    (b / ".manifest").write_text('{"revision": "r1", "roots": ["mail"]}')
    (b / "policy.rego").write_text(
        "package mail\nimport rego.v1\n"
        'decision := {"decision": "judge", "rule_id": "ask-model", '
        '"judge": {"instructions": "leaks?", "fallback": "deny"}} if input.target == "send_email"\n'
    )
    rego = LazyRegoEngine(size=1, timeout=5.0)
    judged.policy = BundleResolver(judged.store, rego=rego)
    try:
        kind, content = policy_content(b)
        store_policy(judged, "shell", kind, content)
        judge_server.set(probabilities={"deny": 0.91})
        eid, did, att = running.start()
        answer = agent_client.lease(did, att).submit(eid, "send_email", {"to": "x"}).json()
        assert (answer["decision"], answer["rule_id"], answer["reason"]) == ("denied", "ask-model", "judge: deny 0.91")
        event = _decision_event(server, eid)
        assert event["policy_kind"] == "rego" and event["judge"]["instructions"] == "leaks?"
    finally:
        rego.close()
