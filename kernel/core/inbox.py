"""The approvals inbox read model: pending approvals with what the approver decides on (the
agent, the step's kind, target and args), oldest first, and the latest resolved ones."""

from __future__ import annotations

from dataclasses import dataclass

from kernel.core.kernel import Kernel
from kernel.domain import Approval, Step

INBOX_LIMIT = 200


@dataclass(frozen=True, slots=True)
class InboxItem:
    approval: Approval
    agent_id: str
    step: Step | None  # None if the step row is gone (retention)


@dataclass(frozen=True, slots=True)
class Inbox:
    pending: list[InboxItem]
    more_pending: bool  # over INBOX_LIMIT pending; the oldest are shown
    resolved: list[InboxItem]


def inbox(k: Kernel, resolved_limit: int = 50) -> Inbox:
    with k.store.read() as tx:
        # One more than is shown, to know there are more: a runaway agent's thousands of pending
        # approvals (each with its step's args) are not all read to draw the oldest 200.
        pending = tx.list_approvals("pending", limit=INBOX_LIMIT + 1)
        resolved = tx.recently_decided_approvals(resolved_limit)
        shown = pending[:INBOX_LIMIT]
        agents: dict[str, str] = {}
        items: list[list[InboxItem]] = [[], []]
        for i, rows in enumerate((shown, resolved)):
            for a in rows:
                if a.agent_id:
                    agents[a.execution_id] = a.agent_id
                elif a.execution_id not in agents:  # an approval asked before it recorded its agent
                    e = tx.get_execution(a.execution_id)
                    agents[a.execution_id] = e.agent_id if e is not None else ""
                items[i].append(InboxItem(a, agents[a.execution_id], tx.get_step(a.step_id)))
    return Inbox(items[0], len(pending) > INBOX_LIMIT, items[1])
