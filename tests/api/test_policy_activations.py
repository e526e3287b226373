"""Every activation of a policy revision says who and when, in the revisions list and the policy
audit trail; rollback returns to the revision that was active before (docs/audit.md)."""

from __future__ import annotations

from typing import Any

import httpx

from kernel.clock import ManualClock
from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import ServerThread

BOOT = {"Authorization": "Bearer boot-token"}


def _bundle(n: int) -> dict[str, str]:
    return {"bundle": f"default_action: allow\nrules: []\n# revision {n}\n"}


def _key(server: ServerThread, name: str) -> dict[str, str]:
    r = httpx.post(f"{server.url}/v0/api-keys", json={"name": name, "scopes": ["policies:write"]}, headers=BOOT)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _revisions(server: ServerThread) -> dict[int, dict[str, Any]]:
    return {r["seq"]: r for r in httpx.get(f"{server.url}/v0/policies/shell/revisions", headers=BOOT).json()}


def test_re_activating_a_revision_shows_when_and_by_whom(governed: Kernel, server: ServerThread, running: Running,
                                                         clock: ManualClock) -> None:
    alice, bob = _key(server, "alice"), _key(server, "bob")
    assert httpx.post(f"{server.url}/v0/policies/shell", json=_bundle(1), headers=alice).status_code == 204
    stored_at = clock.now()
    clock.advance(60)
    assert httpx.post(f"{server.url}/v0/policies/shell", json=_bundle(2), headers=BOOT).status_code == 204
    clock.advance(3600)
    r = httpx.post(f"{server.url}/v0/policies/shell/revisions/1/activate", headers=bob)
    assert r.status_code == 204, r.text
    revs = _revisions(server)
    one, two = revs[1], revs[2]
    assert one["active"] and one["created_at"] == stored_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert (one["created_by"], one["created_credential"]) == ("alice", "key")
    assert (one["activated_by"], one["activated_credential"], one["activated_via"]) == ("bob", "key", "reactivate")
    assert one["activated_at"] == clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ") != one["created_at"]
    assert (two["created_by"], two["activated_by"], two["activated_via"]) == ("bootstrap", "bootstrap", "upload")
    active = httpx.get(f"{server.url}/v0/policies/shell", headers=BOOT).json()
    assert (active["seq"], active["activated_by"], active["activated_at"]) == (1, "bob", one["activated_at"])
    (event, *_) = httpx.get(f"{server.url}/v0/policies/shell/events", headers=BOOT).json()
    assert (event["type"], event["seq"], event["actor"], event["credential"]) == ("policy.activated", 1, "bob", "key")
    assert event["payload"]["via"] == "reactivate" and event["payload"]["from_seq"] == 2
    assert event["occurred_at"] == one["activated_at"]


def test_rollback_returns_to_the_revision_active_before_not_the_highest_earlier_one(
        governed: Kernel, server: ServerThread, running: Running) -> None:
    for n in (1, 2, 3):
        r = httpx.post(f"{server.url}/v0/policies/shell", json=_bundle(n))
        assert r.status_code == 204, r.text
    assert httpx.post(f"{server.url}/v0/policies/shell/revisions/1/activate").status_code == 204
    back = httpx.post(f"{server.url}/v0/policies/shell/rollback")
    assert back.status_code == 200 and back.json()["seq"] == 3, back.text
    again = httpx.post(f"{server.url}/v0/policies/shell/rollback")
    assert again.json()["seq"] == 1
    assert _revisions(server)[1]["activated_via"] == "rolled_back"
