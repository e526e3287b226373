"""Durations and counts are bounded at the API (issue 18 §0): out-of-range values are a 400
`validation_error` naming the bounds, and nothing is stored. Over real HTTP, on both stores."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from kernel.core.dispatch import claim_due
from kernel.core.kernel import MAX_LEASE_SECONDS, Kernel
from tests.conftest import Running
from tests.support import ServerThread

AGENT = {"id": "x", "webhook_url": "http://127.0.0.1:1/w", "secret": "s"}


@pytest.mark.parametrize(
    "lease",
    ["4611686018427387904", "2147483647", str(MAX_LEASE_SECONDS + 1), "-1", str(-(2**70)), "1" + "0" * 5000],
    ids=["2^62", "int32-max", "over-a-day", "negative", "very-negative", "5000-digits"],
)
def test_out_of_range_lease_is_400_and_registers_nothing(server: ServerThread, lease: str) -> None:
    body = '{"id":"x","webhook_url":"http://127.0.0.1:1/w","secret":"s","lease_timeout_seconds":' + lease + "}"
    r = httpx.post(f"{server.url}/v0/agents", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "validation_error", r.text
    if not lease.startswith("-") and len(lease) < 100:
        assert f"0-{MAX_LEASE_SECONDS}" in r.json()["message"]
    assert httpx.get(f"{server.url}/v0/agents/x").status_code == 404


@pytest.mark.parametrize(("lease", "stored"), [(0, None), (9, None), (10, 10), (MAX_LEASE_SECONDS, MAX_LEASE_SECONDS)],
                         ids=["zero", "below-minimum", "minimum", "maximum"])
def test_lease_within_bounds_is_accepted(server: ServerThread, lease: int, stored: int | None) -> None:
    r = httpx.post(f"{server.url}/v0/agents", json={**AGENT, "lease_timeout_seconds": lease})
    assert r.status_code == 201
    assert r.json().get("lease_timeout_seconds") == stored


def test_skipped_claims_are_counted_in_metrics(server: ServerThread, running: Running, kernel: Kernel) -> None:
    eid, _, _ = running.start()  # claimed: in flight
    with kernel.store.engine.begin() as c:
        c.execute(text("UPDATE dispatches SET status = 'pending', next_attempt_at = created_at"))
        c.execute(text("UPDATE executions SET status = 'bogus' WHERE id = :id"), {"id": eid})
    assert claim_due(kernel, 10) == []
    r = httpx.get(f"{server.url}/metrics")
    samples = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
    assert samples["regent_dispatch_claims_skipped_total"] == 1.0
