"""An agent whose bundle is pulled has one source of truth, its bundle server: promote, rollback,
re-activate and upload are refused with a 409 naming the source, and the puller's activations are
credited to the source URL (docs/policy-rollout.md, "Pulled agents"). Run as `regent serve` builds
it, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel.bootstrap import build_runtime
from kernel.config import Settings
from tests.bundles.test_bundle_server import BundleServer, bundle
from tests.bundles.test_config import _manifest
from tests.conftest import scratch_pg_database
from tests.support import ServerThread

TOKEN = "pull-test-bootstrap"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CANDIDATE = "default_action: allow\nrules: []\n"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/r.db"
        return
    with scratch_pg_database("regent_pull") as url:
        yield url


def _wait(what: str, check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def served(tmp_path: Path, db_url: str) -> Iterator[tuple[str, BundleServer, Path]]:
    """`regent serve`'s runtime pulling `payments` from a real bundle server, revision r1 active."""
    srv = BundleServer(tmp_path / "server")
    try:
        srv.publish(bundle(tmp_path, "r1"))
        settings = Settings(db_url=db_url, config=str(_manifest(tmp_path)), bundle_server_url=srv.url,
                            bearer_token=TOKEN)
        rt = build_runtime(settings)
        try:
            with ServerThread(rt.app) as http:
                _wait("r1 active", lambda: httpx.get(f"{http.url}/v0/ready").status_code == 200)
                yield http.url, srv, tmp_path
        finally:
            rt.close()
    finally:
        srv.stop()


def _active(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v0/policies/payments", headers=AUTH)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _refused(r: httpx.Response, source: str) -> None:
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "conflict" and source in body["message"] and "payments" in body["message"], body


def test_promote_on_a_pulled_agent_is_refused_naming_the_source_and_nothing_changes(
        served: tuple[str, BundleServer, Path]) -> None:
    url, srv, _ = served
    source = f"{srv.url}/bundles/payments.tar.gz"
    before = _active(url)
    assert before["revision"] == "r1"
    # A shadow only observes: it may be set on a pulled agent.
    assert httpx.put(f"{url}/v0/policies/payments/shadow", json={"bundle": CANDIDATE}, headers=AUTH).status_code == 200
    _refused(httpx.post(f"{url}/v0/policies/payments/shadow/promote", headers=AUTH), source)
    _refused(httpx.post(f"{url}/v0/policies/payments/rollback", headers=AUTH), source)
    _refused(httpx.post(f"{url}/v0/policies/payments/revisions/1/activate", headers=AUTH), source)
    _refused(httpx.post(f"{url}/v0/policies/payments", json={"bundle": CANDIDATE}, headers=AUTH), source)
    _refused(httpx.post(f"{url}/v0/policies/payments", json={"bundle": ""}, headers=AUTH), source)
    # Nothing changed, now or once the puller has polled again (it polls every 0.05-0.1 s).
    polls = len(srv.requests())
    _wait("two more polls", lambda: len(srv.requests()) >= polls + 2)
    after = _active(url)
    assert (after["seq"], after["revision"], after["policy_hash"]) == (before["seq"], "r1", before["policy_hash"])
    assert httpx.get(f"{url}/v0/policies/payments/shadow", headers=AUTH).json()["status"] == "shadowing"
    types = [e["type"] for e in httpx.get(f"{url}/v0/policies/payments/events", headers=AUTH).json()]
    assert "policy.promoted" not in types and "policy.rolled_back" not in types


def test_re_registering_a_pulled_agent_keeps_its_bundle(served: tuple[str, BundleServer, Path]) -> None:
    url, _, _ = served
    r = httpx.post(f"{url}/v0/agents", json={"id": "payments", "webhook_url": "http://127.0.0.1:9/hook",
                                            "secret": "s3cret"}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert _active(url)["revision"] == "r1"


def test_the_pullers_activations_are_credited_to_the_source_url(served: tuple[str, BundleServer, Path]) -> None:
    url, srv, tmp = served
    source = f"{srv.url}/bundles/payments.tar.gz"
    srv.publish(bundle(tmp, "r2"))
    _wait("r2 active", lambda: _active(url)["revision"] == "r2")
    events = httpx.get(f"{url}/v0/policies/payments/events", headers=AUTH).json()
    pulls = [e for e in events if e["type"] == "policy.activated"]
    assert [e["payload"]["revision"] for e in pulls] == ["r2", "r1"]
    for e in pulls:
        assert (e["actor"], e["credential"], e["payload"]["via"]) == (source, "bundle", "bundle_pull"), e
    assert pulls[0]["payload"]["from_seq"] == pulls[1]["seq"]
    revisions = httpx.get(f"{url}/v0/policies/payments/revisions", headers=AUTH).json()
    assert [(r["revision"], r["created_by"], r["activated_by"], r["activated_credential"]) for r in revisions] == [
        ("r1", source, source, "bundle"), ("r2", source, source, "bundle")]


@pytest.mark.parametrize(("url", "named"), [
    ("https://bundles.internal/bundles/p.tar.gz", "https://bundles.internal/bundles/p.tar.gz"),
    ("https://user:s3cret@bundles.internal:8443/p.tar.gz", "https://bundles.internal:8443/p.tar.gz"),
    ("https://s3.example/p.tar.gz?X-Amz-Signature=abc&X-Amz-Credential=k#frag", "https://s3.example/p.tar.gz"),
    ("http://[::1]:9000/p.tar.gz", "http://[::1]:9000/p.tar.gz")],
    ids=["plain", "user-info", "signed-url", "ipv6"])
def test_the_trail_names_a_source_without_the_credentials_its_url_may_carry(url: str, named: str) -> None:
    from kernel.core.policies import bundle_source

    assert bundle_source(url) == named
