"""`GET /v0/decisions` and the approval record's context over real HTTP (docs/audit.md)."""

from __future__ import annotations

from typing import Any

import httpx

from kernel.core.kernel import Kernel
from kernel.domain import ApprovalConfig, Decision, Verdict
from kernel.domain.approval import APPROVAL_ARGS_MAX_CHARS
from tests.conftest import Running
from tests.core.test_steps import FixedPolicy
from tests.support import AgentClient, ServerThread

BOOT = {"Authorization": "Bearer boot-token"}


def _get(server: ServerThread, path: str, **params: Any) -> Any:
    r = httpx.get(server.url + path, params=params, headers=BOOT, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_approval_carries_what_the_approver_decides_on(
    server: ServerThread, kernel: Kernel, running: Running, agent_client: AgentClient
) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "payments-over-limit", "amount over 1000",
                                         approval=ApprovalConfig(approvers=("treasury",), message="check it")))
    eid, did, att = running.start()
    r = agent_client.lease(did, att).submit(eid, "payments.send", {"amount": 1500.00, "to": "acme"})
    assert r.json()["decision"] == "blocked"
    [a] = _get(server, "/v0/approvals")
    assert a["agent_id"] == "shell" and a["execution_id"] == eid
    assert (a["kind"], a["target"], a["args"]) == ("tool_call", "payments.send", {"amount": 1500.00, "to": "acme"})
    assert (a["rule_id"], a["reason"], a["message"]) == ("payments-over-limit", "amount over 1000", "check it")
    assert a["requested_at"] == a["created_at"] and a["expires_at"] == a["timeout_at"]
    assert "args_truncated" not in a
    assert _get(server, f"/v0/approvals/{a['id']}") == a


def test_large_arguments_are_capped_with_a_marker(
    server: ServerThread, kernel: Kernel, running: Running, agent_client: AgentClient
) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask"))
    eid, did, att = running.start()
    blob = "x" * (APPROVAL_ARGS_MAX_CHARS + 100)
    agent_client.lease(did, att).submit(eid, "upload", {"blob": blob})
    [a] = _get(server, "/v0/approvals")
    assert a["args_truncated"] is True
    assert a["args_chars"] == len('{"blob":""}') + len(blob)
    assert isinstance(a["args"], str) and len(a["args"]) == APPROVAL_ARGS_MAX_CHARS
    assert a["args"].startswith('{"blob":"xxx')


def test_get_decisions_filters_and_pages(
    server: ServerThread, kernel: Kernel, running: Running, agent_client: AgentClient
) -> None:
    eid, did, att = running.start()
    c = agent_client.lease(did, att)
    for i in range(5):
        assert c.submit(eid, f"t{i}").json()["decision"] == "proceed"
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "no-rm", "never"))
    assert c.submit(eid, "rm").json()["decision"] == "denied"
    body = _get(server, "/v0/decisions", decision="denied")
    [d] = body["decisions"]
    assert (d["target"], d["rule_id"], d["reason"], d["execution_id"]) == ("rm", "no-rm", "never", eid)
    assert "next_cursor" not in body
    seen: list[str] = []
    page = _get(server, "/v0/decisions", limit=2, rule_id="permissive")
    seen += [x["target"] for x in page["decisions"]]
    while "next_cursor" in page:
        page = _get(server, "/v0/decisions", limit=2, rule_id="permissive", cursor=page["next_cursor"])
        seen += [x["target"] for x in page["decisions"]]
    assert seen == ["t4", "t3", "t2", "t1", "t0"]


def test_bad_decision_queries_are_400(server: ServerThread) -> None:
    for params in ({"limit": "0"}, {"cursor": "zzz"}, {"since": "yesterday"}, {"since": "2026-01-01T00:00:00"},
                   {"decision": "perhaps"}, {"judged": "yes"}):
        r = httpx.get(server.url + "/v0/decisions", params=params, headers=BOOT, timeout=10)
        assert r.status_code == 400, params
        assert r.json()["code"] == "validation_error"


# Found by a probe (2026-12-05): times and lifetimes past what UTC or a datetime holds were 500s.
EDGE_TIMES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"]  # no UTC equivalent


def test_a_decisions_time_range_past_what_utc_holds_is_400(server: ServerThread) -> None:
    for name in ("since", "until"):
        for t in EDGE_TIMES:
            r = httpx.get(server.url + "/v0/decisions", params={name: t}, headers=BOOT, timeout=10)
            assert r.status_code == 400 and "out of range" in r.json()["message"], (name, t, r.text)
    # the extremes that do exist in UTC are ordinary bounds
    page = _get(server, "/v0/decisions", since="0001-01-01T00:00:00Z", until="9999-12-31T23:59:59Z")
    assert page["decisions"] == []


def test_an_api_key_lifetime_past_year_9999_is_400(server: ServerThread) -> None:
    body: dict[str, Any] = {"name": "k", "scopes": ["executions:read"]}
    for extra in ({"expires_in": 1e15}, {"expires_in": "99999999999h"}, {"expires_in": "inf"},
                  {"expires_in": 2**70}, {"expires_at": EDGE_TIMES[1]}):
        r = httpx.post(server.url + "/v0/api-keys", json={**body, **extra}, headers=BOOT, timeout=10)
        assert r.status_code == 400 and r.json()["code"] == "validation_error", (extra, r.text)
    ok = httpx.post(server.url + "/v0/api-keys", json={**body, "expires_in": "720h"}, headers=BOOT, timeout=10)
    assert ok.status_code == 201 and ok.json()["expires_at"].endswith("Z")
    assert [k["name"] for k in _get(server, "/v0/api-keys")] == ["k"]  # the refused ones wrote nothing
