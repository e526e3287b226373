"""The lease reaper on real stores (SQLite and PostgreSQL): expiry is the row's stored
`lease_expires_at`, set by the claim and moved on by every renewal (rebuno-v0 §6.4)."""

from __future__ import annotations

from datetime import timedelta

from kernel.core import executions
from kernel.core.agents import register_agent
from kernel.core.dispatch import claim_due, reap_expired_leases
from kernel.core.executions import create_execution
from kernel.core.kernel import Kernel
from kernel.domain import DispatchStatus, Lease


def _advance(k: Kernel, seconds: float) -> None:
    k.clock.advance(seconds)  # type: ignore[attr-defined]


def _start(k: Kernel, agent_id: str, n: int) -> list[tuple[str, str, int]]:
    ids = {create_execution(k, agent_id, {"i": i})[0].id for i in range(n)}
    claims = [c for c in claim_due(k, n + 10) if c.execution_id in ids]
    assert len(claims) == n
    return [(c.execution_id, c.dispatch_id, c.attempt) for c in claims]


def _status(k: Kernel, dispatch_id: str) -> DispatchStatus:
    with k.store.read() as tx:
        d = tx.get_dispatch(dispatch_id)
    assert d is not None
    return d.status


def test_expired_short_leases_are_reaped_behind_150_older_live_long_ones(kernel: Kernel) -> None:
    """More live in-flight rows than a reaper batch (100), all locked earlier than the expired ones:
    one pass must still return the expired ones (it used to read the 100 oldest and stop)."""
    register_agent(kernel, "long", "http://127.0.0.1:9/webhook", "s", 3600, keep_policy=True)
    register_agent(kernel, "short", "http://127.0.0.1:9/webhook", "s", 10, keep_policy=True)
    long = _start(kernel, "long", 150)
    _advance(kernel, 5)
    short = _start(kernel, "short", 3)
    _advance(kernel, 11)  # short: 11 s into a 10 s lease; long: 16 s into an hour
    assert reap_expired_leases(kernel) == 3
    assert {_status(kernel, d) for _, d, _ in short} == {DispatchStatus.PENDING}
    assert {_status(kernel, d) for _, d, _ in long} == {DispatchStatus.IN_FLIGHT}
    assert reap_expired_leases(kernel) == 0
    # redelivered with the next attempt, and the long leases still run out in their own time
    again = {c.dispatch_id: c.attempt for c in claim_due(kernel, 10)}
    assert again == {d: att + 1 for _, d, att in short}
    _advance(kernel, 3600)
    assert reap_expired_leases(kernel) == 150 + 3


def test_a_renewed_lease_expires_one_period_after_the_renewal(kernel: Kernel) -> None:
    register_agent(kernel, "short", "http://127.0.0.1:9/webhook", "s", 10, keep_policy=True)
    [(eid, did, att)] = _start(kernel, "short", 1)
    _advance(kernel, 8)
    executions.heartbeat(kernel, Lease("short", eid, did, att))  # RENEW_LEASE: expiry = now + 10 s
    _advance(kernel, 8)  # 16 s after the claim, 8 s after the heartbeat
    assert reap_expired_leases(kernel) == 0
    assert _status(kernel, did) == DispatchStatus.IN_FLIGHT
    _advance(kernel, 2.5)
    assert reap_expired_leases(kernel) == 1
    assert _status(kernel, did) == DispatchStatus.PENDING


def test_the_kernel_default_lease_applies_to_an_agent_without_one(kernel: Kernel) -> None:
    kernel.dispatch_lease_timeout = 1.5  # fractional, as REGENT_DISPATCH_LEASE_TIMEOUT may be
    register_agent(kernel, "dflt", "http://127.0.0.1:9/webhook", "s", None, keep_policy=True)
    [(eid, did, att)] = _start(kernel, "dflt", 1)
    _advance(kernel, 1)
    executions.heartbeat(kernel, Lease("dflt", eid, did, att))
    _advance(kernel, 1.4)
    assert reap_expired_leases(kernel) == 0
    _advance(kernel, timedelta(milliseconds=100).total_seconds())
    assert reap_expired_leases(kernel) == 1
