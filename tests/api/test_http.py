"""The v0 API over real HTTP on loopback: auth, strict bodies, the error envelope, resources."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import Running
from tests.support import AgentClient, ServerThread


def test_submit_over_http_proceeds_then_replays(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start({"q": 1})
    agent_client.lease(did, att)
    r = agent_client.submit(eid, "send_email", {"to": "ops@example.com"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.json()["decision"] == "proceed"
    sid = r.json()["step_id"]
    assert agent_client.complete_step(eid, sid, {"sent": True}).json() == {"decision": "recorded"}
    again = agent_client.complete_step(eid, sid, {"sent": False}).json()
    assert again == {"decision": "replay", "result": {"sent": True}}


def test_number_lexemes_in_args_change_the_step_id(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    body = b'{"kind":"tool_call","target":"t","args":{"n":1.0}}'
    one = agent_client.request("POST", f"/v0/executions/{eid}/steps", raw=body).json()["step_id"]
    body2 = b'{"kind":"tool_call","target":"t","args":{"n":1}}'
    two = agent_client.request("POST", f"/v0/executions/{eid}/steps", raw=body2).json()["step_id"]
    assert one != two
    step = httpx.get(f"{server.url}/v0/executions/{eid}/steps/{one}").json()
    assert step["args_hash"] == "3b6b06ecd1c968c8e738e0f11c4bb361fca80a9a694de22fe66a05286afbd081"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"kind":"tool_call","target":"t","nope":1}', "unknown key"),
        (b'{"kind":"tool_call","target":5}', "wrong type"),
        (b"", "empty body"),
        (b"[1]", "not an object"),
        (b'{"kind":"tool_call",', "malformed"),
        (b'{"kind":"teleport","target":"t"}', "unknown kind"),
    ],
    ids=["unknown-key", "wrong-type", "empty", "array", "malformed", "unknown-kind"],
)
def test_bad_submit_bodies_are_400_validation_error(server: ServerThread, running: Running,
                                                    agent_client: AgentClient, body: bytes, why: str) -> None:
    eid, did, att = running.start()
    r = agent_client.lease(did, att).request("POST", f"/v0/executions/{eid}/steps", raw=body)
    assert r.status_code == 400, why
    assert r.json()["code"] == "validation_error" and r.json()["message"]


def test_sdk_resources_field_is_accepted(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    r = agent_client.lease(did, att).submit(eid, "t", {})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("did", "att"),
    [("", "1"), ("not-a-uuid", "1"), (None, "0"), (None, "x")],
    ids=["missing-id", "bad-id", "zero-attempt", "bad-attempt"],
)
def test_bad_dispatch_headers_are_400(server: ServerThread, running: Running, agent_client: AgentClient,
                                      did: str | None, att: str) -> None:
    eid, real, _ = running.start()
    agent_client.lease(real if did is None else did, att)
    r = agent_client.submit(eid, "t")
    assert r.status_code == 400 and r.json()["code"] == "validation_error"


def test_unknown_dispatch_is_409_lease_superseded(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, _did, att = running.start()
    r = agent_client.lease("01920000-0000-7000-8000-000000000001", att).submit(eid, "t")
    assert r.status_code == 409 and r.json()["code"] == "lease_superseded"


def test_wrong_signature_is_401(server: ServerThread, running: Running) -> None:
    eid, did, att = running.start()
    c = AgentClient(server.url, running.agent_id, "wrong-secret").lease(did, att)
    r = c.submit(eid, "t")
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"


# A few seconds past the 300 s edge: the client stamps before the server reads its clock.
@pytest.mark.parametrize("skew", [-305, 305], ids=["stale", "future"])
def test_signature_outside_the_window_is_401(server: ServerThread, running: Running, agent_client: AgentClient,
                                             skew: int) -> None:
    eid, did, att = running.start()
    r = agent_client.lease(did, att).request(
        "POST", f"/v0/executions/{eid}/steps", {"kind": "tool_call", "target": "t"}, ts=int(time.time()) + skew
    )
    assert r.status_code == 401


def test_unknown_agent_is_401_not_404(server: ServerThread, running: Running) -> None:
    eid, did, att = running.start()
    r = AgentClient(server.url, "ghost", "x").lease(did, att).submit(eid, "t")
    assert r.status_code == 401


def test_other_agent_is_403_on_every_agent_route(server: ServerThread, running: Running) -> None:
    eid, did, att = running.start()
    Running(running.kernel, "other", "other-secret")
    c = AgentClient(server.url, "other", "other-secret").lease(did, att)
    assert c.submit(eid, "t").status_code == 403
    assert c.request("GET", f"/v0/executions/{eid}").status_code == 403
    assert c.request("POST", f"/v0/executions/{eid}/heartbeat").status_code == 403
    assert c.request("POST", f"/v0/executions/{eid}/complete", {"output": 1}).status_code == 403


def test_client_key_never_satisfies_an_agent_route(server: ServerThread, running: Running) -> None:
    eid, did, att = running.start()
    r = httpx.post(f"{server.url}/v0/executions/{eid}/steps", json={"kind": "tool_call", "target": "t"},
                   headers={"Authorization": "Bearer boot-token", "Rebuno-Dispatch-Id": did,
                            "Rebuno-Dispatch-Attempt": str(att)})
    assert r.status_code == 401


def test_body_over_limit_is_401_on_agent_routes(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    big = b'{"kind":"tool_call","target":"t","args":"' + b"x" * (10 * 1024 * 1024) + b'"}'
    r = agent_client.lease(did, att).request("POST", f"/v0/executions/{eid}/steps", raw=big)
    assert r.status_code == 401


def test_bad_execution_id_is_400(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    r = agent_client.lease("01920000-0000-7000-8000-000000000001", 1).submit("not-a-uuid", "t")
    assert r.status_code == 400 and r.json()["code"] == "validation_error"


def test_create_execution_is_idempotent_by_key(server: ServerThread, running: Running) -> None:
    body = {"agent_id": running.agent_id, "input": {"x": 1}, "idempotency_key": "order-42"}
    first = httpx.post(f"{server.url}/v0/executions", json=body)
    second = httpx.post(f"{server.url}/v0/executions", json=body)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert first.json()["status"] == "running"
    events = httpx.get(f"{server.url}/v0/executions/{first.json()['id']}/events").json()
    assert [e["type"] for e in events] == ["execution.created", "execution.started", "dispatch.queued"]
    assert [e["event_seq"] for e in events] == [1, 2, 3]


def test_create_for_unknown_agent_is_404(server: ServerThread) -> None:
    r = httpx.post(f"{server.url}/v0/executions", json={"agent_id": "nobody"})
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_list_executions_pages_newest_first(server: ServerThread, running: Running) -> None:
    ids = [httpx.post(f"{server.url}/v0/executions", json={"agent_id": "shell"}).json()["id"] for _ in range(5)]
    page = httpx.get(f"{server.url}/v0/executions", params={"limit": 2, "agent_id": "shell"}).json()
    assert [e["id"] for e in page["executions"]] == ids[::-1][:2]
    rest = httpx.get(f"{server.url}/v0/executions", params={"limit": 10, "cursor": page["next_cursor"]}).json()
    assert [e["id"] for e in rest["executions"]] == ids[::-1][2:]
    assert "next_cursor" not in rest
    nope = httpx.get(f"{server.url}/v0/executions", params={"status": "nope"})
    assert nope.status_code == 200 and nope.json() == {"executions": []}  # rebuno-v0 §7.2
    assert httpx.get(f"{server.url}/v0/executions", params={"limit": "x"}).status_code == 400
    assert httpx.get(f"{server.url}/v0/executions", params={"cursor": "x"}).status_code == 400


def test_events_after_seq_and_limit(server: ServerThread, running: Running) -> None:
    eid, _, _ = running.start()
    got = httpx.get(f"{server.url}/v0/executions/{eid}/events", params={"after_seq": 1, "limit": 1}).json()
    assert [e["event_seq"] for e in got] == [2]
    assert httpx.get(f"{server.url}/v0/executions/{eid}/events", params={"after_seq": "junk"}).status_code == 200


def test_cancel_twice_is_409_execution_terminal(server: ServerThread, running: Running) -> None:
    eid, _, _ = running.start()
    assert httpx.post(f"{server.url}/v0/executions/{eid}/cancel").status_code == 204
    r = httpx.post(f"{server.url}/v0/executions/{eid}/cancel")
    assert r.status_code == 409 and r.json()["code"] == "execution_terminal"


def test_invalid_bearer_is_401_even_in_dev(server: ServerThread) -> None:
    r = httpx.get(f"{server.url}/v0/executions", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    ok = httpx.get(f"{server.url}/v0/executions", headers={"Authorization": "Bearer boot-token"})
    assert ok.status_code == 200


def test_agent_secret_is_never_returned(server: ServerThread, running: Running) -> None:
    body = httpx.get(f"{server.url}/v0/agents/{running.agent_id}").text
    assert running.secret not in body and "secret" not in body


def test_heartbeat_and_complete_execution(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    assert agent_client.request("POST", f"/v0/executions/{eid}/heartbeat").status_code == 204
    assert agent_client.request("POST", f"/v0/executions/{eid}/complete", {"output": {"a": 1}}).status_code == 204
    r = agent_client.request("POST", f"/v0/executions/{eid}/complete", {"output": 2})
    assert r.status_code == 409 and r.json()["code"] == "execution_terminal"
    # Signed a second later, as the SDK's next heartbeat would be.
    late = agent_client.request("POST", f"/v0/executions/{eid}/heartbeat", ts=int(time.time()) + 1)
    assert late.status_code == 409
    got = httpx.get(f"{server.url}/v0/executions/{eid}").json()
    assert (got["status"], got["output"]) == ("completed", {"a": 1})


def test_fail_execution_requires_a_string_error(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    assert agent_client.request("POST", f"/v0/executions/{eid}/fail", {"error": 5}).status_code == 400
    assert agent_client.request("POST", f"/v0/executions/{eid}/fail", {"error": "tool_error: x"}).status_code == 204
    assert httpx.get(f"{server.url}/v0/executions/{eid}").json()["failure_reason"] == "tool_error: x"


def test_suspend_without_live_children_does_not_suspend(
    server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    eid, did, att = running.start()
    r = agent_client.lease(did, att).request("POST", f"/v0/executions/{eid}/suspend", {})
    assert r.status_code == 200 and r.json() == {"suspended": False}
    assert "execution.suspended" not in [e["type"] for e in httpx.get(f"{server.url}/v0/executions/{eid}/events").json()]


def test_resource_routes_over_http_with_a_step_that_declares_the_resource(
    server: ServerThread, running: Running, agent_client: AgentClient,
) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    r = agent_client.request("POST", f"/v0/executions/{eid}/resources/checkpoints", {})
    assert r.status_code == 204  # nothing to record
    r = agent_client.request("POST", f"/v0/executions/{eid}/resources",
                             {"key": "box", "driver_id": "dir", "configuration": {"x": 1}, "every_steps": 1})
    assert r.status_code == 200 and r.json() == {"key": "box", "generation": 0, "binding": None, "checkpoint_ref": "",
                                                 "covered": False, "every_steps": 1, "on_completion": False}
    r = agent_client.request("POST", f"/v0/executions/{eid}/resources/nope/binding", {"binding": 1})
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    # Registration again as the same bytes (the SDK's on-completion check) is accepted; a binding
    # sent again as the same bytes is a replay, refused.
    stamp = int(time.time())
    again = {"key": "box", "driver_id": "dir", "configuration": {"x": 1}, "every_steps": 1}
    for _ in range(2):
        r = agent_client.request("POST", f"/v0/executions/{eid}/resources", again, ts=stamp)
        assert r.status_code == 200, r.text
    codes = [agent_client.request("POST", f"/v0/executions/{eid}/resources/box/binding", {"binding": {"p": 1}},
                                  ts=stamp).status_code for _ in range(2)]
    assert codes == [204, 401]
    r = agent_client.request("POST", f"/v0/executions/{eid}/resources", {"key": "box", "driver_id": "other"})
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps",
                             {"kind": "tool_call", "target": "t", "args": {}, "resources": ["box"]})
    assert r.status_code == 200 and r.json()["resources"] == [{"key": "box", "generation": 1, "due": True}]
    sid = r.json()["step_id"]
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps/{sid}/complete",
                             {"result": 1, "captures": [{"key": "box", "generation": 1, "checkpoint_ref": "c1"}]})
    assert r.status_code == 200, r.text
    [box] = httpx.get(f"{server.url}/v0/executions/{eid}/resources").json()
    assert (box["generation"], box["covered"], box["checkpoint_ref"]) == (1, True, "c1")
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps",
                             {"kind": "tool_call", "target": "u", "args": {}, "resources": ["missing"]})
    assert r.status_code == 400 and r.json()["code"] == "validation_error"


def test_health_and_ready(server: ServerThread) -> None:
    assert httpx.get(f"{server.url}/v0/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/v0/ready").json() == {"status": "ready"}


@pytest.mark.parametrize("raw", [b'{"result": NaN}', b'{"result": Infinity}', b'{"result": 1e400}'],
                         ids=["nan", "infinity", "overflow"])
def test_non_finite_numbers_are_400_not_500(server: ServerThread, running: Running, agent_client: AgentClient,
                                            raw: bytes) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "t").json()["step_id"]
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps/{sid}/complete", raw=raw)
    assert r.status_code == 400 and r.json()["code"] == "validation_error"


@pytest.mark.parametrize("path", ["/v0/agents/..%2F..%2Fetc%2Fpasswd", "/v0/executions/..%2F..%2Fagents", "/v0/nothing"],
                         ids=["agent-id-traversal", "execution-id-traversal", "unknown-route"])
def test_a_path_no_route_matches_is_404_in_the_envelope(server: ServerThread, path: str) -> None:
    r = httpx.get(server.url + path)
    assert r.status_code == 404
    assert r.json()["code"] == "not_found" and "message" in r.json()


def test_completing_a_failed_step_replays_its_error_without_a_result_key(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "fs.read", {"p": "/x"}).json()["step_id"]
    assert agent_client.fail_step(eid, sid, {"m": "boom"}).json() == {"decision": "recorded"}
    # rebuno-v0 §2.1: empty fields are omitted; the stored error, as the submit route's replay.
    assert agent_client.complete_step(eid, sid, {"late": True}).json() == {"decision": "replay", "error": {"m": "boom"}}
    assert agent_client.fail_step(eid, sid, {"m": "again"}).json() == {"decision": "replay", "error": {"m": "boom"}}


def test_failing_a_succeeded_step_replays_its_result(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "t", {}).json()["step_id"]
    assert agent_client.complete_step(eid, sid, {"ok": 1}).json() == {"decision": "recorded"}
    assert agent_client.fail_step(eid, sid, {"m": "late"}).json() == {"decision": "replay", "result": {"ok": 1}}
