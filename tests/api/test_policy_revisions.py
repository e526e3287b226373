"""Every stored bundle is kept and fetchable by the `policy_hash` its decisions record, even when
two Rego bundles share one manifest revision (docs/audit.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx

from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

BUNDLE = Path(__file__).resolve().parents[2] / "bundles" / "shell-rego"


def _rego(extra_data: dict[str, Any]) -> dict[str, Any]:
    data = json.loads((BUNDLE / "data.json").read_text())
    data["shell"].update(extra_data)  # data lives under the bundle's root
    return {"kind": "rego", "bundle": {
        "modules": {"policy.rego": (BUNDLE / "policy.rego").read_text()},
        "data": data,
        "manifest": {"revision": "2026-01-01.1", "roots": ["shell"],
                     "metadata": {"regent": {"entrypoint": "shell/decision", "default_action": "deny"}}},
    }}



def _decision_hash(server: ServerThread, agent_client: AgentClient, running: Running) -> str:
    eid, did, att = running.start()
    assert agent_client.lease(did, att).submit(eid, "shell_exec", {"command": "ls"}).status_code == 200
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events").json()
    decided = next(e for e in events if e["type"] in ("step.allowed", "step.denied", "step.awaiting_approval"))
    assert decided["payload"]["policy_revision"] == "2026-01-01.1"
    return str(decided["payload"]["policy_hash"])


def test_two_rego_bundles_with_one_manifest_revision_have_two_fetchable_hashes(
    governed: Kernel, server: ServerThread, running: Running, agent_client: AgentClient
) -> None:
    first, second = _rego({}), _rego({"marker": "second"})
    assert httpx.post(f"{server.url}/v0/policies/shell", json=first).status_code == 204
    h1 = _decision_hash(server, agent_client, running)
    assert httpx.post(f"{server.url}/v0/policies/shell", json=second).status_code == 204
    h2 = _decision_hash(server, agent_client, running)
    assert h1 != h2 and len(h1) == len(h2) == 64

    revs = httpx.get(f"{server.url}/v0/policies/shell/revisions").json()
    assert [(r["seq"], r["revision"], r["policy_hash"], r["active"]) for r in revs] == [
        (1, "2026-01-01.1", h1, False), (2, "2026-01-01.1", h2, True)]
    for h, sent in ((h1, first), (h2, second)):
        got = httpx.get(f"{server.url}/v0/policies/shell/revisions/{h}")
        assert got.status_code == 200
        body = got.json()
        assert body["policy_hash"] == h and body["kind"] == "rego"
        assert body["bundle"]["data"] == sent["bundle"]["data"]  # type: ignore[index]
        # the hash is SHA-256 of the canonical stored bundle: recomputable from what is served
        canonical = json.dumps(body["bundle"], sort_keys=True, ensure_ascii=False)
        assert hashlib.sha256(canonical.encode()).hexdigest() == h
    # the decisions record names the same hashes
    hashes = {d["policy_hash"] for d in httpx.get(f"{server.url}/v0/decisions").json()["decisions"]}
    assert hashes == {h1, h2}


def test_an_unknown_or_malformed_hash_is_404_or_400(governed: Kernel, server: ServerThread, running: Running) -> None:
    assert httpx.get(f"{server.url}/v0/policies/shell/revisions/{'0' * 64}").status_code == 404
    bad = httpx.get(f"{server.url}/v0/policies/shell/revisions/not-a-hash")
    assert bad.status_code == 400 and bad.json()["code"] == "validation_error"
    assert httpx.get(f"{server.url}/v0/policies/nobody/revisions/{'0' * 64}").status_code == 404
