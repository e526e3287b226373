"""The MCP tool pin routes over real HTTP (docs/api.md, "MCP tool pins"): a report is the agent's
signed request for its own tools; listing and approving need `policies:write`; hostile bodies are
400s and the approval names who approved it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread, sign

BOOT = {"Authorization": "Bearer boot-token"}


def tool(name: str = "fs_read_file", description: str = "Read a file's text.") -> dict[str, Any]:
    return {"tool": name, "upstream": "fs",
            "definition": {"name": name.removeprefix("fs_"), "description": description, "inputSchema": {}}}


def test_a_report_is_signed_by_the_agent_whose_tools_it_names(server: ServerThread, running: Running,
                                                              agent_client: AgentClient) -> None:
    unsigned = httpx.post(f"{server.url}/v0/mcp/{running.agent_id}/tools", json={"tools": [tool()]})
    assert unsigned.status_code == 401
    other = agent_client.request("POST", "/v0/mcp/someone-else/tools", {"tools": [tool()]}, lease=False)
    assert other.status_code == 403
    r = agent_client.request("POST", f"/v0/mcp/{running.agent_id}/tools", {"tools": [tool()]}, lease=False)
    assert r.status_code == 200, r.text
    [pin] = r.json()["tools"]
    assert (pin["tool"], pin["state"], len(pin["sha256"])) == ("fs_read_file", "new", 64)


def test_hostile_reports_are_400s(server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    path = f"/v0/mcp/{running.agent_id}/tools"
    for body in ({"tools": "x"}, {"tools": [tool("x" * 201)]}, {"tools": [tool("a\u202eb")]},
                 {"tools": [{"tool": "fs_a", "upstream": "fs", "definition": "text"}]},
                 {"tools": [tool(description="x" * 70_000)]}, {"tools": [], "extra": 1},
                 {"manifest_pins": {"fs_a": "not-a-hash"}}, {"tools": [tool()] * 1001}):
        r = agent_client.request("POST", path, body, lease=False)
        assert r.status_code == 400, (str(body)[:80], r.text)


def test_listing_and_approving_need_policies_write_and_name_the_approver(server: ServerThread, running: Running,
                                                                         agent_client: AgentClient) -> None:
    agent = running.agent_id
    agent_client.request("POST", f"/v0/mcp/{agent}/tools", {"tools": [tool()]}, lease=False)
    keys = {}
    for name, scopes in (("reader", ["executions:read"]), ("alice-ops", ["policies:write"])):
        r = httpx.post(f"{server.url}/v0/api-keys", json={"name": name, "scopes": scopes}, headers=BOOT)
        keys[name] = {"Authorization": f"Bearer {r.json()['token']}"}
    listed = httpx.get(f"{server.url}/v0/mcp/{agent}/tools?definitions=true", headers=keys["alice-ops"])
    [pin] = listed.json()["tools"]
    assert pin["definition"]["description"] == "Read a file's text." and pin["approved_definition"] is None
    assert httpx.get(f"{server.url}/v0/mcp/{agent}/tools", headers=keys["reader"]).status_code == 403
    body = {"tool": "fs_read_file", "sha256": pin["sha256"]}
    assert httpx.post(f"{server.url}/v0/mcp/{agent}/tools/approve", json=body,
                      headers=keys["reader"]).status_code == 403
    for bad in ({}, {"tool": "fs_read_file"}, {**body, "via": "console"}, {**body, "sha256": "ABC"}):
        r = httpx.post(f"{server.url}/v0/mcp/{agent}/tools/approve", json=bad, headers=keys["alice-ops"])
        assert r.status_code == 400, (bad, r.text)
    r = httpx.post(f"{server.url}/v0/mcp/{agent}/tools/approve", json=body, headers=keys["alice-ops"])
    assert r.status_code == 200 and r.json()["approved_by"] == "alice-ops", r.text
    [event] = [e for e in httpx.get(f"{server.url}/v0/policies/{agent}/events", headers=BOOT).json()
               if e["type"] == "mcp.tool_approved"]
    assert event["actor"] == "alice-ops" and event["payload"]["via"] == "api"
    assert httpx.get(f"{server.url}/v0/mcp/nobody/tools", headers=BOOT).status_code == 404


# -- the security matrix: who may report, list and approve an agent's tools ---------------------

@pytest.fixture(params=[True, False], ids=["dev", "serve"])
def dev(request: pytest.FixtureRequest) -> bool:
    """`regent dev` (a request without `Authorization` is an anonymous admin) or `regent serve`."""
    return bool(request.param)


@pytest.fixture
def pins_server(dev: bool, kernel: Kernel) -> Iterator[ServerThread]:
    with ServerThread(create_app(kernel, dev=dev, bearer_token="boot-token")) as srv:
        yield srv


@pytest.fixture
def reported(pins_server: ServerThread, running: Running) -> Iterator[dict[str, Any]]:
    """Agent A (`shell`) has reported one tool (a `new` pin); agent B (`other`) is registered."""
    Running(running.kernel, "other", "other-secret")
    with AgentClient(pins_server.url, running.agent_id, running.secret) as a:
        r = a.request("POST", f"/v0/mcp/{running.agent_id}/tools", {"tools": [tool()]}, lease=False)
    assert r.status_code == 200, r.text
    [pin] = r.json()["tools"]
    yield pin


def refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code and isinstance(body["message"], str) and body["message"], body


def signed_headers(agent_id: str, secret: str, method: str, path: str, data: bytes) -> dict[str, str]:
    ts = str(int(time.time()))
    return {"Rebuno-Agent-Id": agent_id, "Rebuno-Timestamp": ts, "Content-Type": "application/json",
            "Rebuno-Signature": sign(secret, method, path, ts, "", "", data)}


def pins_of(server: ServerThread, agent: str) -> dict[str, str]:
    r = httpx.get(f"{server.url}/v0/mcp/{agent}/tools", headers=BOOT)
    assert r.status_code == 200, r.text
    return {p["tool"]: p["state"] for p in r.json()["tools"]}


EVIL = json.dumps({"tools": [tool("fs_evil")]}).encode()


REPORTERS = [
    ("unsigned", 401, "unauthorized"),
    ("bad-signature", 401, "unauthorized"),
    ("body-not-signed", 401, "unauthorized"),
    ("unknown-agent", 401, "unauthorized"),
    ("bearer-token", 401, "unauthorized"),
    ("other-agent", 403, "forbidden"),
]


@pytest.mark.parametrize(("who", "status", "code"), REPORTERS, ids=[r[0] for r in REPORTERS])
def test_a_report_for_agent_a_is_refused_unless_a_signs_it(pins_server: ServerThread, running: Running,
                                                          reported: dict[str, Any], who: str, status: int,
                                                          code: str) -> None:
    path = f"/v0/mcp/{running.agent_id}/tools"
    headers = {
        "unsigned": {"Content-Type": "application/json"},
        "bad-signature": signed_headers(running.agent_id, "wrong-secret", "POST", path, EVIL),
        "body-not-signed": signed_headers(running.agent_id, running.secret, "POST", path, b'{"tools": []}'),
        "unknown-agent": signed_headers("ghost", "x", "POST", path, EVIL),
        "bearer-token": {**BOOT, "Content-Type": "application/json"},
        "other-agent": signed_headers("other", "other-secret", "POST", path, EVIL),
    }[who]
    refused(httpx.post(pins_server.url + path, content=EVIL, headers=headers), status, code)
    assert pins_of(pins_server, running.agent_id) == {"fs_read_file": "new"}


CALLERS = [
    ("bad-bearer", 401, "unauthorized"),
    ("agent-a-signature", 401, "unauthorized"),
    ("agent-b-signature", 401, "unauthorized"),
    ("key-without-policies-write", 403, "forbidden"),
]


def operator_headers(server: ServerThread, running: Running, who: str, method: str, path: str,
                     data: bytes) -> dict[str, str]:
    if who == "bad-bearer":
        return {"Authorization": "Bearer rbk_nope", "Content-Type": "application/json"}
    if who == "agent-a-signature":
        return signed_headers(running.agent_id, running.secret, method, path, data)
    if who == "agent-b-signature":
        return signed_headers("other", "other-secret", method, path, data)
    r = httpx.post(f"{server.url}/v0/api-keys", json={"name": "reader", "scopes": ["executions:read"]},
                   headers=BOOT)
    return {"Authorization": f"Bearer {r.json()['token']}", "Content-Type": "application/json"}


@pytest.mark.parametrize(("who", "status", "code"), CALLERS, ids=[c[0] for c in CALLERS])
def test_listing_agent_a_tools_needs_an_operator_with_policies_write(pins_server: ServerThread, running: Running,
                                                                     reported: dict[str, Any], who: str,
                                                                     status: int, code: str) -> None:
    path = f"/v0/mcp/{running.agent_id}/tools"
    headers = operator_headers(pins_server, running, who, "GET", path, b"")
    refused(httpx.get(pins_server.url + path, headers=headers), status, code)


@pytest.mark.parametrize(("who", "status", "code"), CALLERS, ids=[c[0] for c in CALLERS])
def test_approving_agent_a_tools_needs_an_operator_with_policies_write(pins_server: ServerThread, running: Running,
                                                                       reported: dict[str, Any], who: str,
                                                                       status: int, code: str) -> None:
    path = f"/v0/mcp/{running.agent_id}/tools/approve"
    data = json.dumps({"tool": "fs_read_file", "sha256": reported["sha256"]}).encode()
    headers = operator_headers(pins_server, running, who, "POST", path, data)
    refused(httpx.post(pins_server.url + path, content=data, headers=headers), status, code)
    assert pins_of(pins_server, running.agent_id) == {"fs_read_file": "new"}


def test_an_anonymous_operator_lists_and_approves_in_dev_only(pins_server: ServerThread, running: Running,
                                                             reported: dict[str, Any], dev: bool) -> None:
    path = f"/v0/mcp/{running.agent_id}/tools"
    listed = httpx.get(pins_server.url + path)
    approved = httpx.post(pins_server.url + path + "/approve",
                          json={"tool": "fs_read_file", "sha256": reported["sha256"]})
    if dev:
        assert listed.status_code == 200 and approved.status_code == 200, approved.text
        assert pins_of(pins_server, running.agent_id) == {"fs_read_file": "approved"}
    else:
        refused(listed, 401, "unauthorized")
        refused(approved, 401, "unauthorized")
        assert pins_of(pins_server, running.agent_id) == {"fs_read_file": "new"}
