"""The output contract, without workers: entrypoint value → Decision."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.domain.decision import (
    ApprovalConfig,
    BudgetSpec,
    PolicyInput,
    PolicyKind,
    RateLimitSpec,
    Verdict,
)
from kernel.policy.rego import decision_from_output, input_document


def decide(
    value: Any, *, defined: bool = True, kind: str = "tool_call", default: Verdict = Verdict.DENY
):
    return decision_from_output(
        value,
        defined=defined,
        kind=kind,
        default_action=default,
        revision="rev-1",
        entrypoint="shell/decision",
    )


ALLOW = {"decision": "allow", "rule_id": "a"}
DENY = {"decision": "deny", "rule_id": "d", "reason": "no"}
APPROVE = {"decision": "require_approval", "rule_id": "r"}

CONTRACT = [
    ("object allow", ALLOW, Verdict.ALLOW, "a"),
    ("object deny keeps reason", DENY, Verdict.DENY, "d"),
    ("object require_approval", APPROVE, Verdict.REQUIRE_APPROVAL, "r"),
    ("set of one", [ALLOW], Verdict.ALLOW, "a"),
    ("deny overrides allow", [ALLOW, DENY], Verdict.DENY, "d"),
    ("deny overrides approval", [APPROVE, DENY, ALLOW], Verdict.DENY, "d"),
    ("approval overrides allow", [ALLOW, APPROVE], Verdict.REQUIRE_APPROVAL, "r"),
    (
        "tie broken by rule_id",
        [{"decision": "deny", "rule_id": "zz"}, {"decision": "deny", "rule_id": "bb"}],
        Verdict.DENY,
        "bb",
    ),
    (
        "allow tie broken by rule_id",
        [{"decision": "allow", "rule_id": "b2"}, {"decision": "allow", "rule_id": "b1"}],
        Verdict.ALLOW,
        "b1",
    ),
]


@pytest.mark.parametrize(
    ("value", "verdict", "rule_id"), [c[1:] for c in CONTRACT], ids=[c[0] for c in CONTRACT]
)
def test_output_maps_to_decision(value: Any, verdict: Verdict, rule_id: str) -> None:
    d = decide(value)
    assert (d.verdict, d.rule_id) == (verdict, rule_id)
    assert d.policy_kind == PolicyKind.REGO
    assert d.policy_revision == "rev-1"


def test_winner_options_apply_when_combined() -> None:
    winner = {
        "decision": "require_approval",
        "rule_id": "r",
        "approval_config": {"approvers": ["ops"], "timeout": "15m", "message": "check"},
    }
    loser = {"decision": "allow", "rule_id": "a", "rate_limit": {"max_calls": 5, "window": "1m"}}
    d = decide([loser, winner])
    assert d.approval == ApprovalConfig(("ops",), 900.0, "check")
    assert d.rate_limit is None


def test_options_flow_into_decision() -> None:
    d = decide(
        {
            "decision": "allow",
            "rule_id": "a",
            "reason": "ok",
            "approval_config": {"approvers": ["x", "y"], "timeout": "1h30m"},
            "rate_limit": {
                "max_calls": 10,
                "window": "1m",
                "per_what": "agent",
                "max_wait": "500ms",
                "on_limiter_error": "deny",
            },
            "budget": {"max_tokens": 10000, "on_exceed": "require_approval"},
        }
    )
    assert d.reason == "ok"
    assert d.approval == ApprovalConfig(("x", "y"), 5400.0, "")
    assert d.rate_limit == RateLimitSpec(10, 60.0, "agent", 0.5, "deny")
    assert d.budget == BudgetSpec(10000, "require_approval")


def test_option_defaults_match_yaml_language() -> None:
    d = decide(
        {
            "decision": "allow",
            "rule_id": "a",
            "rate_limit": {"max_calls": 3, "window": "10s"},
            "budget": {"max_tokens": 5},
        }
    )
    assert d.rate_limit == RateLimitSpec(3, 10.0, "execution", 0.0, "allow")
    assert d.budget == BudgetSpec(5, "deny")


def test_session_scoped_limits_and_budgets_are_read() -> None:
    d = decide({"decision": "allow", "rule_id": "a", "rate_limit": {"max_calls": 3, "window": "1m", "per_what": "session"},
                "budget": {"max_tokens": 50, "scope": "session"}})
    assert d.rate_limit == RateLimitSpec(3, 60.0, "session", 0.0, "allow")
    assert d.budget == BudgetSpec(50, "deny", "session")


def test_integral_float_counts_as_integer() -> None:
    assert decide(
        {"decision": "allow", "rule_id": "a", "budget": {"max_tokens": 100.0}}
    ).budget == BudgetSpec(100)


DEFAULTS = [
    (
        "undefined deny",
        None,
        False,
        "tool_call",
        Verdict.DENY,
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    (
        "undefined allow",
        None,
        False,
        "tool_call",
        Verdict.ALLOW,
        Verdict.ALLOW,
        "default",
        "default allow",
    ),
    (
        "empty set deny",
        [],
        True,
        "tool_call",
        Verdict.DENY,
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    (
        "empty set allow",
        [],
        True,
        "llm_call",
        Verdict.ALLOW,
        Verdict.ALLOW,
        "default",
        "default allow",
    ),
    (
        "empty object",
        {},
        True,
        "tool_call",
        Verdict.DENY,
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    ("local undefined", None, False, "local", Verdict.DENY, Verdict.ALLOW, "local", "local step"),
    ("local empty", [], True, "local", Verdict.DENY, Verdict.ALLOW, "local", "local step"),
]


@pytest.mark.parametrize(
    ("value", "defined", "kind", "default", "verdict", "rule_id", "reason"),
    [c[1:] for c in DEFAULTS],
    ids=[c[0] for c in DEFAULTS],
)
def test_undefined_or_empty_falls_to_default(
    value: Any,
    defined: bool,
    kind: str,
    default: Verdict,
    verdict: Verdict,
    rule_id: str,
    reason: str,
) -> None:
    d = decide(value, defined=defined, kind=kind, default=default)
    assert (d.verdict, d.rule_id, d.reason) == (verdict, rule_id, reason)
    assert d.policy_kind == PolicyKind.REGO


def test_local_step_decided_by_entrypoint_keeps_rule() -> None:
    d = decide({"decision": "deny", "rule_id": "no-charge"}, kind="local")
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "no-charge")


MALFORMED = [
    ("string", "allow", "is a string"),
    ("number", 1, "is a number"),
    ("boolean", True, "is a boolean"),
    ("null", None, "is null"),
    ("missing decision", {"rule_id": "a"}, 'missing "decision"'),
    ("unknown decision", {"decision": "maybe", "rule_id": "a"}, "unknown decision 'maybe'"),
    ("decision case matters", {"decision": "Allow", "rule_id": "a"}, "unknown decision"),
    ("judge block on allow", {"decision": "allow", "rule_id": "a", "judge": {}}, '"judge" is only allowed with decision "judge"'),
    ("judge threshold", {"decision": "judge", "rule_id": "a", "judge": {"threshold": 2}}, "judge.threshold must be a number between 0 and 1"),
    ("judge fallback", {"decision": "judge", "rule_id": "a", "judge": {"fallback": "maybe"}}, "judge.fallback must be one of"),
    ("judge unknown field", {"decision": "judge", "rule_id": "a", "judge": {"model": "m"}}, "judge: unknown field 'model'"),
    ("decision not a string", {"decision": True, "rule_id": "a"}, "unknown decision"),
    ("missing rule_id", {"decision": "allow"}, 'missing "rule_id"'),
    ("empty rule_id", {"decision": "allow", "rule_id": ""}, "rule_id must be a non-empty string"),
    (
        "rule_id not a string",
        {"decision": "allow", "rule_id": 7},
        "rule_id must be a non-empty string",
    ),
    ("reserved rule_id", {"decision": "allow", "rule_id": "eval-error"}, "reserved"),
    ("reason not a string", {**ALLOW, "reason": 3}, "reason must be a string"),
    ("unknown field", {**ALLOW, "approval": {}}, "unknown field 'approval'"),
    ("set element not object", [ALLOW, "deny"], "element 1 is a string"),
    ("set element malformed", [ALLOW, {"decision": "deny"}], 'element 1: missing "rule_id"'),
    (
        "approval_config not object",
        {**ALLOW, "approval_config": []},
        "approval_config must be an object",
    ),
    (
        "approval unknown field",
        {**ALLOW, "approval_config": {"who": []}},
        "approval_config: unknown field 'who'",
    ),
    (
        "approvers not strings",
        {**ALLOW, "approval_config": {"approvers": [1]}},
        "approvers must be a list of strings",
    ),
    (
        "approval message type",
        {**ALLOW, "approval_config": {"message": 1}},
        "message must be a string",
    ),
    (
        "timeout integer",
        {**ALLOW, "approval_config": {"timeout": 300}},
        "timeout must be a duration string",
    ),
    (
        "timeout bad syntax",
        {**ALLOW, "approval_config": {"timeout": "5 minutes"}},
        "approval_config.timeout",
    ),
    ("timeout negative", {**ALLOW, "approval_config": {"timeout": "-5m"}}, "negative duration"),
    (
        "max_calls string",
        {**ALLOW, "rate_limit": {"max_calls": "5", "window": "1m"}},
        "max_calls must be an integer",
    ),
    (
        "max_calls bool",
        {**ALLOW, "rate_limit": {"max_calls": True, "window": "1m"}},
        "max_calls must be an integer",
    ),
    (
        "max_calls fraction",
        {**ALLOW, "rate_limit": {"max_calls": 1.5, "window": "1m"}},
        "max_calls must be an integer",
    ),
    (
        "window integer",
        {**ALLOW, "rate_limit": {"max_calls": 5, "window": 60}},
        "window must be a duration string",
    ),
    (
        "per_what unknown",
        {**ALLOW, "rate_limit": {"max_calls": 5, "window": "1m", "per_what": "user"}},
        "per_what must be one of",
    ),
    (
        "on_limiter_error unknown",
        {**ALLOW, "rate_limit": {"on_limiter_error": "retry"}},
        "on_limiter_error must be one of",
    ),
    (
        "rate_limit unknown field",
        {**ALLOW, "rate_limit": {"calls": 5}},
        "rate_limit: unknown field 'calls'",
    ),
    ("budget not object", {**ALLOW, "budget": 5}, "budget must be an object"),
    (
        "max_tokens string",
        {**ALLOW, "budget": {"max_tokens": "5"}},
        "max_tokens must be an integer",
    ),
    (
        "on_exceed unknown",
        {**ALLOW, "budget": {"max_tokens": 5, "on_exceed": "allow"}},
        "on_exceed must be one of",
    ),
]


@pytest.mark.parametrize(
    ("value", "reason_part"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_output_denies_eval_error(value: Any, reason_part: str) -> None:
    d = decide(value)
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "eval-error")
    assert reason_part in d.reason
    assert d.reason.startswith("shell/decision")
    assert d.policy_kind == PolicyKind.REGO and d.policy_revision == "rev-1"


def test_input_document_has_the_spec_shape() -> None:
    inp = PolicyInput(
        agent_id="shell",
        kind="tool_call",
        target="shell_exec",
        args={"command": "ls -la"},
        idempotency="safe_to_retry",
        execution={
            "id": "0192",
            "agent_id": "shell",
            "input": {"x": 1},
            "created_at": "2026-12-02T18:00:00Z",
        },
        usage={"input_tokens": 812, "output_tokens": 96},
        now="2026-12-02T19:00:00Z",
        session="chat-42",
    )
    assert input_document(inp) == {
        "agent_id": "shell",
        "kind": "tool_call",
        "target": "shell_exec",
        "args": {"command": "ls -la"},
        "idempotency": "safe_to_retry",
        "execution": {
            "id": "0192",
            "agent_id": "shell",
            "input": {"x": 1},
            "created_at": "2026-12-02T18:00:00+00:00",  # the times rego-cpp parses (docs/policy.md "Time")
        },
        "usage": {"input_tokens": 812, "output_tokens": 96},
        "now": "2026-12-02T19:00:00+00:00",
        "session": "chat-42",
    }
