"""`Tx`'s queries on dispatches, approvals and API keys: the dispatch loop, the lease reaper, the
sweeps and the admin API. Mixed into `Tx` (sql.py), which supplies `store`, `conn` and `w`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, insert, select, update

from kernel.domain import Approval, Dispatch, DispatchStatus
from kernel.store import codec
from kernel.store import tables as t
from kernel.store.dialect import TxPart
from kernel.store.statements import GET_DISPATCH, PENDING_APPROVAL, RENEW_LEASE


class DispatchQueries(TxPart):
    # -- dispatches -----------------------------------------------------------------------
    def insert_dispatch(self, d: Dispatch) -> None:
        self.w.execute(
            insert(t.dispatches).values(
                id=d.id,
                execution_id=d.execution_id,
                status=d.status.value,
                attempt=d.attempt,
                max_attempts=d.max_attempts,
                next_attempt_at=d.next_attempt_at,
                locked_by=None,
                locked_at=None,
                created_at=d.created_at,
                updated_at=d.updated_at,
            )
        )

    def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        r = GET_DISPATCH.first(self.conn, {"id": dispatch_id})
        return codec.to_dispatch(r) if r else None

    def renew_lease(self, dispatch_id: str, execution_id: str, attempt: int, now: datetime) -> bool:
        """Renew the lease of a live attempt (in_flight, same attempt). False when fenced.

        locked_at becomes `now` and lease_expires_at `now` + the period the claim stored on the row
        (lease_ms), computed in the UPDATE, so callers need not know the agent's lease."""
        params = {"id": dispatch_id, "execution_id": execution_id, "attempt": attempt, "now": now}
        return RENEW_LEASE.run(self.w, params) > 0

    def retire_dispatches(self, execution_id: str, now: datetime) -> None:
        c = t.dispatches.c
        self.w.execute(
            update(t.dispatches)
            .where(c.execution_id == execution_id, c.status != DispatchStatus.EXHAUSTED.value)
            .values(status=DispatchStatus.EXHAUSTED.value, locked_by=None, locked_at=None, updated_at=now)
        )

    def set_dispatch(self, dispatch_id: str, now: datetime, **values: Any) -> None:
        if "status" in values:
            values["status"] = str(values["status"])
        self.w.execute(
            update(t.dispatches).where(t.dispatches.c.id == dispatch_id).values(updated_at=now, **values)
        )

    def set_dispatch_if_live(self, dispatch_id: str, attempt: int, now: datetime, **values: Any) -> bool:
        """Apply a delivery verdict only if the row is still in flight with this attempt."""
        if "status" in values:
            values["status"] = str(values["status"])
        c = t.dispatches.c
        res = self.w.execute(
            update(t.dispatches)
            .where(c.id == dispatch_id, c.attempt == attempt, c.status == DispatchStatus.IN_FLIGHT.value)
            .values(updated_at=now, **values)
        )
        return res.rowcount > 0

    def count_undelivered(self) -> int:
        """Dispatches queued and not yet handed to their agent (pending, or failed awaiting a retry)."""
        c = t.dispatches.c
        q = select(func.count()).select_from(t.dispatches).where(
            c.status.in_((DispatchStatus.PENDING.value, DispatchStatus.FAILED.value)))
        return int(self.conn.execute(q).scalar_one())

    def defer_dispatch(self, dispatch_id: str, now: datetime, delay: float) -> tuple[str, int, int] | None:
        """Count a failed claim on a row and move its next attempt `delay` seconds on, reading only
        plain columns (the row may hold what the codec cannot decode): (execution id, attempt,
        max attempts), or None when the row is gone."""
        c = t.dispatches.c
        self.w.execute(
            update(t.dispatches).where(c.id == dispatch_id).values(
                status=DispatchStatus.FAILED.value, attempt=c.attempt + 1, locked_by=None, locked_at=None,
                next_attempt_at=now + timedelta(seconds=delay), updated_at=now,
            )
        )
        row = self.w.execute(select(c.execution_id, c.attempt, c.max_attempts).where(c.id == dispatch_id)).first()
        return (str(row[0]), int(row[1]), int(row[2])) if row else None

    def clear_counters(self, dispatch_id: str) -> None:
        self.w.execute(
            delete(t.dispatch_step_counters).where(t.dispatch_step_counters.c.dispatch_id == dispatch_id)
        )

    def due_dispatch_ids(self, now: datetime, limit: int) -> list[str]:
        return self.store.due_dispatch_ids(self.conn, now, limit)

    def due_by_agent(self, now: datetime, limit: int, skip_agents: Collection[str] = (),
                     skip_ids: Collection[str] = ()) -> list[tuple[str, str]]:
        """(dispatch id, agent id) of up to `limit` due rows, oldest due first, without the
        agents in `skip_agents` and the rows in `skip_ids`."""
        return self.store.due_by_agent(self.conn, now, limit, skip_agents, skip_ids)

    def expired_leases(self, now: datetime, default_lease_seconds: float, limit: int) -> list[tuple[str, str, float]]:
        """Up to `limit` in-flight rows whose lease has run out, soonest expiry first, as
        (id, str(locked_at), lease period). Expiry is decided in SQL on the stored `lease_expires_at`
        (index ix_dispatches_lease), so live long leases never crowd out expired short ones. A row
        in flight without an expiry (not written by a claim) counts as expired, and comes first."""
        c = t.dispatches.c
        cols = (c.id, c.locked_at, c.lease_ms)
        in_flight = c.status == DispatchStatus.IN_FLIGHT.value
        rows = list(self.conn.execute(
            select(*cols).where(in_flight, c.lease_expires_at.is_(None)).order_by(c.id).limit(limit)
        ).all())
        if len(rows) < limit:
            rows += self.conn.execute(
                select(*cols)
                .where(in_flight, c.lease_expires_at <= now)
                .order_by(c.lease_expires_at)
                .limit(limit - len(rows))
            ).all()
        return [(did, str(locked_at), ms / 1000 if ms else default_lease_seconds) for did, locked_at, ms in rows]

    # -- signed requests seen (the shared replay guard) ----------------------------------
    def record_request_signature(self, agent_id: str, timestamp: int, signature: str, expires_at: datetime) -> bool:
        """Whether this (agent, timestamp, signature) is new; recorded if so."""
        values = {"agent_id": agent_id, "timestamp": timestamp, "signature": signature, "expires_at": expires_at}
        return self.store.insert_new(self.w, t.request_signatures, values, key=("agent_id", "timestamp", "signature"))

    def purge_request_signatures(self, before: datetime) -> int:
        c = t.request_signatures.c
        return int(self.w.execute(delete(t.request_signatures).where(c.expires_at < before)).rowcount or 0)

    # -- approvals ------------------------------------------------------------------------
    def insert_approval(self, a: Approval) -> None:
        self.w.execute(
            insert(t.approvals).values(
                id=a.id,
                step_id=a.step_id,
                execution_id=a.execution_id,
                status=a.status.value,
                approvers=codec.dumps_or_none(a.approvers or None),
                message=a.message,
                timeout_at=a.timeout_at,
                created_at=a.created_at,
                agent_id=a.agent_id,
                kind=a.kind,
                target=a.target,
                rule_id=a.rule_id,
                reason=a.reason,
                policy_hash=a.policy_hash,
                policy_kind=a.policy_kind,
                policy_revision=a.policy_revision,
            )
        )

    @staticmethod
    def _approvals_with_args() -> Any:
        """Approval rows with their step's recorded arguments (`step_args`)."""
        return select(t.approvals, t.steps.c.args.label("step_args")).select_from(
            t.approvals.outerjoin(
                t.steps,
                and_(t.steps.c.execution_id == t.approvals.c.execution_id, t.steps.c.step_id == t.approvals.c.step_id),
            )
        )

    def get_approval(self, approval_id: str) -> Approval | None:
        r = self.conn.execute(self._approvals_with_args().where(t.approvals.c.id == approval_id)).first()
        return codec.to_approval(r) if r else None

    def pending_approval_for_step(self, step_id: str) -> Approval | None:
        r = PENDING_APPROVAL.first(self.conn, {"step_id": step_id})
        return codec.to_approval(r) if r else None

    def list_approvals(
        self, status: str | None, execution_id: str | None = None, agent_id: str | None = None,
        limit: int | None = None,
    ) -> list[Approval]:
        """Oldest first; `limit` bounds what is read (each row carries its step's args)."""
        q = self._approvals_with_args()
        if status is not None:
            q = q.where(t.approvals.c.status == status)
        if execution_id is not None:
            q = q.where(t.approvals.c.execution_id == execution_id)
        if agent_id is not None:
            q = q.where(t.approvals.c.agent_id == agent_id)
        q = q.order_by(t.approvals.c.created_at, t.approvals.c.id)
        if limit is not None:
            q = q.limit(limit)
        return [codec.to_approval(r) for r in self.conn.execute(q).all()]

    def pending_approvals_page(
        self, filters: dict[str, str], *, newest_first: bool, beyond: tuple[datetime, str] | None,
        backwards: bool, limit: int,
    ) -> list[Approval]:
        """Pending approvals in (created_at, id) order, oldest first unless `newest_first`, equal
        to `filters` (agent_id, target, rule_id): the `limit` rows after the key `beyond` in that
        order, or, `backwards`, the `limit` rows before it (still returned in page order). Reads
        the (status, created_at) index, so a page costs the same at any backlog."""
        c = t.approvals.c
        q = self._approvals_with_args().where(c.status == "pending")
        for name, value in filters.items():
            q = q.where(c[name] == value)
        ascending = newest_first == backwards  # the direction this query walks the index
        if beyond is not None:
            at, aid = beyond
            later = (c.created_at > at) | ((c.created_at == at) & (c.id > aid))
            earlier = (c.created_at < at) | ((c.created_at == at) & (c.id < aid))
            q = q.where(later if ascending else earlier)
        order = (c.created_at, c.id) if ascending else (c.created_at.desc(), c.id.desc())
        rows = [codec.to_approval(r) for r in self.conn.execute(q.order_by(*order).limit(limit)).all()]
        return rows[::-1] if backwards else rows

    def count_pending_approvals(self, filters: dict[str, str]) -> dict[str, int]:
        """Pending approvals per agent ("" for one asked before approvals recorded their agent)."""
        c = t.approvals.c
        q = select(c.agent_id, func.count()).where(c.status == "pending")
        for name, value in filters.items():
            q = q.where(c[name] == value)
        return {str(agent or ""): int(n) for agent, n in self.conn.execute(q.group_by(c.agent_id)).all()}

    def approvals_stamp(self) -> tuple[int, str, str]:
        """What changes whenever the inbox would: (pending count, newest pending id, latest
        decision time), for the inbox's poll."""
        c = t.approvals.c
        n, newest = self.conn.execute(select(func.count(), func.max(c.id)).where(c.status == "pending")).one()
        decided = self.conn.execute(select(func.max(c.decided_at))).scalar()
        return int(n), str(newest or ""), decided.isoformat() if decided is not None else ""

    def recently_decided_approvals(self, limit: int) -> list[Approval]:
        """Granted, denied or expired approvals, the latest decided first."""
        q = (
            select(t.approvals)
            .where(t.approvals.c.status != "pending", t.approvals.c.decided_at.is_not(None))
            .order_by(t.approvals.c.decided_at.desc(), t.approvals.c.id.desc())
            .limit(limit)
        )
        return [codec.to_approval(r) for r in self.conn.execute(q).all()]

    def expired_approvals(self, now: datetime, limit: int) -> list[Approval]:
        q = (
            select(t.approvals)
            .where(t.approvals.c.status == "pending", t.approvals.c.timeout_at <= now)
            .order_by(t.approvals.c.timeout_at)
            .limit(limit)
        )
        return [codec.to_approval(r) for r in self.conn.execute(q).all()]

    def set_approval(self, approval_id: str, **values: Any) -> None:
        if "status" in values:
            values["status"] = str(values["status"])
        self.w.execute(update(t.approvals).where(t.approvals.c.id == approval_id).values(**values))

    # -- api keys -------------------------------------------------------------------------
    def insert_api_key(self, values: dict[str, Any]) -> None:
        self.w.execute(insert(t.api_keys).values(**values))

    def get_api_key(self, key_id: str) -> Any:
        return self.conn.execute(select(t.api_keys).where(t.api_keys.c.id == key_id)).first()

    def list_api_keys(self) -> list[Any]:
        return list(self.conn.execute(select(t.api_keys).order_by(t.api_keys.c.created_at, t.api_keys.c.id)).all())

    def set_api_key(self, key_id: str, **values: Any) -> None:
        self.w.execute(update(t.api_keys).where(t.api_keys.c.id == key_id).values(**values))


__all__ = ["DispatchQueries"]
