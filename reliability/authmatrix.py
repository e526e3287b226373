"""R5 auth matrix: every route of the served document, every way to get credentials wrong.

Agent routes: no signature, a wrong one, a stale timestamp, a replay of a request already
accepted (with and without a nonce, docs/api.md), another agent's valid signature, and the agent's own signature with another
execution's lease. Bearer routes: none, a wrong token, an empty one, another scheme, and API keys
that are revoked, expired (where keys can expire) or lack the route's scope. Every one must be
401 or 403, and no answer, refused or not, may contain an agent secret, the bootstrap token, a
key or a key hash."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from reliability.audit import first
from reliability.fuzz import Receiver, agent_headers, is_agent_route, is_dual_route
from reliability.procs import SECRET, TOKEN, Kernel, write_manifest
from reliability.report import Outcome

OTHER = "auth-other"
OTHER_SECRET = SECRET  # the manifest gives every agent SECRET; the other agent's signature is still its own id


def _key(scopes: list[str]) -> tuple[str, str, bytes]:
    key_id = str(uuid.uuid4())
    token = f"rbk_{key_id}.{secrets.token_urlsafe(32)[:43]}"
    return key_id, token, hashlib.sha256(token.encode()).digest()


def provision_keys(db_url: str) -> tuple[dict[str, str], list[str]]:
    """API keys written straight into the store before the kernel starts: name → token. Returns
    the kinds that could not be made (e.g. 'expired' before keys can expire)."""
    from kernel.store import open_store, tables
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    migrate(store)
    tokens: dict[str, str] = {}
    missing: list[str] = []
    now = datetime.now(UTC)
    has_expiry = "expires_at" in tables.api_keys.c
    rows = {"revoked": (["executions:read", "executions:write", "agents:read", "agents:write", "policies:write",
                         "approvals:read", "approvals:write"], {"revoked_at": now}),
            "agents-read-only": (["agents:read"], {}),
            "executions-read-only": (["executions:read"], {})}
    if has_expiry:
        rows["expired"] = (["executions:read", "executions:write", "agents:read", "agents:write", "policies:write",
                            "approvals:read", "approvals:write"], {"expires_at": now - timedelta(minutes=1)})
    else:
        missing.append("expired keys (the key table has no expiry yet)")
    with store.transaction() as tx:
        for name, (scopes, extra) in rows.items():
            key_id, token, digest = _key(scopes)
            tx.insert_api_key({"id": key_id, "name": f"chaos-{name}", "scopes": json.dumps(scopes),
                               "secret_hash": digest, "created_at": now, **extra})
            tokens[name] = token
    store.close()
    return tokens, missing


def forbidden_strings(tokens: dict[str, str]) -> list[str]:
    out = [SECRET, TOKEN]
    for token in tokens.values():
        digest = hashlib.sha256(token.encode()).digest()
        out += [token, token.partition(".")[2], digest.hex(), base64.b64encode(digest).decode(),
                base64.urlsafe_b64encode(digest).decode().rstrip("=")]
    return out


# Bodies that pass validation, so what refuses a request is its credentials, not its shape.
_BODIES = {
    "/v0/executions/{execution_id}/steps":
        b'{"kind":"tool_call","target":"t2","args":{},"idempotency":"safe_to_retry","resources":[]}',
    "/v0/executions/{execution_id}/steps/{step_id}/complete": b'{"result":1}',
    "/v0/executions/{execution_id}/steps/{step_id}/fail": b'{"error":"x"}',
    "/v0/executions/{execution_id}/steps/{step_id}/stream": b'{"seq":1,"data":"x"}',
    "/v0/executions/{execution_id}/complete": b'{"output":1}',
    "/v0/executions/{execution_id}/fail": b'{"error":"agent_error: x"}',
    "/v0/executions/{execution_id}/resources": b'{"key":"box","driver_id":"dir"}',
    "/v0/executions/{execution_id}/resources/{key}/binding": b'{"binding":{"path":"/tmp/x"}}',
    "/v0/executions": b'{"agent_id":"auth"}',
    "/v0/agents": b'{"id":"auth-new","webhook_url":"http://127.0.0.1:9/webhook","secret":"s"}',
    "/v0/policies/{agent_id}": b'{"bundle":"","kind":"yaml"}',
}


# Agent mutations whose nonce-less byte-identical repeat the kernel accepts (docs/api.md).
REPEATABLE_WITHOUT_NONCE = frozenset({"/v0/executions/{execution_id}/steps", "/v0/executions/{execution_id}/suspend",
                                      "/v0/agents/{agent_id}/metadata", "/v0/executions/{execution_id}/resources"})


def _valid_body(method: str, template: str) -> bytes:
    if method not in ("POST", "PUT"):
        return b""
    return _BODIES.get(template, b"{}")


def run(tmp: Path) -> Outcome:
    out = Outcome("R5", "auth matrix (SQLite)",
                  tried="every route × missing/wrong/stale/replayed (with and without a nonce)/other agent's/other execution's "
                        "signatures and missing/wrong/empty/other-scheme tokens, revoked/expired/under-scoped keys")
    started = time.monotonic()
    db_url = f"sqlite:///{tmp}/r5.db"
    tokens, missing = provision_keys(db_url)
    rec = Receiver()
    manifest = write_manifest(tmp / "regent.yaml", {"auth": rec.port, OTHER: rec.port})
    k = Kernel(db_url, tmp / "kernel.log", manifest=manifest, REGENT_DISPATCH_LEASE_TIMEOUT="1h").start()
    results: Counter[str] = Counter()
    wrong: list[str] = []
    leaks: list[str] = []
    never = forbidden_strings(tokens)
    try:
        with httpx.Client(base_url=k.url, headers=k.bearer(), timeout=30) as http:
            ids = [http.post("/v0/executions", json={"agent_id": "auth"}).json()["id"] for _ in range(2)]
            other_eid = http.post("/v0/executions", json={"agent_id": OTHER}).json()["id"]
            doc = http.get("/openapi.json").json()
        deadline = time.monotonic() + 30
        while len(rec.leases) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        eid, eid2 = ids
        lease, lease2 = rec.leases.get(eid), rec.leases.get(eid2)
        # A step of eid, so step routes have something real to refuse access to.
        with httpx.Client(base_url=k.url, timeout=30) as http:
            body = b'{"kind":"tool_call","target":"t","args":{},"idempotency":"safe_to_retry","resources":[]}'
            path = f"/v0/executions/{eid}/steps"
            r = http.post(path, content=body, headers={"Content-Type": "application/json",
                                                       **agent_headers("POST", path, body, lease, agent_id="auth")})
            step_id = r.json().get("step_id", "0" * 64) if r.status_code == 200 else "0" * 64
        values = {"execution_id": eid, "step_id": step_id, "agent_id": "auth", "approval_id": str(uuid.uuid4()),
                  "seq": "1", "key_id": str(uuid.uuid4()), "decision_id": str(uuid.uuid4())}

        def send(case: str, method: str, target: str, body: bytes, headers: dict[str, str]) -> None:
            with httpx.Client(base_url=k.url, timeout=30) as c:
                try:
                    if target.endswith("/stream") and method == "GET":
                        with c.stream(method, target, headers=headers, timeout=10) as r:
                            status, text = r.status_code, (r.read().decode(errors="replace") if r.status_code >= 400 else "")
                    else:
                        r = c.request(method, target, content=body, headers=headers)
                        status, text = r.status_code, r.text
                except httpx.HTTPError as exc:
                    status, text = 0, type(exc).__name__
            results[f"{status}"] += 1
            if status not in (401, 403):
                wrong.append(f"{method} {target.split('?')[0][-48:]} [{case}] → {status} {text[:60]!r}")
            hit = [s for s in never if s and s in text]
            if hit:
                leaks.append(f"{method} {target} [{case}]")

        n_routes = 0
        for template, item in doc["paths"].items():
            for method_l in item:
                method = method_l.upper()
                if template in ("/v0/health", "/v0/ready", "/metrics"):
                    continue  # open by design (docs/deployment.md)
                n_routes += 1
                path = template
                for name, value in values.items():
                    path = path.replace("{" + name + "}", value)
                body = _valid_body(method, template)
                ctype = {"Content-Type": "application/json"}
                agent = is_agent_route(method, template)
                dual = is_dual_route(method, template)
                if agent or dual:
                    use = lease if (agent and method != "GET") else None
                    send("no signature", method, path, body, ctype if agent else {**ctype})
                    h = agent_headers(method, path, body, use, agent_id="auth")
                    h["Rebuno-Signature"] = "v1=" + "0" * 64
                    send("wrong signature", method, path, body, {**ctype, **h})
                    send("wrong secret", method, path, body,
                         {**ctype, **agent_headers(method, path, body, use, agent_id="auth", secret="not-the-secret")})
                    # ±310 s: clear of the ±300 s window even when a second ticks between signing and checking.
                    send("stale timestamp", method, path, body,
                         {**ctype, **agent_headers(method, path, body, use, agent_id="auth", ts=int(time.time()) - 310)})
                    send("future timestamp", method, path, body,
                         {**ctype, **agent_headers(method, path, body, use, agent_id="auth", ts=int(time.time()) + 310)})
                    send("other agent's signature", method, path, body,
                         {**ctype, **agent_headers(method, path, body, rec.leases.get(other_eid) if use else None,
                                                   agent_id=OTHER, secret=OTHER_SECRET)})
                    if template.startswith("/v0/executions/{execution_id}"):
                        # A valid signature of the same request on the agent's other execution.
                        other_path = path.replace(eid, eid2)
                        send("other execution's signature", method, path, body,
                             {**ctype, **agent_headers(method, other_path, body, lease2 if use else None,
                                                       agent_id="auth")})
                    if agent and method != "GET":
                        # A replay: the same signed bytes twice; only the second is judged. A step
                        # submit (and metadata, suspend) without a nonce may repeat by design: the
                        # official SDK sends those bytes twice for two identical steps within a
                        # second (docs/api.md, Replayed requests); with a nonce, any repeat is refused.
                        repeatable = template in REPEATABLE_WITHOUT_NONCE
                        for case, nonce in (("replayed", None), ("replayed with a nonce", secrets.token_urlsafe(16))):
                            if repeatable and nonce is None:
                                continue
                            h = {**ctype, **agent_headers(method, path, body, use, agent_id="auth", nonce=nonce)}
                            with httpx.Client(base_url=k.url, timeout=30) as c:
                                c.request(method, path, content=body, headers=h)
                            send(case, method, path, body, h)
                if not agent:
                    send("no token", method, path, body, ctype)
                    send("wrong token", method, path, body, {**ctype, "Authorization": "Bearer not-the-token"})
                    send("empty token", method, path, body, {**ctype, "Authorization": "Bearer"})
                    send("other scheme", method, path, body, {**ctype, "Authorization": f"Basic {TOKEN}"})
                    send("malformed key", method, path, body, {**ctype, "Authorization": "Bearer rbk_x.y"})
                    for name in ("revoked", "expired"):
                        if name in tokens:
                            send(f"{name} key", method, path, body, {**ctype, "Authorization": f"Bearer {tokens[name]}"})
                    under = "executions-read-only" if "/agents" in template else "agents-read-only"
                    send("under-scoped key", method, path, body, {**ctype, "Authorization": f"Bearer {tokens[under]}"})
        refused = results["401"] + results["403"]
        total = sum(results.values())
        out.check(f"100 % refused with 401/403 ({refused}/{total})", not wrong, f"{len(wrong)}: {first(wrong, 3)}",
                  items=wrong)
        out.check("no answer contains a secret, token or key hash", not leaks, first(leaks))
        if missing:
            out.check("every credential kind tried", False, "; ".join(missing), items=missing)
        out.figures = {"routes": n_routes, "requests": total, "401": results["401"], "403": results["403"],
                       "other": total - refused}
        out.details = {"wrong": wrong, "leaks": leaks}
    finally:
        k.stop()
        rec.close()
        out.seconds = time.monotonic() - started
    return out
