"""Helpers shared by the rate-limit core tests and the replica worker."""

from __future__ import annotations

import json
from typing import Any

from kernel.core import steps
from kernel.domain import Decision, PolicyInput
from kernel.identity import args_hash, canonical_json


def req(target: str = "search", args: Any = None, kind: str = "tool_call") -> steps.StepRequest:
    text = canonical_json(json.dumps(args)) if args is not None else "null"
    return steps.StepRequest(kind=kind, target=target, args=json.loads(text), args_text=text,
                             args_hash=args_hash(text))


class FixedPolicy:
    """Every step gets the same decision (the engines are tested elsewhere)."""

    def __init__(self, decision: Decision):
        self.decision = decision
        self.inputs: list[PolicyInput] = []

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: PolicyInput, tx: Any = None, bundle_id: Any = None) -> Decision:
        self.inputs.append(inp)
        return self.decision
