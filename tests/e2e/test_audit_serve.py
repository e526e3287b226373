"""Audit and identities against `regent serve` over real HTTP, on SQLite and PostgreSQL (docs/audit.md):
API keys from the CLI and the route, bound approvers, bootstrap approvals, self-approval, approvals
with context, bundle hashes, and decisions that outlive their execution."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import REPO, KernelProc, clean_env, wait_for
from tests.support import AgentClient, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BOOT = "boot-" + "x" * 24
SECRET = "audit-agent-secret"
POLICY = """\
default_action: allow
rules:
  - id: pay-needs-treasury
    when:
      target: payments.send
    then:
      decision: require_approval
      reason: payments need a second pair of eyes
      approval_config: {approvers: [treasury-oncall, cfo], timeout: 10m}
  - id: no-rm
    when:
      target: shell.rm
    then:
      decision: deny
      reason: never
"""


class Webhook:
    """The agent's webhook: records every dispatch the kernel delivers (answers 200)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.deliveries: queue.Queue[dict[str, Any]] = queue.Queue()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                outer.deliveries.put(json.loads(body))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def lease_for(self, execution_id: str, timeout: float = 30.0) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                d = self.deliveries.get(timeout=0.5)
            except queue.Empty:
                continue
            if d["execution_id"] == execution_id:
                return d["dispatch_id"], int(d["dispatch_attempt"])
        raise AssertionError(f"no delivery for {execution_id} within {timeout}s")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Served:
    def __init__(self, proc: KernelProc, db_url: str, hook: Webhook):
        self.proc, self.db_url, self.hook = proc, db_url, hook
        self.url = proc.url
        self.agent = AgentClient(proc.url, "payer", SECRET)

    def http(self, token: str | None = BOOT) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15)

    def start(self, token: str = BOOT) -> tuple[str, str, int]:
        with self.http(token) as c:
            r = c.post("/v0/executions", json={"agent_id": "payer", "input": {"invoice": 7}})
            assert r.status_code == 201, r.text
            eid = r.json()["id"]
        did, att = self.hook.lease_for(eid)
        self.agent.lease(did, att)
        return eid, did, att

    def blocked_payment(self, token: str = BOOT, args: Any = None) -> tuple[str, str]:
        eid, _, _ = self.start(token)
        r = self.agent.submit(eid, "payments.send", args if args is not None else {"amount": 1500, "to": "acme"})
        assert r.json()["decision"] == "blocked", r.text
        return eid, r.json()["approval_id"]


def _serve(tmp: Path, db_url: str, **env: str) -> Iterator[Served]:
    hook = Webhook()
    proc = KernelProc("serve", free_port(), db_url, None, tmp / "serve.out", ready_timeout=240, REGENT_BEARER_TOKEN=BOOT,
                      REGENT_DISPATCH_POLL_INTERVAL="50ms", REGENT_CLEANUP_INTERVAL="1s", **env)
    s = Served(proc, db_url, hook)
    try:
        with s.http() as c:
            r = c.post("/v0/agents", json={"id": "payer", "webhook_url": f"http://127.0.0.1:{hook.port}/hook",
                                           "secret": SECRET})
            assert r.status_code in (200, 201), r.text
            assert c.post("/v0/policies/payer", json={"bundle": POLICY}).status_code == 204
        yield s
    finally:
        s.agent.close()
        # stop_gracefully's checks with a longer wait: on a loaded machine a kernel that ran Rego
        # workers can take over 15 s from SIGTERM to exit
        rc = proc.stop(signal.SIGTERM, timeout=90)
        out = proc.output()
        hook.close()
        assert rc == 0 and "regent: stopped" in out and "Traceback" not in out, out


@contextlib.contextmanager
def _database(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp}/audit.db"
        return
    with scratch_pg_database("regent_audit") as url:
        yield url


DIALECTS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with _database(request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="module", params=DIALECTS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server per dialect for the module (starting one costs seconds on a loaded machine);
    executions are deleted a second after they end, which only the retention test waits for."""
    tmp = tmp_path_factory.mktemp(f"audit-{request.param}")
    with _database(request.param, tmp) as url:
        yield from _serve(tmp, url, REGENT_RETENTION="1s")


def _cli_key(db_url: str, name: str, *scopes: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "kernel", "keys", "create", "--name", name, "--json", "--db-url", db_url,
         *[a for s in scopes for a in ("--scope", s)]],
        env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def _route_key(s: Served, name: str, *scopes: str, **extra: Any) -> dict[str, Any]:
    with s.http() as c:
        r = c.post("/v0/api-keys", json={"name": name, "scopes": list(scopes), **extra})
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_a_cli_key_made_before_serve_grants_exactly_its_scopes_until_revoked(db_url: str, tmp_path: Path) -> None:
    if db_url.startswith("sqlite"):
        key = _cli_key(db_url, "reader", "executions:read")  # SQLite: one process per file, so before serve
    for s in _serve(tmp_path, db_url):
        if not db_url.startswith("sqlite"):
            key = _cli_key(db_url, "reader", "executions:read")  # PostgreSQL: beside the running server
        token = key["token"]
        with s.http(token) as c:
            assert c.get("/v0/executions").status_code == 200
            denied = c.post("/v0/executions", json={"agent_id": "payer"})
            assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
            assert c.get("/v0/api-keys").status_code == 403
        with s.http() as c:
            listed = c.get("/v0/api-keys").json()
            assert [(k["name"], k["scopes"], k["created_by"]) for k in listed] == [("reader", ["executions:read"], "cli")]
            assert "token" not in listed[0] and "secret_hash" not in listed[0]
            assert c.delete(f"/v0/api-keys/{key['id']}").status_code == 204
        with s.http(token) as c:
            assert c.get("/v0/executions").status_code == 401


def test_a_route_key_grants_its_scopes_and_is_refused_after_revoke_or_expiry(served: Served) -> None:
    key = _route_key(served, "ops", "executions:read", "executions:write")
    assert key["token"].startswith("rbk_") and key["created_by"] == "bootstrap"
    with served.http(key["token"]) as c:
        assert c.post("/v0/executions", json={"agent_id": "payer"}).status_code == 201
        assert c.get("/v0/approvals").status_code == 403
    short = _route_key(served, "short", "executions:read", expires_in="2s")
    with served.http(short["token"]) as c:
        assert c.get("/v0/executions").status_code == 200
        wait_for(lambda: c.get("/v0/executions").status_code == 401, "the short key to expire", timeout=15)
    with served.http() as c:
        assert c.delete(f"/v0/api-keys/{key['id']}").status_code == 204
        used = next(k for k in c.get("/v0/api-keys").json() if k["id"] == key["id"])
        assert "revoked_at" in used and "last_used_at" in used
    with served.http(key["token"]) as c:
        assert c.get("/v0/executions").status_code == 401
    # a key may not mint a key with scopes beyond its own
    admin = _route_key(served, "key-admin", "api_keys:manage")
    with served.http(admin["token"]) as c:
        r = c.post("/v0/api-keys", json={"name": "escalate", "scopes": ["approvals:write"]})
        assert r.status_code == 403
        r = c.post("/v0/api-keys", json={"name": "bad", "scopes": ["root"]})
        assert r.status_code == 400 and "unknown scope" in r.json()["message"]


def test_a_key_manager_revokes_only_keys_within_its_own_scopes(served: Served) -> None:
    manager = _route_key(served, "key-manager", "api_keys:manage", "executions:read")
    approver = _route_key(served, "treasury", "approvals:read", "approvals:write")
    reader = _route_key(served, "reader-2", "executions:read")
    with served.http(manager["token"]) as c:
        refused = c.delete(f"/v0/api-keys/{approver['id']}")
        assert refused.status_code == 403 and "approvals:read" in refused.json()["message"]
        assert c.delete(f"/v0/api-keys/{reader['id']}").status_code == 204
    with served.http(approver["token"]) as c:
        assert c.get("/v0/approvals").status_code == 200  # still live
    with served.http(reader["token"]) as c:
        assert c.get("/v0/executions").status_code == 401
    with served.http() as c:  # the bootstrap token holds every scope
        assert c.delete(f"/v0/api-keys/{approver['id']}").status_code == 204


def test_a_scoped_key_grant_records_the_key_name_whatever_decided_by_says(served: Served) -> None:
    eid, aid = served.blocked_payment()
    key = _route_key(served, "treasury-oncall", "approvals:read", "approvals:write")
    with served.http(key["token"]) as c:
        r = c.post(f"/v0/approvals/{aid}/grant", json={"decided_by": "cfo", "rationale": "ok"})
        assert r.status_code == 204, r.text
        a = c.get(f"/v0/approvals/{aid}").json()
    assert (a["decided_by"], a["asserted_by"], a["credential"]) == ("treasury-oncall", "cfo", "key")
    with served.http() as c:
        granted = next(e for e in c.get(f"/v0/executions/{eid}/events").json() if e["type"] == "approval.granted")
        [d] = c.get("/v0/decisions", params={"execution_id": eid, "decision": "approval_granted"}).json()["decisions"]
    assert (granted["payload"]["decided_by"], granted["payload"]["credential"]) == ("treasury-oncall", "key")
    assert granted["payload"]["key_id"] == key["id"]
    assert (d["decided_by"], d["credential"], d["rule_id"]) == ("treasury-oncall", "key", "pay-needs-treasury")


def test_a_key_not_among_the_approvers_is_refused(served: Served) -> None:
    _, aid = served.blocked_payment()
    key = _route_key(served, "intern", "approvals:write")
    with served.http(key["token"]) as c:
        r = c.post(f"/v0/approvals/{aid}/grant", json={"decided_by": "cfo"})
    assert r.status_code == 403 and '"intern" is not an approver' in r.json()["message"]


def test_a_bootstrap_grant_must_name_an_approver_and_records_credential_bootstrap(served: Served) -> None:
    eid, aid = served.blocked_payment()
    with served.http() as c:
        assert c.post(f"/v0/approvals/{aid}/grant", json={}).status_code == 403
        assert c.post(f"/v0/approvals/{aid}/grant", json={"decided_by": "mallory"}).status_code == 403
        assert c.post(f"/v0/approvals/{aid}/grant", json={"decided_by": "cfo"}).status_code == 204
        a = c.get(f"/v0/approvals/{aid}").json()
        granted = next(e for e in c.get(f"/v0/executions/{eid}/events").json() if e["type"] == "approval.granted")
    assert (a["decided_by"], a["asserted_by"], a["credential"]) == ("cfo", "cfo", "bootstrap")
    assert (granted["payload"]["asserted_by"], granted["payload"]["credential"]) == ("cfo", "bootstrap")


def test_bootstrap_approvals_are_refused_when_the_setting_forbids_them(db_url: str, tmp_path: Path) -> None:
    for s in _serve(tmp_path, db_url, REGENT_BOOTSTRAP_APPROVALS="false"):
        _, aid = s.blocked_payment()
        with s.http() as c:
            r = c.post(f"/v0/approvals/{aid}/grant", json={"decided_by": "cfo"})
            assert r.status_code == 403 and "REGENT_BOOTSTRAP_APPROVALS" in r.json()["message"]
            assert c.post(f"/v0/approvals/{aid}/deny", json={"decided_by": "cfo"}).status_code == 403
        key = _route_key(s, "cfo", "approvals:write")
        with s.http(key["token"]) as c:
            assert c.post(f"/v0/approvals/{aid}/grant", json={}).status_code == 204


def test_the_key_that_created_an_execution_cannot_approve_its_steps(served: Served) -> None:
    key = _route_key(served, "cfo", "executions:write", "approvals:write", "approvals:read")
    _, aid = served.blocked_payment(token=key["token"])
    with served.http(key["token"]) as c:
        r = c.post(f"/v0/approvals/{aid}/grant", json={})
        assert r.status_code == 403 and "created" in r.json()["message"]
        assert c.get(f"/v0/approvals/{aid}").json()["status"] == "pending"
    other = _route_key(served, "treasury-oncall", "approvals:write")
    with served.http(other["token"]) as c:
        assert c.post(f"/v0/approvals/{aid}/grant", json={}).status_code == 204


def test_another_key_with_the_creators_name_cannot_approve_its_steps_either(served: Served) -> None:
    # The decider the record keeps is the key's name: a second key minted under the creator's
    # name would otherwise approve its holder's own steps, recorded as that name.
    creator = _route_key(served, "cfo", "executions:write")
    _, aid = served.blocked_payment(token=creator["token"])
    twin = _route_key(served, "cfo", "approvals:write")
    with served.http(twin["token"]) as c:
        r = c.post(f"/v0/approvals/{aid}/grant", json={})
        assert r.status_code == 403 and '"cfo" created this execution' in r.json()["message"], r.text
        assert c.post(f"/v0/approvals/{aid}/deny", json={}).status_code == 403
    with served.http() as c:
        assert c.get(f"/v0/approvals/{aid}").json()["status"] == "pending"
    other = _route_key(served, "treasury-oncall", "approvals:write")
    with served.http(other["token"]) as c:
        assert c.post(f"/v0/approvals/{aid}/grant", json={}).status_code == 204


def test_the_key_that_created_a_parent_cannot_approve_its_sub_agents_steps(served: Served) -> None:
    creator = _route_key(served, "cfo", "executions:write", "approvals:write")
    parent, _, _ = served.start(token=creator["token"])
    with served.http() as c:  # the sub-agent's execution, created by another credential
        r = c.post("/v0/executions", json={"agent_id": "payer", "input": {}, "parent_execution_id": parent})
        assert r.status_code == 201, r.text
        child = r.json()["id"]
    did, att = served.hook.lease_for(child)
    served.agent.lease(did, att)
    r = served.agent.submit(child, "payments.send", {"amount": 1500, "to": "acme"})
    assert r.json()["decision"] == "blocked", r.text
    aid = r.json()["approval_id"]
    with served.http(creator["token"]) as c:
        r = c.post(f"/v0/approvals/{aid}/grant", json={})
        assert r.status_code == 403 and "an ancestor of this execution" in r.json()["message"], r.text
    other = _route_key(served, "treasury-oncall", "approvals:write")
    with served.http(other["token"]) as c:
        assert c.post(f"/v0/approvals/{aid}/grant", json={}).status_code == 204


def test_an_auditor_key_fetches_the_bundle_behind_a_decision(served: Served) -> None:
    with served.http() as c:  # the policy of the module (a Rego test may have replaced it)
        assert c.post("/v0/policies/payer", json={"bundle": POLICY}).status_code == 204
    eid, _, _ = served.start()
    assert served.agent.submit(eid, "shell.rm", {"path": "/"}).json()["decision"] == "denied"
    auditor = _route_key(served, "auditor", "decisions:read")
    with served.http(auditor["token"]) as c:
        [d] = c.get("/v0/decisions", params={"execution_id": eid}).json()["decisions"]
        listed = c.get("/v0/policies/payer/revisions")
        assert listed.status_code == 200 and d["policy_hash"] in [r["policy_hash"] for r in listed.json()]
        got = c.get(f"/v0/policies/payer/revisions/{d['policy_hash']}")
        assert got.status_code == 200 and got.json()["bundle"] == POLICY
        # reading is all it may do with policies
        assert c.get("/v0/policies/payer").status_code == 403
        assert c.post("/v0/policies/payer", json={"bundle": POLICY}).status_code == 403
    nobody = _route_key(served, "runner", "executions:read")
    with served.http(nobody["token"]) as c:
        assert c.get(f"/v0/policies/payer/revisions/{d['policy_hash']}").status_code == 403


def test_an_approval_record_carries_the_steps_target_and_arguments(served: Served) -> None:
    eid, aid = served.blocked_payment(args={"amount": 1500.50, "to": "acme", "memo": "Q4"})
    with served.http() as c:
        [a] = [x for x in c.get("/v0/approvals").json() if x["id"] == aid]
    assert (a["agent_id"], a["execution_id"], a["kind"], a["target"]) == ("payer", eid, "tool_call", "payments.send")
    assert a["args"] == {"amount": 1500.50, "to": "acme", "memo": "Q4"}
    assert (a["rule_id"], a["reason"]) == ("pay-needs-treasury", "payments need a second pair of eyes")
    assert a["requested_at"] and a["expires_at"] and len(a["policy_hash"]) == 64


def test_two_rego_bundles_with_one_revision_have_two_fetchable_hashes(served: Served) -> None:
    d = REPO / "bundles" / "shell-rego"
    hashes = []
    for marker in ("one", "two"):
        data = json.loads((d / "data.json").read_text())
        data["shell"]["marker"] = marker
        bundle = {"modules": {"policy.rego": (d / "policy.rego").read_text()}, "data": data,
                  "manifest": {"revision": "2026-01-01.1", "roots": ["shell"],
                               "metadata": {"regent": {"entrypoint": "shell/decision", "default_action": "deny"}}}}
        with served.http() as c:
            assert c.post("/v0/policies/payer", json={"kind": "rego", "bundle": bundle}).status_code == 204
        eid, _, _ = served.start()
        assert served.agent.submit(eid, "shell_exec", {"command": "ls"}).status_code == 200
        with served.http() as c:
            [dec] = c.get("/v0/decisions", params={"execution_id": eid}).json()["decisions"]
        assert dec["policy_revision"] == "2026-01-01.1"
        hashes.append(dec["policy_hash"])
    assert hashes[0] != hashes[1]
    with served.http() as c:
        for h, marker in zip(hashes, ("one", "two"), strict=True):
            got = c.get(f"/v0/policies/payer/revisions/{h}")
            assert got.status_code == 200 and got.json()["bundle"]["data"]["shell"]["marker"] == marker
        assert c.post("/v0/policies/payer", json={"bundle": POLICY}).status_code == 204  # the module's again


def test_a_decision_survives_the_executions_retention_and_is_found(served: Served) -> None:
    s = served
    with s.http() as c:  # the policy of the module (a Rego test may have replaced it)
        assert c.post("/v0/policies/payer", json={"bundle": POLICY}).status_code == 204
    eid, _, _ = s.start()
    r = s.agent.submit(eid, "shell.rm", {"path": "/"})
    assert r.json()["decision"] == "denied"
    with s.http() as c:
        assert c.post(f"/v0/executions/{eid}/cancel").status_code == 204
        wait_for(lambda: c.get(f"/v0/executions/{eid}").status_code == 404,
                 "the retention sweep to delete the execution", timeout=60)
        [d] = c.get("/v0/decisions", params={"rule_id": "no-rm", "execution_id": eid}).json()["decisions"]
    assert (d["execution_id"], d["decision"], d["target"], d["reason"]) == (eid, "denied", "shell.rm", "never")
