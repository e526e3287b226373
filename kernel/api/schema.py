"""The OpenAPI description of what the routes read and answer.

The routes parse their own bodies and query strings (`kernel/api/body.py`: the signature covers
the raw bytes, submit keeps number lexemes), so FastAPI sees no body parameter. Each route names
its body, query and answers here as `openapi_extra`, built once at import: nothing in this module
runs per request.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from kernel.domain import Answer

TEXT = {"type": "string"}
TIME = {"type": "string", "format": "date-time"}
ANY: dict[str, Any] = {}
ID = {"type": "string", "format": "uuid"}


def _object(required: tuple[str, ...], **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": props}


ERROR = _object(("code", "message"), code=TEXT, message=TEXT, details={"type": "object"})
EXECUTION = _object(
    ("id", "agent_id", "status", "created_at", "updated_at"),
    id=ID, agent_id=TEXT, input=ANY, output=ANY, failure_reason=TEXT, deadline_at=TIME,
    idempotency_key=TEXT, created_at=TIME, updated_at=TIME, restoration={"type": "object"},
    status={"type": "string", "enum": ["pending", "running", "blocked", "completed", "failed", "cancelled"]},
    # sessions, the sub-agent tree and forks (docs/api.md, "Sessions and sub-agents", "Forks")
    session=TEXT, previous_execution_id=ID, parent_execution_id=ID,
    spawned_by=_object(("execution_id", "step_id"), execution_id=ID, step_id=TEXT),
    children={"type": "array", "items": ID}, suspended={"type": "boolean"}, forked_from=ID,
    fork_seq={"type": "integer"},
)
PREVIOUS = _object(("state",), state=ANY, execution_id=ID)
SUSPENDED = _object(("suspended",), suspended={"type": "boolean"})
FORK_POINT = _object(("event_seq", "steps", "covered"), event_seq={"type": "integer"}, steps={"type": "integer"},
                     covered={"type": "boolean"}, resources={"type": "object",
                                                              "additionalProperties": {"type": "boolean"}},
                     type=TEXT, step_id=TEXT, target=TEXT, occurred_at=TIME)
STEP = _object(
    ("step_id", "execution_id", "kind", "target", "args_hash", "occurrence", "status", "idempotency"),
    step_id=TEXT, execution_id=ID, kind=TEXT, target=TEXT, args_hash=TEXT,
    occurrence={"type": "integer"}, status=TEXT, idempotency=TEXT, args=ANY, result=ANY, error=ANY,
    started_at=TIME, completed_at=TIME, usage_input={"type": "integer"}, usage_output={"type": "integer"},
)
DECISION = _object(
    ("decision",),
    decision={"type": "string", "enum": [a.value for a in (
        Answer.PROCEED, Answer.REPLAY, Answer.DENIED, Answer.RATE_LIMITED, Answer.BLOCKED,
        Answer.EXECUTION_BLOCKED, Answer.EXECUTION_TERMINAL)]},
    step_id=TEXT, result=ANY, error=ANY, approval_id=TEXT, reason=TEXT, rule_id=TEXT,
    resources={"type": "array", "items": _object(("key", "generation", "due"), key=TEXT,
                                                 generation={"type": "integer"}, due={"type": "boolean"})},
)
# What complete and fail answer: "recorded", or the first outcome again ("replay"), or the
# execution ended meanwhile ("execution_terminal"). The submit answer's enum lacked "recorded".
OUTCOME = _object(
    ("decision",),
    decision={"type": "string", "enum": [a.value for a in (Answer.RECORDED, Answer.REPLAY, Answer.EXECUTION_TERMINAL)]},
    result=ANY, error=ANY,
)
NULLABLE_TEXT = {"type": ["string", "null"]}
DECISION_RECORD = _object(
    ("id", "agent_id", "execution_id", "kind", "target", "decision", "decided_at"),
    id=TEXT, agent_id=TEXT, execution_id=ID, step_id=NULLABLE_TEXT, kind=TEXT, target=TEXT,
    decision={"type": "string", "enum": ["allowed", "denied", "awaiting_approval", "rate_limited",
                                         "approval_granted", "approval_denied", "approval_expired"]},
    rule_id=NULLABLE_TEXT, decided_at=TIME, reason=TEXT, policy_kind=TEXT, policy_revision=TEXT,
    policy_hash=TEXT, decided_by=TEXT, credential=TEXT, event_seq={"type": "integer"}, judge={"type": "object"},
)
DECISION_PAGE = _object(("decisions",), decisions={"type": "array", "items": DECISION_RECORD}, next_cursor=TEXT)
POLICY_EVENT = _object(("id", "agent_id", "type", "occurred_at"), id=ANY, agent_id=TEXT, type=TEXT,
                       seq={"type": "integer"}, shadow_id={"type": "integer"}, actor=TEXT, credential=TEXT,
                       payload=ANY, occurred_at=TIME)
SHADOW_REPORT = _object(("shadow", "samples"), shadow={"type": "object"}, samples={"type": "array"},
                        top_targets={"type": "array"}, top_active_rules={"type": "array"},
                        top_shadow_rules={"type": "array"})
API_KEY = _object(("id", "name", "scopes", "created_at"), id=ID, name=TEXT, scopes={"type": "array", "items": TEXT},
                  created_at=TIME, created_by=TEXT, expires_at=TIME, last_used_at=TIME, revoked_at=TIME, token=TEXT)
EVENT = _object(("execution_id", "event_seq", "type", "payload", "occurred_at"),
                execution_id=ID, event_seq={"type": "integer"}, type=TEXT, payload=ANY, occurred_at=TIME)
APPROVAL = _object(("id", "step_id", "execution_id", "status", "approvers"),
                   id=ID, step_id=TEXT, execution_id=ID, status=TEXT, approvers={"type": "array", "items": TEXT},
                   message=TEXT, decided_by=TEXT, asserted_by=TEXT, rationale=TEXT,
                   timeout_at=TIME, created_at=TIME, decided_at=TIME)
AGENT = _object(("id", "webhook_url", "registered_at"), id=TEXT, webhook_url=TEXT, registered_at=TIME,
                policy_bundle=TEXT, lease_timeout_seconds={"type": "integer"}, description=TEXT,
                input_schema=ANY, output_schema=ANY)
POLICY = _object(("agent_id", "seq", "kind", "revision", "active", "created_at"),
                 agent_id=TEXT, seq={"type": "integer"}, kind=TEXT, revision=TEXT,
                 active={"type": "boolean"}, created_at=TIME, bundle=ANY, policy_hash=TEXT, created_by=TEXT,
                 created_credential=TEXT, activated_at=TIME, activated_by=TEXT, activated_credential=TEXT,
                 activated_via=TEXT)
TEST_REPORT = _object(("results", "failed"), results={"type": "array"}, failed={"type": "integer"})
STATUS = _object(("status",), status=TEXT)
EXECUTION_PAGE = _object(("executions",), executions={"type": "array", "items": EXECUTION}, next_cursor=ID)
RESOURCE = _object(("key", "generation", "covered", "every_steps", "on_completion"), key=TEXT,
                   generation={"type": "integer"}, binding=ANY, checkpoint_ref=TEXT, covered={"type": "boolean"},
                   every_steps={"type": "integer"}, on_completion={"type": "boolean"})
SSE = {"responses": {"200": {"description": "Server-Sent Events (docs/stream.md)",
                             "content": {"text/event-stream": {"schema": TEXT}}},
                     "4XX": {"description": "the error envelope", "content": {"application/json": {"schema": ERROR}}}}}


def array(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


_COMPONENTS: dict[str, Any] = {}  # the nested body models `operation` met, by name


def operation(
    body: type[BaseModel] | None = None,
    *,
    body_required: bool = True,
    ok: int | tuple[int, ...] = 200,
    answer: dict[str, Any] | None = None,
    query: dict[str, dict[str, Any]] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`openapi_extra` for one route: its JSON body (from the pydantic model it parses), its query
    parameters, its success answer (`answer` = the body's schema, None = no body) and the error
    envelope on every 4xx/5xx."""
    success = {str(code): {"description": "OK", **(_json(answer) if answer is not None else {})}
               for code in (ok if isinstance(ok, tuple) else (ok,))}
    out: dict[str, Any] = {"responses": {
        **success,
        "4XX": {"description": "the error envelope", **_json(ERROR)},
        "5XX": {"description": "the error envelope", **_json(ERROR)},
    }}
    if body is not None:
        # Nested models are referenced from the document's components (a "#/$defs/…" reference
        # would not resolve inside an OpenAPI document, and a fuzzer would skip those parts).
        schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
        _COMPONENTS.update(schema.pop("$defs", {}))
        for name, extra in (overrides or {}).items():
            schema["properties"][name] = {**schema["properties"][name], **extra}
        out["requestBody"] = {"required": body_required, **_json(schema)}
    if query:
        out["parameters"] = [{"name": n, "in": "query", "required": False, "schema": s}
                             for n, s in query.items()]
    return out


_UUID_PARAMS = frozenset({"execution_id", "approval_id", "key_id"})
# Path parameters whose form the route checks (a 400 otherwise), said in the document.
_PATTERNED_PARAMS = {"policy_hash": "^[0-9a-fA-F]{64}$", "step_id": "^[0-9a-fA-F]{1,64}$"}


def install(app: FastAPI) -> None:
    """Post-process the generated document once (the console's pages leave themselves out of it):
    the API's routes answer 400 (not FastAPI's 422) for a bad parameter; ids that are UUIDs say so;
    how each caller authenticates."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        for item in doc["paths"].values():
            for op in item.values():
                answers = op.setdefault("responses", {})
                answers.pop("422", None)
                for family in ("4XX", "5XX"):  # a route without its own description still answers the envelope
                    answers.setdefault(family, {"description": "the error envelope", **_json(ERROR)})
                if "204" in answers and answers.get("200", {}).get("description") == "Successful Response":
                    del answers["200"]  # FastAPI's default: these routes answer 204 and no body
                for param in op.get("parameters", []):
                    if param["in"] == "path" and param["name"] in _UUID_PARAMS:
                        param["schema"] = {**param["schema"], "format": "uuid"}
                    elif param["in"] == "path" and param["name"] in _PATTERNED_PARAMS:
                        param["schema"] = {**param["schema"], "pattern": _PATTERNED_PARAMS[param["name"]]}
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        schemas.update(_COMPONENTS)
        if not schemas:
            doc.get("components", {}).pop("schemas", None)
        doc.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "agentSignature": {"type": "apiKey", "in": "header", "name": "Rebuno-Signature",
                               "description": "the v1 request signature (docs/api.md, Authentication); an "
                                              "optional signed Rebuno-Nonce makes every repeat of a mutation "
                                              "a 401 (docs/api.md, Replayed requests)"},
        }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
