"""Hostile input is a clear 400 or stored losslessly, never a 500 (issue 18 §0), the same on
SQLite and PostgreSQL, over real HTTP.

The rule (docs/api.md, "Text the kernel refuses"): identifiers and secrets (`agent_id`, `id`,
`idempotency_key`, `secret`, `webhook_url`, a step's `kind`/`target`/`idempotency`, path and
query parameters) must be valid Unicode without NUL, else 400. JSON values (`input`, `args`,
`result`, `error`, `output`, stream `data`, the execution's `error` string) keep lone surrogates
and NUL losslessly: what is read back is what was sent.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.conftest import Running
from tests.support import AgentClient, ServerThread

LONE = "\ud800"
JSON_HDR = {"Content-Type": "application/json"}


def _post(server: ServerThread, path: str, body: Any) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \ud800, as the SDK's own encoder does.
    return httpx.post(f"{server.url}{path}", content=json.dumps(body).encode(), headers=JSON_HDR)


def _is_400(r: httpx.Response) -> bool:
    return r.status_code == 400 and r.json()["code"] == "validation_error"


# -- identifiers: 400 --------------------------------------------------------------------------
AGENT = {"id": "x", "webhook_url": "http://127.0.0.1:1/w", "secret": "s"}


@pytest.mark.parametrize(("field", "value"), [
    ("id", LONE), ("id", "a\x00b"), ("secret", LONE), ("secret", "s\x00"), ("webhook_url", f"http://h/{LONE}"),
    ("webhook_url", "http://h/\x00"), ("id", "../x"), ("id", "a/b"), ("id", "")],
    ids=["id-surrogate", "id-nul", "secret-surrogate", "secret-nul", "url-surrogate", "url-nul", "id-dotdot",
         "id-slash", "id-empty"])
def test_bad_agent_registration_text_is_400(server: ServerThread, field: str, value: str) -> None:
    r = _post(server, "/v0/agents", {**AGENT, field: value})
    assert _is_400(r), r.text
    assert httpx.get(f"{server.url}/v0/agents").json() == []


@pytest.mark.parametrize(("field", "value"), [
    ("agent_id", LONE), ("agent_id", "sh\x00ell"), ("idempotency_key", LONE), ("idempotency_key", "k\x00")],
    ids=["agent-surrogate", "agent-nul", "key-surrogate", "key-nul"])
def test_bad_execution_identifiers_are_400(server: ServerThread, running: Running, field: str, value: str) -> None:
    r = _post(server, "/v0/executions", {"agent_id": running.agent_id, field: value})
    assert _is_400(r), r.text


@pytest.mark.parametrize("path", [
    "/v0/agents/hel%00lo", "/v0/executions?agent_id=%00", "/v0/executions?status=%00", "/v0/approvals?status=%00",
    "/v0/policies/a%00b", "/v0/policies/a%00b/revisions"],
    ids=["agent-path-nul", "agent-query-nul", "status-nul", "approval-status-nul", "policy-agent-nul",
         "revisions-agent-nul"])
def test_nul_in_path_and_query_is_400(server: ServerThread, path: str) -> None:
    r = httpx.get(f"{server.url}{path}")
    assert _is_400(r), r.text


def test_step_target_with_a_lone_surrogate_is_400(server: ServerThread, running: Running,
                                                   agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    for target in (LONE, "t\x00"):
        r = agent_client.lease(did, att).submit(eid, target, {})
        assert _is_400(r), r.text


def test_after_seq_beyond_int64_is_400(server: ServerThread, running: Running) -> None:
    eid, _, _ = running.start()
    for q in ("after_seq=9223372036854775808", "after_seq=" + "9" * 5000):
        r = httpx.get(f"{server.url}/v0/executions/{eid}/events?{q}")
        assert _is_400(r), (q, r.text)
    assert httpx.get(f"{server.url}/v0/executions/{eid}/events?after_seq=9223372036854775807").json() == []
    # A huge limit is capped (max 1000), as documented.
    assert len(httpx.get(f"{server.url}/v0/executions/{eid}/events?limit=9223372036854775808").json()) == 3


def test_a_superscript_digit_is_not_a_number_anywhere_a_number_is_read(server: ServerThread, running: Running,
                                                                        agent_client: AgentClient) -> None:
    """`str.isdigit()` passes "²", which `int()` refuses: each place that read a number that way
    answered 500 (found by a probe, 2026-12-05). Now every one reads plain ASCII digits only."""
    eid, did, att = running.start()
    # The lease's attempt header, on every agent call (signed as sent, so the signature holds).
    agent_client.lease(did, att).attempt = "²"
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps", {"kind": "tool_call", "target": "t", "args": {}},
                             headers={"Rebuno-Dispatch-Attempt": b"\xb2"})  # type: ignore[dict-item]
    assert _is_400(r) and "Dispatch-Attempt" in r.json()["message"], r.text
    # An unparsable after_seq falls back to 0, as Rebuno's does (rebuno-v0 §7.2).
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events?after_seq=%C2%B2")
    assert events.status_code == 200 and [e["event_seq"] for e in events.json()][:1] == [1], events.text
    # The shadow report's whole-number parameters: a 400 naming the parameter, never a 500.
    for q in ("samples=%C2%B2", "top=" + "9" * 5000, "shadow_id=%C2%B2"):
        r = httpx.get(f"{server.url}/v0/policies/{running.agent_id}/shadow/report?{q}")
        assert _is_400(r) and q.split("=")[0] in r.json()["message"], (q, r.text)


@pytest.mark.parametrize("where", ["input", "args"])
def test_integers_over_4300_digits_are_400(server: ServerThread, running: Running, agent_client: AgentClient,
                                           where: str) -> None:
    big = "1" + "0" * 4300
    if where == "input":
        r = httpx.post(f"{server.url}/v0/executions", headers=JSON_HDR,
                       content=b'{"agent_id":"shell","input":{"n":' + big.encode() + b"}}")
    else:
        eid, did, att = running.start()
        r = agent_client.lease(did, att).request(
            "POST", f"/v0/executions/{eid}/steps", raw=b'{"kind":"tool_call","target":"t","args":[' + big.encode() + b"]}")
    assert _is_400(r), r.text


# -- JSON values: kept losslessly ---------------------------------------------------------------
def test_input_with_lone_surrogate_and_nul_reads_back_as_sent(server: ServerThread, running: Running) -> None:
    value = {"path": "caf\udce9.txt", "raw": LONE, "nul": "a\x00b", "k\udc80": 1}
    r = _post(server, "/v0/executions", {"agent_id": running.agent_id, "input": value})
    assert r.status_code == 201, r.text
    assert r.json()["input"] == value
    assert httpx.get(f"{server.url}/v0/executions/{r.json()['id']}").json()["input"] == value


def test_agent_completes_a_step_whose_result_holds_a_lone_surrogate(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "fs.list", {"dir": LONE}).json()["step_id"]
    result = {"files": ["caf\udce9.txt", "a\x00"]}
    assert agent_client.complete_step(eid, sid, result).json() == {"decision": "recorded"}
    # Re-signed (a later timestamp): the same bytes again are refused as a replay (docs/api.md).
    again = agent_client.complete_step(eid, sid, result, ts=int(time.time()) + 1)
    assert again.json() == {"decision": "replay", "result": result}
    assert httpx.get(f"{server.url}/v0/executions/{eid}/steps/{sid}").json()["result"] == result
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events").json()
    assert events and all(e["execution_id"] == eid for e in events)


def test_agent_fails_a_step_and_the_execution_with_lone_surrogates(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "fs.read", {}).json()["step_id"]
    error = {"message": f"no such file: caf\udce9{LONE}\x00"}
    assert agent_client.fail_step(eid, sid, error).json() == {"decision": "recorded"}
    assert httpx.get(f"{server.url}/v0/executions/{eid}/steps/{sid}").json()["error"] == error
    # The execution's error is free text: NUL and lone surrogates become U+FFFD.
    r = agent_client.request("POST", f"/v0/executions/{eid}/fail", {"error": "OSError: caf\udce9 \x00"})
    assert r.status_code == 204, r.text
    e = httpx.get(f"{server.url}/v0/executions/{eid}").json()
    assert (e["status"], e["failure_reason"]) == ("failed", "OSError: caf\ufffd \ufffd")
    assert httpx.get(f"{server.url}/v0/executions/{eid}/events").status_code == 200


def test_agent_completes_the_execution_with_lone_surrogates_in_output(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    output = {"answer": LONE + "\x00"}
    r = agent_client.lease(did, att).request("POST", f"/v0/executions/{eid}/complete", {"output": output})
    assert r.status_code == 204, r.text
    assert httpx.get(f"{server.url}/v0/executions/{eid}").json()["output"] == output


def test_stream_data_with_a_lone_surrogate_is_accepted(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "llm", {}, kind="llm_call").json()["step_id"]
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": 1, "data": LONE + "\x00"})
    assert r.status_code == 204, r.text


@pytest.mark.parametrize("body", [
    b'{"agent_id":"shell","agent_id":"other"}', b'{"agent_id":"shell","input":{"a":1,"a":2}}'],
    ids=["top-level", "nested"])
def test_duplicate_keys_are_400(server: ServerThread, running: Running, body: bytes) -> None:
    r = httpx.post(f"{server.url}/v0/executions", content=body, headers=JSON_HDR)
    assert _is_400(r) and "duplicate key" in r.json()["message"], r.text


def test_duplicate_body_keys_on_submit_are_400_but_args_keep_the_identity_rule(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    path = f"/v0/executions/{eid}/steps"
    r = agent_client.request("POST", path, raw=b'{"kind":"tool_call","target":"t","target":"u"}')
    assert _is_400(r) and "duplicate key" in r.json()["message"], r.text
    # Inside args the step-identity contract defines duplicates: the last wins (rebuno-v0 §1.2).
    dup = agent_client.request("POST", path, raw=b'{"kind":"tool_call","target":"t","args":{"x":1,"x":2}}')
    one = agent_client.request("POST", path, raw=b'{"kind":"tool_call","target":"t","args":{"x":2}}')
    assert dup.status_code == one.status_code == 200
    step = httpx.get(f"{server.url}/v0/executions/{eid}/steps/{dup.json()['step_id']}").json()
    assert step["args"] == {"x": 2}


@pytest.mark.parametrize(("path", "empty"), [
    ("/v0/executions?status=bogus", {"executions": []}), ("/v0/executions?status=" + "x" * 5000, {"executions": []}),
    ("/v0/approvals?status=bogus", []), ("/v0/approvals?status=" + "x" * 5000, [])],
    ids=["executions", "executions-long", "approvals", "approvals-long"])
def test_an_unknown_status_filter_matches_nothing(server: ServerThread, running: Running, path: str,
                                                  empty: Any) -> None:
    running.start()  # one execution exists: the filter, not an empty store, makes the list empty
    r = httpx.get(f"{server.url}{path}")
    assert r.status_code == 200 and r.json() == empty, r.text


# -- sessions, forks and resources (issue 19's routes) -------------------------------------------
@pytest.mark.parametrize(("field", "value"), [
    ("every_steps", 2**31), ("every_steps", 2**70), ("every_steps", -1), ("key", ""), ("key", "k" * 201)],
    ids=["every-steps-int32", "every-steps-2^70", "every-steps-negative", "key-empty", "key-201"])
def test_out_of_range_resource_registration_is_400_and_registers_nothing(
        server: ServerThread, running: Running, agent_client: AgentClient, field: str, value: Any) -> None:
    eid, did, att = running.start()
    body = {"key": "sandbox", "driver_id": "d", "every_steps": 1, field: value}
    r = agent_client.lease(did, att).request("POST", f"/v0/executions/{eid}/resources", body)
    assert _is_400(r), r.text
    assert httpx.get(f"{server.url}/v0/executions/{eid}/resources").json() == []


REGO_ALLOW = "package regent\ndefault decision := {\"action\": \"allow\"}\n"


REGO_SURROGATES = {"data": {"modules": {"p.rego": REGO_ALLOW}, "data": {"x": LONE}},
                   "module": {"modules": {"p.rego": REGO_ALLOW + f"# {LONE}\n"}}}


@pytest.mark.parametrize("bundle", [
    "rules: []\n# \x00", f"rules: []\n# {LONE}",
    {"kind": "yaml", "bundle": f"rules: []\n# {LONE}"},
    {"kind": "rego", "bundle": REGO_SURROGATES["data"]},
    {"kind": "rego", "bundle": REGO_SURROGATES["module"]}],
    ids=["yaml-nul", "yaml-surrogate", "yaml-object-surrogate", "rego-data-surrogate", "rego-module-surrogate"])
def test_a_fork_bundle_holding_nul_or_a_lone_surrogate_is_400_and_forks_nothing(
        server: ServerThread, running: Running, bundle: Any) -> None:
    # (A NUL in Rego data is no problem: the stored JSON text escapes it, losslessly.)
    eid, _, _ = running.start()
    r = _post(server, f"/v0/executions/{eid}/fork", {"at_seq": 1, "policy_bundle": bundle})
    assert _is_400(r) and "bundle" in r.json()["message"], r.text
    assert len(httpx.get(f"{server.url}/v0/executions").json()["executions"]) == 1


@pytest.mark.parametrize("where", ["data", "module"])
def test_a_rego_bundle_holding_a_lone_surrogate_is_400_when_stored_or_tested(
        server: ServerThread, running: Running, where: str) -> None:
    bundle = {"kind": "rego", "bundle": REGO_SURROGATES[where]}
    for path in (f"/v0/policies/{running.agent_id}", f"/v0/policies/{running.agent_id}/test"):
        r = _post(server, path, bundle)
        assert _is_400(r) and "Unicode" in r.json()["message"], (path, r.text)


@pytest.mark.parametrize("session", ["s\x00", LONE, "s" * 201], ids=["nul", "surrogate", "201-chars"])
def test_a_bad_session_is_400_wherever_it_is_read(server: ServerThread, running: Running, session: str) -> None:
    eid, _, _ = running.start()
    for path, body in (("/v0/executions", {"agent_id": running.agent_id, "session": session}),
                       (f"/v0/executions/{eid}/fork", {"at_seq": 1, "session": session}),
                       (f"/v0/policies/{running.agent_id}/test", {"executions": {"session": session}})):
        r = _post(server, path, body)
        assert _is_400(r) and "session" in r.json()["message"], (path, r.text)
