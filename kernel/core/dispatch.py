"""Delivering executions: claiming due dispatch rows, delivery verdicts, lease reaping (rebuno-v0 §6).

The primitives other use cases call inside their own transactions (enqueue, lease renewal, the
rate-limit park) are `kernel.core.leases`'s."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kernel.core import events as ev
from kernel.core.kernel import Kernel
from kernel.core.sessions import ended
from kernel.core.store_ports import Transaction
from kernel.domain import DispatchStatus, EventType, ExecutionStatus

log = logging.getLogger("kernel.dispatch")


@dataclass(frozen=True, slots=True)


class Claim:
    """A claimed delivery: what the webhook body carries."""

    dispatch_id: str
    execution_id: str
    agent_id: str
    attempt: int
    lease_timeout_seconds: float
    discarded: bool = False  # the execution was already terminal: nothing to deliver
    exhausted: bool = False  # attempt > max_attempts: the execution was failed instead


@dataclass(frozen=True, slots=True)
class Shares:
    """How many more rows each agent may be claimed for now: `room` by agent id (0: none, its
    share of deliveries is on the wire or its breaker is open), `default` for every other agent."""

    default: int
    room: Mapping[str, int] = field(default_factory=dict)

    def of(self, agent_id: str) -> int:
        return self.room.get(agent_id, self.default)


# Queries one claim may read: a row left out for an agent whose share filled up is replaced by
# the next query, which leaves that agent out in SQL.
MAX_DUE_QUERIES = 4


def claim_due(k: Kernel, limit: int) -> list[Claim]:
    """Claim up to `limit` due dispatches for this replica (clears occurrence counters).

    A row whose claim raises (a value the store holds but the claim cannot use) is skipped and
    reported, and moved back in the queue, so one bad row never stops delivery for the others.
    """
    return claim_ids(k, due_ids(k, limit))


def due_ids(k: Kernel, limit: int, shares: Shares | None = None, search: bool = True) -> list[str]:
    """Up to `limit` due dispatch ids, oldest due first, at most `shares.of(agent)` of each agent's
    (not claimed yet: `claim_ids` re-checks). Oldest first across agents alone would hand every
    slot to the agent with the longest queue: 200 rows of an agent whose webhook never answers
    delayed another agent's deliveries by 23 s (tests/core/test_dispatch_fairness.py).

    `search=False` reads only the oldest rows, without the query that reads past agents whose
    share is taken (it costs a lookup per due row; the dispatcher runs it at most once a poll)."""
    now = k.clock.now()
    shares = shares or Shares(default=limit)
    skip = {agent for agent, room in shares.room.items() if room <= 0}
    taken: Counter[str] = Counter()
    out: list[str] = []
    with k.store.transaction() as tx:
        for _ in range(MAX_DUE_QUERIES if search else 1):
            want = limit - len(out)
            if want <= 0:
                break
            rows = tx.due_by_agent(now, want, skip if search else (), out)
            for did, agent in rows:
                if taken[agent] < shares.of(agent):
                    out.append(did)
                    taken[agent] += 1
                if taken[agent] >= shares.of(agent):
                    skip.add(agent)
            if len(rows) < want:
                break  # every due row was read
    return out


def claim_ids(k: Kernel, ids: list[str]) -> list[Claim]:
    """Claim these dispatches, each under its execution's lock; a row another caller claimed first
    (or that is no longer due) is left out, and a row whose claim raises is skipped (see below)."""
    claims = []
    for did in ids:
        try:
            c = claim_one(k, did)
        except Exception as exc:
            skip_poisoned(k, did, exc)
            continue
        if c is not None:
            claims.append(c)
    return claims


def skip_poisoned(k: Kernel, dispatch_id: str, exc: Exception) -> None:
    """A claim of `dispatch_id` raised: log it, count it, and push the row's next attempt back by
    REGENT_DISPATCH_MAX_DELAY (its attempt counts, so a row that keeps failing is exhausted like an
    unanswered webhook). Raises when the row cannot be touched either: that is the store failing,
    and the dispatch loop's own backoff applies."""
    now = k.clock.now()
    detail = f"claim failed: {type(exc).__name__}"
    with k.store.transaction() as tx:
        row = tx.defer_dispatch(dispatch_id, now, k.dispatch_max_delay)
    if row is None:
        return
    execution_id, attempt, max_attempts = row
    k.dispatch_claims_skipped += 1
    log.error("claiming dispatch %s (execution %s, attempt %d) failed; skipped", dispatch_id, execution_id,
              attempt, exc_info=exc)
    try:
        with k.store.transaction(lock=execution_id) as tx:
            if attempt >= max_attempts:
                _fail_exhausted(tx, execution_id, now)
            else:
                tx.append(execution_id, now, [ev.dispatch(EventType.DISPATCH_FAILED, dispatch_id, execution_id,
                                                          "failed", attempt, error=detail)])
    except Exception:
        # The audit event (or the exhaustion) could not be written either; the row stays deferred.
        log.exception("recording the skipped claim of dispatch %s failed", dispatch_id)


def claim_one(k: Kernel, dispatch_id: str) -> Claim | None:
    c = _claim_one(k, dispatch_id)
    if c is not None and c.exhausted:
        _ended(k, c.execution_id)
    return c


def _ended(k: Kernel, execution_id: str) -> None:
    with k.store.read() as tx:
        e = tx.get_execution(execution_id)
    if e is not None and e.status.is_terminal:
        ended(k, e)


def _claim_one(k: Kernel, dispatch_id: str) -> Claim | None:
    now = k.clock.now()
    with k.store.read() as tx:
        d0 = tx.get_dispatch(dispatch_id)
    if d0 is None:
        return None
    with k.store.transaction(lock=d0.execution_id) as tx:
        d = tx.get_dispatch(dispatch_id)
        if d is None or d.status not in (DispatchStatus.PENDING, DispatchStatus.FAILED) or d.next_attempt_at > now:
            return None
        ex = tx.get_execution(d.execution_id)
        agent = tx.get_agent(ex.agent_id) if ex else None
        if ex is None or agent is None:
            return None
        attempt = d.attempt + 1
        tx.clear_counters(d.id)
        # The lease period is fixed here, the one the webhook body announces; renewals (RENEW_LEASE)
        # move the expiry on by the same period, read from the row.
        lease = k.lease_seconds(agent.lease_timeout_seconds)
        tx.set_dispatch(d.id, now, status=DispatchStatus.IN_FLIGHT, attempt=attempt,
                        locked_by=k.replica_id, locked_at=now,
                        lease_ms=round(lease * 1000), lease_expires_at=now + timedelta(seconds=lease))
        if ex.status.is_terminal:
            tx.set_dispatch(d.id, now, status=DispatchStatus.EXHAUSTED, locked_by=None, locked_at=None)
            tx.append(ex.id, now, [ev.dispatch(EventType.DISPATCH_DISCARDED, d.id, ex.id, "exhausted", attempt)])
            return Claim(d.id, ex.id, ex.agent_id, attempt, lease, discarded=True)
        if attempt > d.max_attempts:
            _fail_exhausted(tx, ex.id, now)
            return Claim(d.id, ex.id, ex.agent_id, attempt, lease, exhausted=True)
        return Claim(d.id, ex.id, ex.agent_id, attempt, lease)


def _fail_exhausted(tx: Transaction, execution_id: str, now: datetime) -> None:
    tx.retire_dispatches(execution_id, now)
    tx.append(
        execution_id,
        now,
        [ev.execution(EventType.EXECUTION_FAILED, execution_id, ExecutionStatus.FAILED, reason="dispatch_exhausted")],
        status=ExecutionStatus.FAILED,
        failure_reason="dispatch_exhausted",
    )


def record_delivery(k: Kernel, claim: Claim, ok: bool, detail: str | None = None,
                    breaker_open_seconds: float | None = None) -> None:
    """The webhook answered (2xx → acked) or not (→ failed, backoff or exhaustion).
    `breaker_open_seconds`: this failure paused deliveries to the agent for so long (noted on
    the dispatch.failed event)."""
    if _record_delivery(k, claim, ok, detail, breaker_open_seconds):
        _ended(k, claim.execution_id)


def _record_delivery(k: Kernel, claim: Claim, ok: bool, detail: str | None, paused: float | None) -> bool:
    """True when the execution failed (its attempts ran out)."""
    now = k.clock.now()
    with k.store.transaction(lock=claim.execution_id) as tx:
        ex = tx.get_execution(claim.execution_id)
        if ex is None:
            return False
        if ok:
            tx.append(ex.id, now, [ev.dispatch(EventType.DISPATCH_ACKED, claim.dispatch_id, ex.id, "acked", claim.attempt)])
            return False
        tx.append(ex.id, now, [ev.dispatch(EventType.DISPATCH_FAILED, claim.dispatch_id, ex.id, "failed",
                                           claim.attempt, error=detail, breaker_open_seconds=paused)])
        d = tx.get_dispatch(claim.dispatch_id)
        if d is None or d.status != DispatchStatus.IN_FLIGHT or d.attempt != claim.attempt or ex.status.is_terminal:
            return False  # the delivery lost its row meanwhile (blocked, parked, finished): verdict dropped
        if claim.attempt >= d.max_attempts:
            _fail_exhausted(tx, ex.id, now)
            return True
        tx.set_dispatch_if_live(claim.dispatch_id, claim.attempt, now, status=DispatchStatus.FAILED,
                                next_attempt_at=now + k.backoff(claim.attempt), locked_by=None, locked_at=None)
        return False


def reap_expired_leases(k: Kernel, batch: int = 100) -> int:
    """Return in-flight rows whose lease ran out to the queue: same id, same attempt, no event.

    Only expired rows are read (by the `lease_expires_at` the claim and each renewal store), so
    every batch is all expired: many live long leases cannot starve expired short ones.
    """
    now = k.clock.now()
    total = 0
    for _ in range(1000):  # bounded: at most 100 000 rows a pass
        with k.store.read() as tx:
            expired = tx.expired_leases(now, k.dispatch_lease_timeout, batch)
        if not expired:
            break
        reaped = 0
        for did, _locked, _period in expired:
            with k.store.read() as tx:
                d0 = tx.get_dispatch(did)
            if d0 is None:
                continue
            with k.store.transaction(lock=d0.execution_id) as tx:
                d = tx.get_dispatch(did)
                if d is None or d.status != DispatchStatus.IN_FLIGHT or d.locked_at != d0.locked_at:
                    continue
                tx.set_dispatch(did, now, status=DispatchStatus.PENDING, locked_by=None, locked_at=None,
                                next_attempt_at=now)
                reaped += 1
        total += reaped
        if len(expired) < batch or reaped == 0:
            break
    return total
