"""Answers to an approval name the rule and bundle that asked, an approval's `approvers` is a list,
and a cancel records who and why, its pending approval reading `cancelled` (docs/audit.md)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

BUNDLE = """
default_action: deny
rules:
  - id: ask-anyone
    when: {target: wire}
    then:
      decision: require_approval
      reason: wires need a human
  - id: ask-treasury
    when: {target: pay}
    then:
      decision: require_approval
      approval_config: {approvers: [treasury]}
"""
DECISION_FIELDS = ("rule_id", "policy_kind", "policy_revision", "policy_hash")


def _blocked(server: ServerThread, running: Running, agent: AgentClient, target: str) -> tuple[str, dict[str, Any]]:
    eid, did, att = running.start()
    r = agent.lease(did, att).submit(eid, target, {"amount": 5})
    assert r.json()["decision"] == "blocked", r.text
    a = httpx.get(f"{server.url}/v0/approvals/{r.json()['approval_id']}").json()
    return eid, a


def _events(server: ServerThread, eid: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{server.url}/v0/executions/{eid}/events").json())


def _asked(events: list[dict[str, Any]]) -> dict[str, Any]:
    p = next(e["payload"] for e in events if e["type"] == "step.awaiting_approval")
    return {k: p[k] for k in DECISION_FIELDS}


@pytest.fixture
def with_bundle(governed: Kernel, server: ServerThread, running: Running) -> ServerThread:
    """The kernel deciding by the agent's stored bundle, BUNDLE."""
    r = httpx.post(f"{server.url}/v0/policies/shell", json={"bundle": BUNDLE})
    assert r.status_code == 204, r.text
    return server


@pytest.mark.parametrize("answer", ["grant", "deny"])
def test_the_step_event_an_answer_writes_names_the_rule_and_bundle_that_asked(
        with_bundle: ServerThread, running: Running, agent_client: AgentClient, answer: str) -> None:
    eid, a = _blocked(with_bundle, running, agent_client, "wire")
    assert httpx.post(f"{with_bundle.url}/v0/approvals/{a['id']}/{answer}",
                      json={"decided_by": "alice"}).status_code == 204
    events = _events(with_bundle, eid)
    asked = _asked(events)
    assert asked["rule_id"] == "ask-anyone" and asked["policy_kind"] == "yaml" and len(asked["policy_hash"]) == 64
    typ = "step.allowed" if answer == "grant" else "step.denied"
    answered = [e["payload"] for e in events if e["type"] == typ]
    assert len(answered) == 1
    assert {k: answered[0].get(k) for k in DECISION_FIELDS} == asked
    # The decision record of the answer names the whole bundle too.
    (rec,) = [d for d in httpx.get(f"{with_bundle.url}/v0/decisions", params={"execution_id": eid}).json()["decisions"]
              if d["decision"].startswith("approval_")]
    assert (rec["policy_kind"], rec["policy_revision"]) == (asked["policy_kind"], asked["policy_revision"])


def test_an_approval_without_approvers_lists_none_as_an_empty_list(
        with_bundle: ServerThread, running: Running, agent_client: AgentClient) -> None:
    _, a = _blocked(with_bundle, running, agent_client, "wire")
    assert a["approvers"] == []
    (listed,) = httpx.get(f"{with_bundle.url}/v0/approvals").json()
    assert listed["approvers"] == []
    _, b = _blocked(with_bundle, running, agent_client, "pay")
    assert b["approvers"] == ["treasury"]


def test_the_openapi_schema_says_approvers_is_a_list_of_names(server: ServerThread) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    approval = doc["paths"]["/v0/approvals/{approval_id}"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"]
    assert approval["properties"]["approvers"] == {"type": "array", "items": {"type": "string"}}
    assert "approvers" in approval["required"]


def _cancelled(events: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(next(e["payload"] for e in events if e["type"] == "execution.cancelled"))


def test_a_cancel_records_who_and_why_and_its_approval_reads_cancelled(
        with_bundle: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, a = _blocked(with_bundle, running, agent_client, "wire")
    r = httpx.post(f"{with_bundle.url}/v0/executions/{eid}/cancel", json={"rationale": "vendor not approved"},
                   headers={"Authorization": "Bearer boot-token"})
    assert r.status_code == 204, r.text
    events = _events(with_bundle, eid)
    assert _cancelled(events) == {"execution_id": eid, "status": "cancelled", "reason": "client_cancelled",
                                  "cancelled_by": "bootstrap", "credential": "bootstrap",
                                  "rationale": "vendor not approved"}
    got = httpx.get(f"{with_bundle.url}/v0/approvals/{a['id']}").json()
    assert got["status"] == "cancelled" and got["rationale"] == "execution_cancelled"
    assert got["decided_by"] == "bootstrap" and "decided_at" in got
    assert [x["id"] for x in httpx.get(f"{with_bundle.url}/v0/approvals", params={"status": "cancelled"}).json()] \
        == [a["id"]]
    types = [e["type"] for e in events]
    assert "approval.cancelled" in types and "approval.expired" not in types
    denied = next(e["payload"] for e in events if e["type"] == "step.denied")
    assert denied["error"] == {"reason": "execution_cancelled"} and denied["rule_id"] == "ask-anyone"
    # A grant after the cancel is refused: the approval is no longer pending.
    assert httpx.post(f"{with_bundle.url}/v0/approvals/{a['id']}/grant", json={}).status_code == 409


def test_a_cancel_by_a_named_key_is_credited_to_the_key(server: ServerThread, kernel: Kernel,
                                                        running: Running) -> None:
    made = httpx.post(f"{server.url}/v0/api-keys", json={"name": "oncall-ops", "scopes": ["executions:write"]},
                      headers={"Authorization": "Bearer boot-token"})
    assert made.status_code == 201, made.text
    eid, _, _ = running.start()
    r = httpx.post(f"{server.url}/v0/executions/{eid}/cancel",
                   headers={"Authorization": f"Bearer {made.json()['token']}"})
    assert r.status_code == 204, r.text
    got = _cancelled(_events(server, eid))
    assert (got["cancelled_by"], got["credential"]) == ("oncall-ops", "key") and "rationale" not in got


@pytest.mark.parametrize("body", [None, b"", b"null", b"{}"], ids=["no-body", "empty", "null", "empty-object"])
def test_a_cancel_without_a_rationale_is_accepted_as_the_sdk_sends_it(server: ServerThread, running: Running,
                                                                      body: bytes | None) -> None:
    eid, _, _ = running.start()
    r = httpx.post(f"{server.url}/v0/executions/{eid}/cancel", content=body)
    assert r.status_code == 204, r.text
    got = _cancelled(_events(server, eid))
    assert got["cancelled_by"] == "bootstrap" and got["credential"] == "dev" and "rationale" not in got


@pytest.mark.parametrize("body", [{"why": "x"}, {"rationale": 5}, {"rationale": "x" * 2001}],
                         ids=["unknown-field", "not-text", "too-long"])
def test_a_bad_cancel_body_is_400_and_cancels_nothing(server: ServerThread, running: Running,
                                                      body: dict[str, Any]) -> None:
    eid, _, _ = running.start()
    r = httpx.post(f"{server.url}/v0/executions/{eid}/cancel", json=body)
    assert r.status_code == 400 and r.json()["code"] == "validation_error", r.text
    assert httpx.get(f"{server.url}/v0/executions/{eid}").json()["status"] == "running"


def test_the_official_sdk_cancels_with_its_bodiless_call(server: ServerThread, running: Running) -> None:
    import asyncio

    from rebuno import Client

    eid, _, _ = running.start()

    async def cancel() -> None:
        async with Client(base_url=server.url) as c:
            await c.cancel(eid)

    asyncio.run(cancel())
    assert _cancelled(_events(server, eid))["reason"] == "client_cancelled"
