"""Policy admin routes (bearer, `policies:write`): store, read, list and re-activate bundles; test a
candidate bundle against cases or a recorded execution (replay)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from kernel.api import schema
from kernel.api.body import Strict, parse_model
from kernel.api.deps import agent_param, auth_of, call, kernel_of, uuid_param
from kernel.api.render import JSONResponse
from kernel.api.routes.client import _body, check_session
from kernel.clock import parse_time, rfc3339
from kernel.core import policies, policy_test
from kernel.core.approvals import Principal
from kernel.core.policies import Actor, PolicyRevision
from kernel.core.policy_test import Candidate
from kernel.errors import Forbidden, invalid
from kernel.policy.backtest import result_json
from kernel.text import check_text

router = APIRouter()
# A revision seq is an INTEGER column (32-bit on PostgreSQL): a larger one is a 400, not a driver
# overflow (docs/api.md, "Bounds"; 2^63 - 1 here let 2^31 … 2^63 - 1 reach PostgreSQL, a 500).
# The core checks it too (the console's route reaches it without this one's Path bound).
_MAX_SEQ = policies.MAX_REVISION_SEQ


class StoreBody(Strict):
    # YAML: the bundle text. Rego: {"modules": {path: source}, "data": {...}, "manifest": {...}}.
    bundle: str | dict[str, Any] = ""
    kind: str = "yaml"


_TARBALL_TYPES = ("application/gzip", "application/x-gzip", "application/x-tar", "application/octet-stream")


_rego_content = policies.rego_content


def _json(r: PolicyRevision, with_content: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "agent_id": r.agent_id,
        "seq": r.seq,
        "kind": r.kind,
        "revision": r.revision,
        "policy_hash": r.content_hash,
        "active": r.active,
        "created_at": rfc3339(r.created_at),
    }
    # Who stored it and who last made it active, and when (the policy audit trail; docs/audit.md).
    if r.stored is not None:
        out["created_by"] = r.stored.by
        out["created_credential"] = r.stored.credential
    if r.activated is not None:
        out["activated_at"] = rfc3339(r.activated.at)
        out["activated_by"] = r.activated.by
        out["activated_credential"] = r.activated.credential
        out["activated_via"] = r.activated.via or r.activated.type.removeprefix("policy.")
    if with_content:
        out["bundle"] = json.loads(r.content) if r.kind == "rego" else r.content
    return out


async def bundle_of(request: Request) -> tuple[str, str]:
    """(kind, stored content) of a bundle upload: a JSON body {bundle, kind} or a Rego .tar.gz."""
    raw = await _body(request)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in _TARBALL_TYPES:
        from kernel.policy.rego import parse_rego_tarball

        return "rego", await call(lambda: _rego_content(parse_rego_tarball(raw, origin="upload")))
    body = parse_model(StoreBody, raw, allow_empty=True)
    if isinstance(body.bundle, dict):
        if body.kind != "rego":
            raise invalid('an object bundle needs "kind": "rego"')
        return body.kind, check_text(_rego_content(body.bundle), "bundle")
    if body.kind == "rego":
        raise invalid("a Rego bundle is an object {modules, data, manifest} or a .tar.gz upload")
    check_text(body.bundle, "bundle")
    return body.kind, body.bundle


def actor_of(request: Request, principal: Principal) -> Actor:
    """Who is acting, for the policy audit trail: the key's name and the credential."""
    return Actor(principal.name, principal.credential.value)


@router.post("/v0/policies/{agent_id}", openapi_extra=schema.operation(StoreBody, body_required=False, ok=204))
async def store_policy(agent_id: str, request: Request) -> Response:
    principal = await call(auth_of(request).principal, request, "policies:write")
    kind, content = await bundle_of(request)
    await call(policies.store_policy, kernel_of(request), agent_param(agent_id), kind, content,
               actor_of(request, principal))
    return Response(status_code=204)


@router.get("/v0/policies/{agent_id}", openapi_extra=schema.operation(answer=schema.POLICY))
async def get_policy(agent_id: str, request: Request) -> Response:
    await call(auth_of(request).principal, request, "policies:write")
    r = await call(policies.active_policy, kernel_of(request), agent_param(agent_id))
    return JSONResponse(_json(r))


async def _revision_reader(request: Request) -> Principal:
    """Stored revisions are read by who writes policy and by an auditor (`decisions:read`), who
    fetches the bundle behind a recorded `policy_hash` (docs/audit.md)."""
    principal = await call(auth_of(request).principal, request)
    if not (principal.has("policies:write") or principal.has("decisions:read")):
        raise Forbidden("forbidden: missing scope policies:write or decisions:read")
    return principal


@router.get("/v0/policies/{agent_id}/revisions", openapi_extra=schema.operation(answer=schema.array(schema.POLICY)))
async def list_revisions(agent_id: str, request: Request) -> Response:
    await _revision_reader(request)
    rows = await call(policies.list_revisions, kernel_of(request), agent_param(agent_id))
    return JSONResponse([_json(r, with_content=False) for r in rows])


@router.get("/v0/policies/{agent_id}/revisions/{policy_hash}")
async def get_revision(agent_id: str, policy_hash: str, request: Request) -> Response:
    """The bundle behind a recorded `policy_hash`, with its content (docs/audit.md)."""
    await _revision_reader(request)
    r = await call(policies.revision_by_hash, kernel_of(request), agent_id, policy_hash)
    return JSONResponse(_json(r))


@router.post("/v0/policies/{agent_id}/revisions/{seq}/activate", openapi_extra=schema.operation(ok=204))
async def activate(agent_id: str, request: Request, seq: int = Path(ge=1, le=_MAX_SEQ)) -> Response:
    principal = await call(auth_of(request).principal, request, "policies:write")
    await call(policies.activate_revision, kernel_of(request), agent_param(agent_id), seq,
               actor_of(request, principal))
    return Response(status_code=204)


class BacktestScope(Strict):
    session: str | None = None
    since: str | None = None  # RFC 3339: executions created at or after it
    limit: int = policy_test.BACKTEST_DEFAULT


class TestBody(Strict):
    bundle: str | dict[str, Any] | None = None
    kind: str = "yaml"
    cases: list[Any] | None = None
    execution_id: str | None = None
    executions: BacktestScope | None = None  # backtest: the agent's recorded executions, newest first


def _candidate(body: TestBody) -> Candidate | None:
    if body.bundle is None:
        return None
    if isinstance(body.bundle, dict):
        if body.kind != "rego":
            raise invalid('an object bundle needs "kind": "rego"')
        return Candidate("rego", _rego_content(body.bundle))
    if body.kind == "rego":
        raise invalid("a Rego bundle is an object {modules, data, manifest}")
    return Candidate(body.kind, body.bundle)


@router.post("/v0/policies/{agent_id}/test",
             openapi_extra=schema.operation(TestBody, body_required=False, answer=schema.TEST_REPORT))
async def test_policy(agent_id: str, request: Request) -> Response:
    """rebuno-v0 §4.5: `execution_id` → replay it (cases ignored); else run `cases`."""
    await call(auth_of(request).principal, request, "policies:write", "executions:read")
    body = parse_model(TestBody, await _body(request), allow_empty=True)
    k = kernel_of(request)
    agent_id = agent_param(agent_id)
    if isinstance(body.bundle, str):
        check_text(body.bundle, "bundle")
    candidate = await call(_candidate, body)
    if body.executions is not None and body.execution_id is None:
        scope = body.executions
        if not 1 <= scope.limit <= policy_test.BACKTEST_MAX:
            raise invalid(f"executions.limit must be 1-{policy_test.BACKTEST_MAX}")
        since = _since(scope.since)
        rep, n = await call(policy_test.backtest, k, agent_id, candidate, session=check_session(scope.session),
                            since=since, limit=scope.limit)
        return JSONResponse({"results": [result_json(r) for r in rep.results], "failed": rep.failed,
                             "steps": len(rep.results), "executions": n, "truncated": rep.truncated})
    if body.execution_id is not None:
        eid = uuid_param(body.execution_id, "execution_id")
        rep = await call(policy_test.replay_execution, k, agent_id, eid, candidate)
        out: dict[str, Any] = {"results": [result_json(r) for r in rep.results], "failed": rep.failed,
                               "steps": len(rep.results), "truncated": rep.truncated}
        return JSONResponse(out)
    text = json.dumps({"cases": body.cases or []})
    report, _ = await call(policy_test.run_test_cases, k, agent_id, text, candidate)
    results = [_case_json(r) for r in report.results]
    out = {"results": results, "failed": report.failed}
    if report.unexercised_rules:
        out["unexercised_rules"] = report.unexercised_rules
    return JSONResponse(out)


def _since(value: str | None) -> Any:
    return parse_time(value, "executions.since", naive_is_utc=True) if value else None


def _case_json(r: Any) -> dict[str, Any]:
    c = r.case
    out: dict[str, Any] = {}
    for key in ("name", "agent_id", "kind", "target", "args", "expect", "expect_rule"):
        value = getattr(c, key)
        if value or key == "target":
            out[key] = value
    out.update(decision=r.decision, rule_id=r.rule_id)
    if r.reason:
        out["reason"] = r.reason
    out["pass"] = r.passed
    if r.failure:
        out["failure"] = r.failure
    return out
