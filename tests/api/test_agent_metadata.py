"""What an agent publishes about itself (`PUT /v0/agents/{id}/metadata`, the SDK's start-up call)
is read back from `GET /v0/agents/{id}` (docs/api.md)."""

from __future__ import annotations

import httpx

from tests.conftest import Running
from tests.support import AgentClient, ServerThread

INPUT = {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}
OUTPUT = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def test_get_agent_returns_the_schemas_the_agent_published(server: ServerThread, running: Running,
                                                          agent_client: AgentClient) -> None:
    r = agent_client.request("PUT", "/v0/agents/shell/metadata",
                             {"description": "moves money", "input_schema": INPUT, "output_schema": OUTPUT})
    assert r.status_code == 204, r.text
    got = httpx.get(f"{server.url}/v0/agents/shell").json()
    assert got["description"] == "moves money"
    assert got["input_schema"] == INPUT and got["output_schema"] == OUTPUT
    assert "secret" not in got


def test_an_agent_that_published_no_schema_has_none(server: ServerThread, running: Running) -> None:
    got = httpx.get(f"{server.url}/v0/agents/shell").json()
    assert got["id"] == "shell" and "input_schema" not in got and "output_schema" not in got


def test_the_agents_list_stays_without_schemas(server: ServerThread, running: Running,
                                               agent_client: AgentClient) -> None:
    agent_client.request("PUT", "/v0/agents/shell/metadata", {"input_schema": INPUT})
    (row,) = httpx.get(f"{server.url}/v0/agents").json()
    assert row["id"] == "shell" and "input_schema" not in row
