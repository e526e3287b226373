"""The MCP tool pin routes over real HTTP (docs/api.md, "MCP tool pins"): a report is the agent's
signed request for its own tools; listing and approving need `policies:write`; hostile bodies are
400s and the approval names who approved it."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import Running
from tests.support import AgentClient, ServerThread

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
