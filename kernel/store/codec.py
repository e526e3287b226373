"""JSON text <-> values for the store's TEXT columns (the text is `kernel.jsontext`'s), and row -> domain conversion."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from kernel.domain import (
    Agent,
    Approval,
    ApprovalStatus,
    Dispatch,
    DispatchStatus,
    Event,
    Execution,
    ExecutionStatus,
    Step,
    StepStatus,
)
from kernel.domain.approval import APPROVAL_ARGS_MAX_CHARS
from kernel.jsontext import dumps as dumps
from kernel.jsontext import dumps_or_none as dumps_or_none
from kernel.jsontext import loads as loads

_MISS = object()

# Stored status text -> member: a dict lookup where calling the enum costs a microsecond; a text
# not in the dict (none is) still goes to the enum, which refuses it as before.
_EXECUTION_STATUS = {s.value: s for s in ExecutionStatus}
_STEP_STATUS = {s.value: s for s in StepStatus}
_DISPATCH_STATUS = {s.value: s for s in DispatchStatus}


class DecodedInputs:
    """Execution inputs already decoded, by execution id, for the step path.

    An execution's input never changes once it is created, and the step path reads it on every
    submit and outcome: decoding a 1 MB input each time cost 4 ms of CPU per round trip. Inputs of
    at least `min_chars` are kept (smaller ones decode in microseconds), up to `max_chars` of JSON
    text in all, least recently used evicted first. The values are shared: callers must not
    mutate them.
    """

    def __init__(self, min_chars: int = 4096, max_chars: int = 64 * 1024 * 1024):
        self.min_chars = min_chars
        self.max_chars = max_chars
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def decode(self, execution_id: str, text: str | None) -> Any:
        if text is None or len(text) < self.min_chars or len(text) > self.max_chars:
            return loads(text)
        with self._lock:
            hit = self._items.get(execution_id, _MISS)
            if hit is not _MISS:
                self._items.move_to_end(execution_id)
                return hit[0]  # type: ignore[index]
        value = json.loads(text)
        with self._lock:
            if execution_id not in self._items:
                self._items[execution_id] = (value, len(text))
                self._chars += len(text)
                while self._chars > self.max_chars:
                    _, (_, n) = self._items.popitem(last=False)
                    self._chars -= n
        return value

    def __len__(self) -> int:
        return len(self._items)


def to_agent(r: Any) -> Agent:
    return Agent(
        id=r.id,
        webhook_url=r.webhook_url,
        secret=r.secret,
        registered_at=r.registered_at,
        lease_timeout_seconds=r.lease_timeout_seconds,
        description=r.description,
        input_schema=loads(r.input_schema),
        output_schema=loads(r.output_schema),
    )


def to_execution(r: Any, inputs: DecodedInputs | None = None) -> Execution:
    """A row with every column of the executions table (every caller selects the table whole)."""
    output, state, restoration = r.output, r.state, r.restoration
    return Execution(
        r.id, r.agent_id, inputs.decode(r.id, r.input) if inputs is not None else loads(r.input),
        _EXECUTION_STATUS.get(r.status) or ExecutionStatus(r.status), r.created_at, r.updated_at,
        None if output is None else json.loads(output), r.failure_reason, r.deadline_at, r.idempotency_key,
        r.usage_input or 0, r.usage_output or 0, r.created_by, r.session, r.parent_execution_id,
        r.spawned_step_id, r.previous_execution_id, None if state is None else json.loads(state), r.forked_from,
        r.fork_seq or 0, r.fork_bundle_id, bool(r.suspended), None if restoration is None else json.loads(restoration),
    )


def to_step(r: Any) -> Step:
    return Step(
        step_id=r.step_id,
        execution_id=r.execution_id,
        kind=r.kind,
        target=r.target,
        args_hash=r.args_hash,
        occurrence=r.occurrence,
        status=_STEP_STATUS.get(r.status) or StepStatus(r.status),
        idempotency=r.idempotency,
        args=loads(r.args),
        result=loads(r.result),
        error=loads(r.error),
        started_at=r.started_at,
        completed_at=r.completed_at,
        usage_input=r.usage_input,
        usage_output=r.usage_output,
    )


def to_event(r: Any) -> Event:
    return Event(
        execution_id=r.execution_id,
        event_seq=r.event_seq,
        type=r.type,
        payload=json.loads(r.payload),
        occurred_at=r.occurred_at,
    )


def to_approval(r: Any) -> Approval:
    return Approval(
        id=r.id,
        step_id=r.step_id,
        execution_id=r.execution_id,
        status=ApprovalStatus(r.status),
        approvers=loads(r.approvers) or [],
        message=r.message,
        timeout_at=r.timeout_at,
        created_at=r.created_at,
        decided_by=r.decided_by,
        asserted_by=r.asserted_by,
        decided_at=r.decided_at,
        rationale=r.rationale,
        agent_id=getattr(r, "agent_id", None),
        kind=getattr(r, "kind", None),
        target=getattr(r, "target", None),
        rule_id=getattr(r, "rule_id", None),
        reason=getattr(r, "reason", None),
        policy_hash=getattr(r, "policy_hash", None),
        policy_kind=getattr(r, "policy_kind", None),
        policy_revision=getattr(r, "policy_revision", None),
        credential=getattr(r, "credential", None),
        **_capped_args(getattr(r, "step_args", None)),
    )


def _capped_args(text: str | None) -> dict[str, Any]:
    """The step's recorded arguments for an approval record: decoded, or past the cap the prefix
    of their canonical text with the marker set."""
    if text is None:
        return {}
    if len(text) > APPROVAL_ARGS_MAX_CHARS:
        return {"args": text[:APPROVAL_ARGS_MAX_CHARS], "args_truncated": True, "args_chars": len(text)}
    return {"args": loads(text), "args_chars": len(text)}


def to_dispatch(r: Any) -> Dispatch:
    return Dispatch(
        id=r.id,
        execution_id=r.execution_id,
        status=_DISPATCH_STATUS.get(r.status) or DispatchStatus(r.status),
        attempt=r.attempt,
        max_attempts=r.max_attempts,
        next_attempt_at=r.next_attempt_at,
        created_at=r.created_at,
        updated_at=r.updated_at,
        locked_by=r.locked_by,
        locked_at=r.locked_at,
    )
