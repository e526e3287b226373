"""Pure domain types: dataclasses and StrEnums. Imports only the standard library."""

from kernel.domain.agent import Agent
from kernel.domain.approval import Approval, ApprovalStatus
from kernel.domain.audit import Credential, DecisionAt, DecisionOutcome, DecisionRecord
from kernel.domain.decision import (
    ApprovalConfig,
    BudgetSpec,
    Decision,
    PolicyInput,
    RateLimitSpec,
    Verdict,
    resolve_judge,
)
from kernel.domain.dispatch import Dispatch, DispatchStatus
from kernel.domain.event import Event, EventType
from kernel.domain.execution import Execution, ExecutionStatus
from kernel.domain.judge import JudgeAnswer, JudgeSpec
from kernel.domain.lease import Lease
from kernel.domain.limit import LimitOutcome
from kernel.domain.policy_event import PolicyEventType
from kernel.domain.step import Answer, Idempotency, Step, StepKind, StepStatus
from kernel.domain.tool_pin import ToolApproval, ToolPin, ToolState

__all__ = [
    "Agent",
    "Answer",
    "Approval",
    "ApprovalConfig",
    "ApprovalStatus",
    "BudgetSpec",
    "Credential",
    "Decision",
    "DecisionAt",
    "DecisionOutcome",
    "DecisionRecord",
    "Dispatch",
    "DispatchStatus",
    "Event",
    "EventType",
    "Execution",
    "ExecutionStatus",
    "Idempotency",
    "JudgeAnswer",
    "JudgeSpec",
    "Lease",
    "LimitOutcome",
    "PolicyEventType",
    "PolicyInput",
    "RateLimitSpec",
    "Step",
    "StepKind",
    "StepStatus",
    "ToolApproval",
    "ToolPin",
    "ToolState",
    "Verdict",
    "resolve_judge",
]
