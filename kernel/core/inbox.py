"""The approvals inbox read model: pending approvals with what the approver decides on (the
agent, the step's kind, target and args), keyset-paged both ways and filtered, counts per agent,
why a visitor may not decide a row, and the latest resolved ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from kernel.core import cursor
from kernel.core.approvals import Principal, _refuse_self_approval
from kernel.core.kernel import Kernel
from kernel.core.store_ports import Transaction
from kernel.domain import Approval, ApprovalStatus, Step
from kernel.errors import Forbidden, invalid
from kernel.text import check_text

PAGE_SIZE = 50
# "I can decide" is judged row by row (approvers, who created the execution); one page reads at
# most this many pending approvals looking for rows the visitor may decide, then offers to go on.
MINE_SCAN = 2000
_SCAN_BATCH = 200
FILTERS = ("agent_id", "target", "rule_id")


@dataclass(frozen=True, slots=True)
class InboxItem:
    approval: Approval
    agent_id: str
    step: Step | None  # None if the step row is gone (retention)
    refusal: str | None = None  # why this visitor may not decide it (None: they may)


@dataclass(frozen=True, slots=True)
class InboxQuery:
    agent_id: str | None = None
    target: str | None = None
    rule_id: str | None = None
    mine: bool = False  # only the approvals this visitor may decide
    newest_first: bool = False
    after: str | None = None  # the next page: rows after this cursor in the page order
    before: str | None = None  # the previous page: rows before it
    limit: int = PAGE_SIZE

    def filters(self) -> dict[str, str]:
        return {name: check_text(value, name) for name in FILTERS if (value := getattr(self, name))}


@dataclass(frozen=True, slots=True)
class Inbox:
    pending: list[InboxItem]
    per_agent: dict[str, int]  # every pending approval, per agent (filters aside)
    matching: int  # pending approvals matching the filters ("I can decide" aside)
    prev_cursor: str | None  # None on the first page
    next_cursor: str | None  # None on the last page
    scanned_out: bool = False  # "I can decide" stopped after MINE_SCAN rows; next_cursor goes on
    resolved: list[InboxItem] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.per_agent.values())


def encode_cursor(a: Approval) -> str:
    return cursor.encode_cursor(a.created_at, a.id)


def decode_cursor(text: str) -> tuple[datetime, str]:
    return cursor.decode_cursor(text, "an inbox cursor")


def refusal(k: Kernel, tx: Transaction, a: Approval, principal: Principal) -> str | None:
    """Why the core would refuse this visitor's grant or deny (core.approvals.decide_approval's
    rules, read ahead so the page shows the reason instead of a button), or None."""
    if not principal.has("approvals:write"):
        return "read only: your key lacks the scope approvals:write"
    if a.status != ApprovalStatus.PENDING:
        return f"already {a.status.value}"
    if principal.name is None:
        if not k.bootstrap_approvals:
            return "sign in with a named API key to decide (REGENT_BOOTSTRAP_APPROVALS=false)"
        return None  # the bootstrap token names the decider in the form
    if a.approvers and principal.name not in a.approvers:
        return f"only {', '.join(a.approvers)} may decide this; you are {principal.name}"
    e = tx.get_execution(a.execution_id)
    if e is None or e.status.is_terminal:
        return "its execution has ended"
    if principal.key_id is not None:
        try:
            _refuse_self_approval(tx, e, principal)
        except Forbidden as exc:
            return exc.message.removeprefix("forbidden: ").replace("this key created", "your key created")
    return None


def _items(k: Kernel, tx: Transaction, rows: list[Approval], principal: Principal | None) -> list[InboxItem]:
    agents: dict[str, str] = {}
    out = []
    for a in rows:
        if a.agent_id:
            agents[a.execution_id] = a.agent_id
        elif a.execution_id not in agents:  # an approval asked before it recorded its agent
            e = tx.get_execution(a.execution_id)
            agents[a.execution_id] = e.agent_id if e is not None else ""
        why = refusal(k, tx, a, principal) if principal is not None else None
        out.append(InboxItem(a, agents[a.execution_id], tx.get_step(a.execution_id, a.step_id), why))
    return out


def _walk(k: Kernel, tx: Transaction, q: InboxQuery, principal: Principal, cursor: str | None, backwards: bool,
          want: int) -> tuple[list[Approval], bool, bool]:
    """Up to `want` rows from `cursor` in one direction: (rows in page order, whether more lie
    beyond them that way, whether the "I can decide" scan stopped at MINE_SCAN)."""
    filters = q.filters()
    beyond = decode_cursor(cursor) if cursor else None
    if not q.mine:
        rows = tx.pending_approvals_page(filters, newest_first=q.newest_first, beyond=beyond, backwards=backwards,
                                         limit=want + 1)
        more = len(rows) > want
        rows = (rows[1:] if backwards else rows[:want]) if more else rows
        return rows, more, False
    found: list[Approval] = []
    scanned = 0
    while scanned < MINE_SCAN:
        batch = tx.pending_approvals_page(filters, newest_first=q.newest_first, beyond=beyond, backwards=backwards,
                                          limit=_SCAN_BATCH)
        walk = batch[::-1] if backwards else batch
        for a in walk:
            scanned += 1
            beyond = (a.created_at, a.id)
            if refusal(k, tx, a, principal) is None:
                found.append(a)
                if len(found) > want:
                    kept = found[:want]
                    return (kept[::-1] if backwards else kept), True, False
        if len(batch) < _SCAN_BATCH:
            return (found[::-1] if backwards else found), False, False
    return (found[::-1] if backwards else found), True, True


def inbox(k: Kernel, q: InboxQuery | None = None, principal: Principal | None = None,
          resolved_limit: int = 50) -> Inbox:
    """One page of the inbox. `principal` is the visitor: each row says why they may not decide
    it, and `q.mine` keeps only the rows they may."""
    q = q or InboxQuery()
    who = principal or Principal(admin=True)
    if not 1 <= q.limit <= 500:
        raise invalid("limit must be 1-500")
    with k.store.read() as tx:
        if q.before:
            rows, earlier, scanned_out = _walk(k, tx, q, who, q.before, True, q.limit)
            later = True
            if not rows:  # nothing before it any more (decided meanwhile): the first page
                rows, later, scanned_out = _walk(k, tx, q, who, None, False, q.limit)
                earlier = False
        else:
            rows, later, scanned_out = _walk(k, tx, q, who, q.after, False, q.limit)
            earlier = q.after is not None and bool(rows) and bool(
                _walk(k, tx, q, who, encode_cursor(rows[0]), True, 1)[0])
        per_agent = tx.count_pending_approvals({})
        filters = q.filters()
        matching = sum(tx.count_pending_approvals(filters).values()) if filters else sum(per_agent.values())
        pending = _items(k, tx, rows, principal)
        resolved = _items(k, tx, tx.recently_decided_approvals(resolved_limit), None) if resolved_limit else []
    return Inbox(pending, per_agent, matching, encode_cursor(rows[0]) if earlier and rows else None,
                 encode_cursor(rows[-1]) if later and rows else None, scanned_out, resolved)


def approval_item(k: Kernel, approval_id: str, principal: Principal) -> InboxItem | None:
    """One approval as the inbox shows it (any status), with why the visitor may not decide it."""
    with k.store.read() as tx:
        a = tx.get_approval(approval_id)
        return _items(k, tx, [a], principal)[0] if a is not None else None


def stamp(k: Kernel) -> str:
    """Changes whenever an approval is asked or answered: what the inbox page polls."""
    with k.store.read() as tx:
        n, newest, decided = tx.approvals_stamp()
    return f"{n}.{newest}.{decided}"
