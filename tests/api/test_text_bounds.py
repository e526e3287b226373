"""Text and counts a client may store, refused the same way on SQLite and PostgreSQL: a key's
`name` and `scopes` with NUL or a lone surrogate (a 500 on both stores before, and a NUL name was
stored on SQLite), and size bounds on an agent's `secret` (1 MB was accepted), an approval's
`rationale` (5 MB), a key's `scopes` (10 000 entries) and a stream delta's `seq` (-1 and 2^63)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from kernel.api.routes.stream import MAX_SEQ
from kernel.core.agents import MAX_SECRET_CHARS
from kernel.core.api_keys import MAX_SCOPES
from kernel.core.approvals import MAX_RATIONALE_CHARS
from tests.support import AgentClient, ServerThread

BEARER = {"Authorization": "Bearer boot-token", "Content-Type": "application/json"}


def _post(server: ServerThread, path: str, raw: bytes | dict[str, Any]) -> httpx.Response:
    body = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    return httpx.post(server.url + path, content=body, headers=BEARER, timeout=30)


def _refused(r: httpx.Response, words: str) -> None:
    assert r.status_code == 400, r.text[:300]
    assert r.json()["code"] == "validation_error" and words in r.json()["message"], r.text[:300]


@pytest.mark.parametrize("name", [b'"\\ud800"', b'"a\\u0000b"', b'"\\udfffkey"'])
def test_a_key_name_no_store_can_keep_is_a_400_on_both_stores(server: ServerThread, name: bytes) -> None:
    _refused(_post(server, "/v0/api-keys", b'{"name":' + name + b',"scopes":["executions:read"]}'), "name")
    assert httpx.get(server.url + "/v0/api-keys", headers=BEARER).json() == []


def test_a_scope_no_store_can_keep_is_a_400(server: ServerThread) -> None:
    _refused(_post(server, "/v0/api-keys", b'{"name":"k","scopes":["executions:read\\u0000"]}'), "scopes")
    _refused(_post(server, "/v0/api-keys", b'{"name":"k","scopes":["\\ud800"]}'), "scopes")


def test_a_key_lists_at_most_max_scopes_entries(server: ServerThread) -> None:
    _refused(_post(server, "/v0/api-keys", {"name": "k", "scopes": ["executions:read"] * 10_000}),
             f"at most {MAX_SCOPES}")
    ok = _post(server, "/v0/api-keys", {"name": "k", "scopes": ["executions:read"] * MAX_SCOPES})
    assert ok.status_code == 201 and ok.json()["scopes"] == ["executions:read"], ok.text[:300]


def test_an_agent_secret_is_at_most_max_secret_chars(server: ServerThread) -> None:
    body = {"id": "big", "webhook_url": "http://127.0.0.1:9/w", "secret": "s" * (1024 * 1024)}
    _refused(_post(server, "/v0/agents", body), f"at most {MAX_SECRET_CHARS}")
    assert httpx.get(server.url + "/v0/agents/big", headers=BEARER).status_code == 404
    ok = _post(server, "/v0/agents", {**body, "secret": "s" * MAX_SECRET_CHARS})
    assert ok.status_code == 201, ok.text[:300]


def test_an_approval_rationale_past_its_bound_is_a_400_before_anything_is_looked_up(server: ServerThread) -> None:
    r = _post(server, f"/v0/approvals/{uuid.uuid4()}/grant",
              {"decided_by": "oncall", "rationale": "r" * (5 * 1024 * 1024 // 2)})
    _refused(r, f"at most {MAX_RATIONALE_CHARS}")
    r = _post(server, f"/v0/approvals/{uuid.uuid4()}/grant", {"decided_by": "oncall", "rationale": "r" * 10})
    assert r.status_code == 404, r.text[:300]


@pytest.mark.parametrize("seq", [-1, 2**63, 10**30])
def test_a_stream_seq_outside_int64_is_a_400(agent_client: AgentClient, running: Any, seq: int) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    sid = agent_client.submit(eid, "shell.run", {"c": 1}).json()["step_id"]
    r = agent_client.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": seq, "data": "x"})
    _refused(r, f"0-{MAX_SEQ}")
    ok = agent_client.request("POST", f"/v0/executions/{eid}/steps/{sid}/stream", {"seq": MAX_SEQ, "data": "x"})
    assert ok.status_code == 204, ok.text[:300]


@pytest.mark.parametrize("url", ["HTTP://\u00bc\U0001f60d]j", "http://[::1", "https://x]:80/"])
def test_a_webhook_url_the_url_parser_refuses_is_a_400(server: ServerThread, url: str) -> None:
    # R3's generated fuzz: urlparse raised ValueError ("Invalid IPv6 URL") past the check, a 500.
    _refused(_post(server, "/v0/agents", {"id": "u", "webhook_url": url, "secret": "s"}), "webhook_url")
