"""The served OpenAPI document describes the bodies the routes parse themselves, so a client (or a
fuzzer) built from it sends what the routes read."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import ServerThread

BODIES = {
    ("post", "/v0/executions/{execution_id}/steps"): {"kind", "target", "args", "idempotency", "resources"},
    ("post", "/v0/executions/{execution_id}/steps/{step_id}/complete"): {"result", "captures", "capture_failures"},
    ("post", "/v0/executions/{execution_id}/steps/{step_id}/fail"): {"error", "captures", "capture_failures"},
    ("post", "/v0/executions/{execution_id}/resources"): {"key", "driver_id", "configuration", "coverage_reuse",
                                                          "every_steps", "on_completion"},
    ("post", "/v0/executions/{execution_id}/resources/{key}/binding"): {"binding"},
    ("post", "/v0/executions/{execution_id}/resources/checkpoints"): {"captures", "capture_failures"},
    ("post", "/v0/executions/{execution_id}/complete"): {"output", "state"},
    ("post", "/v0/executions/{execution_id}/fork"): {"at_seq", "session", "policy_bundle"},
    ("post", "/v0/executions/{execution_id}/fail"): {"error"},
    ("put", "/v0/agents/{agent_id}/metadata"): {"description", "input_schema", "output_schema"},
    ("post", "/v0/executions/{execution_id}/steps/{step_id}/stream"): {"seq", "data"},
    ("post", "/v0/executions"): {"agent_id", "input", "idempotency_key", "session", "parent_execution_id",
                                 "spawned_by"},
    ("post", "/v0/approvals/{approval_id}/grant"): {"decided_by", "rationale"},
    ("post", "/v0/agents"): {"id", "webhook_url", "secret", "lease_timeout_seconds"},
    ("post", "/v0/policies/{agent_id}"): {"bundle", "kind"},
    ("post", "/v0/policies/{agent_id}/test"): {"bundle", "kind", "cases", "execution_id", "executions"},
}


@pytest.fixture
def doc(server: ServerThread) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


@pytest.mark.parametrize(("method", "path"), list(BODIES), ids=[f"{m} {p}" for m, p in BODIES])
def test_document_describes_the_request_body(doc: dict[str, Any], method: str, path: str) -> None:
    schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    assert BODIES[(method, path)] <= set(schema["properties"])
    assert schema["additionalProperties"] is False  # bodies are strict


def test_submit_body_offers_the_step_kinds(doc: dict[str, Any]) -> None:
    props = doc["paths"]["/v0/executions/{execution_id}/steps"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert set(props["kind"]["enum"]) == {"tool_call", "llm_call", "local"}


def test_every_operation_documents_the_error_envelope_and_never_422(doc: dict[str, Any]) -> None:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            answers = op["responses"]
            assert "422" not in answers, (method, path)
            envelope = answers["4XX"]["content"]["application/json"]["schema"]
            assert envelope["required"] == ["code", "message"], (method, path)


def test_list_routes_document_their_query_parameters(doc: dict[str, Any]) -> None:
    names = {p["name"] for p in doc["paths"]["/v0/executions"]["get"]["parameters"]}
    assert {"agent_id", "status", "session", "parent", "cursor", "limit"} <= names
    events = {p["name"] for p in doc["paths"]["/v0/executions/{execution_id}/events"]["get"]["parameters"]}
    assert {"after_seq", "limit"} <= events


def test_success_answers_are_described(doc: dict[str, Any]) -> None:
    create = doc["paths"]["/v0/executions"]["post"]["responses"]
    assert {"201", "200"} <= set(create)
    assert "status" in create["201"]["content"]["application/json"]["schema"]["properties"]
    heartbeat = doc["paths"]["/v0/executions/{execution_id}/heartbeat"]["post"]["responses"]
    assert "204" in heartbeat and "200" not in heartbeat


def test_the_session_sub_agent_and_fork_answers_are_described(doc: dict[str, Any]) -> None:
    def answer(method: str, path: str) -> dict[str, Any]:
        return dict(doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"])

    execution = answer("get", "/v0/executions/{execution_id}")["properties"]
    assert {"session", "previous_execution_id", "parent_execution_id", "spawned_by", "children", "suspended",
            "forked_from", "fork_seq", "restoration"} <= set(execution)
    assert answer("post", "/v0/executions/{execution_id}/suspend")["required"] == ["suspended"]
    assert answer("get", "/v0/executions/{execution_id}/previous")["required"] == ["state"]
    point = answer("get", "/v0/executions/{execution_id}/fork-points")["items"]
    assert {"event_seq", "steps", "covered", "resources"} <= set(point["properties"])


def test_every_reference_resolves_inside_the_document(doc: dict[str, Any]) -> None:
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc["paths"])
    assert refs, "the nested body models (spawned_by, captures, …) are referenced"
    schemas = doc["components"]["schemas"]
    for ref in refs:
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    assert {"SpawnedBy", "CaptureBody", "CaptureFailureBody", "BacktestScope"} <= set(schemas)


# Issue 30: a client generated from the document could not filter decisions, read a shadow report
# by id or page policy events (their query parameters were missing), and the complete/fail answer
# ("recorded") was outside the documented enum.
QUERIES = {
    "/v0/decisions": {"agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id", "judged", "since",
                      "until", "cursor", "limit"},
    "/v0/policies/{agent_id}/shadow/report": {"shadow_id", "samples", "top"},
    "/v0/policies/{agent_id}/events": {"limit"},
}


@pytest.mark.parametrize("path", list(QUERIES))
def test_the_audit_and_shadow_reads_document_their_query_parameters_and_answers(doc: dict[str, Any],
                                                                                path: str) -> None:
    op = doc["paths"][path]["get"]
    assert QUERIES[path] <= {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
    assert "schema" in op["responses"]["200"]["content"]["application/json"]


def test_recording_an_outcome_answers_a_documented_decision(doc: dict[str, Any]) -> None:
    for verb in ("complete", "fail"):
        answer = doc["paths"][f"/v0/executions/{{execution_id}}/steps/{{step_id}}/{verb}"]["post"]["responses"]["200"]
        assert "recorded" in answer["content"]["application/json"]["schema"]["properties"]["decision"]["enum"]


def _body(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return dict(doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["properties"])


def test_bodies_document_the_bounds_the_kernel_checks(doc: dict[str, Any]) -> None:
    agent = _body(doc, "post", "/v0/agents")
    assert agent["id"]["maxLength"] == 200 and agent["id"]["pattern"].startswith("^[A-Za-z0-9]")
    assert agent["secret"]["maxLength"] == 1024 and agent["webhook_url"]["pattern"].startswith("^[hH][tT]")
    key = _body(doc, "post", "/v0/api-keys")
    assert key["name"]["maxLength"] == 200 and key["scopes"]["maxItems"] == 64 and key["scopes"]["items"]["enum"]
    seq = _body(doc, "post", "/v0/executions/{execution_id}/steps/{step_id}/stream")["seq"]
    assert (seq["minimum"], seq["maximum"]) == (0, 2**63 - 1)
    grant = _body(doc, "post", "/v0/approvals/{approval_id}/grant")
    assert grant["rationale"]["anyOf"][0]["maxLength"] == 10_000
    # A list the kernel also takes as null stays nullable (the submit body's `resources`).
    resources = _body(doc, "post", "/v0/executions/{execution_id}/steps")["resources"]
    assert {"type": "null"} in resources["anyOf"]


def test_generated_decision_queries_are_answered_and_match_the_document(server: ServerThread,
                                                                        doc: dict[str, Any]) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    op = schemathesis.openapi.from_dict(doc)["/v0/decisions"]["GET"]
    refused: list[str] = []

    @given(op.as_strategy())
    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def ask(case: Any) -> None:
        query = {k: v for k, v in (case.query or {}).items() if k != "cursor"}  # an opaque token
        r = httpx.get(f"{server.url}/v0/decisions", params=query, headers={"Authorization": "Bearer boot-token"})
        if r.status_code != 200:
            refused.append(f"{query} → {r.status_code} {r.text[:160]}")
            return
        case.query = query
        op.validate_response(r)

    ask()
    assert refused == []
