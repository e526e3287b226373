"""`regent policy check` warnings: an allow rule's unanchored regex, a numeric-looking regex, a dotted
argument key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.cli import main as cli_main
from kernel.policy.yaml import compile_yaml_bundle
from kernel.policy.yaml.lint import numeric_looking


def _lints(rules: str) -> list[tuple[str, int, str]]:
    bundle = compile_yaml_bundle("rules:\n" + rules, revision="r")
    return [(x.code, x.line, x.rule_id) for x in bundle.lints()]


def test_unanchored_allow_regex_is_reported_at_its_line() -> None:
    rules = ("  - id: allow-ls\n    when:\n      target: shell\n      arguments:\n"
             "        command: {regex: 'ls'}\n    then: {decision: allow}\n")
    assert _lints(rules) == [("unanchored-regex", 6, "allow-ls")]


def test_anchored_or_deny_regexes_are_not_reported() -> None:
    rules = ("  - {id: a, when: {target: s, arguments: {c: {regex: '^ls( |$)'}}}, then: {decision: allow}}\n"
             "  - {id: b, when: {target: s, arguments: {c: {regex: 'rm'}}}, then: {decision: deny}}\n"
             "  - {id: c, when: {target: s, arguments: {c: {not: {regex: 'rm'}}}}, then: {decision: allow}}\n")
    assert _lints(rules) == []


def test_numeric_looking_regex_is_reported() -> None:
    rules = ("  - id: big\n    when:\n      target: pay\n      arguments:\n"
             "        amount: {regex: '^[0-9]{4,}$'}\n    then: {decision: require_approval}\n")
    assert _lints(rules) == [("numeric-regex", 6, "big")]


@pytest.mark.parametrize(("regex", "numeric"), [
    ("^[0-9]{4,}$", True), (r"^\d+(\.\d+)?$", True), ("^(1[0-9]{3}|[2-9][0-9]{3})", True),
    (r"e\+0[6-9]", True), ("^ls", False), ("^v1", False), ("[;&|]", False),
])
def test_numeric_looking(regex: str, numeric: bool) -> None:
    assert numeric_looking(regex) is numeric


def test_shipped_bundles_have_no_warnings() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "bundles"
    for path in sorted(root.glob("*.yaml")):
        if path.name == "regent.yaml":
            continue
        lints = compile_yaml_bundle(path.read_text(), revision="r").lints()
        assert lints == [], path


@pytest.mark.parametrize(("then", "code"), [
    ("{decision: allow, rate_limit: {max_calls: 0, window: 1m}}", "rate-limit-never-limits"),
    ("{decision: allow, rate_limit: {max_calls: -5, window: 1m}}", "rate-limit-never-limits"),
    ("{decision: allow, rate_limit: {max_calls: 5}}", "rate-limit-never-limits"),
    ("{decision: allow, rate_limit: {max_calls: 9007199254740993, window: 1m}}", "rate-limit-past-redis"),
    ("{decision: deny, budget: {max_tokens: 100}}", "budget-ignored"),
    ("{decision: allow, budget: {max_tokens: 0}}", "budget-ignored"),
], ids=["max-calls-0", "max-calls-negative", "no-window", "past-2^53", "budget-on-deny", "budget-0"])
def test_a_limit_that_does_nothing_is_reported(then: str, code: str) -> None:
    # Rebuno accepts each of these silently (rebuno-v0 §3.1) and the limit never applies.
    rules = f"  - id: r\n    when: {{step_kind: tool_call}}\n    then: {then}\n"
    assert _lints(rules) == [(code, 2, "r")]


def test_limits_that_apply_are_not_reported() -> None:
    rules = ("  - id: r\n    when: {step_kind: tool_call}\n"
             "    then: {decision: allow, rate_limit: {max_calls: 30, window: 1m}, budget: {max_tokens: 1000}}\n"
             "  - id: d\n    when: {step_kind: llm_call}\n"
             "    then: {decision: deny, rate_limit: {max_calls: 9007199254740992, window: 1s}}\n")
    assert _lints(rules) == []


def test_a_dotted_argument_key_is_reported_because_it_never_matches_nested_arguments() -> None:
    # Upstream's executor example writes `arguments.owner`: a literal key, as in Rebuno.
    rules = ("  - id: own-repo\n    when:\n      target: github_create_issue\n      arguments:\n"
             "        arguments.owner: {equals: acme}\n    then: {decision: allow}\n")
    bundle = compile_yaml_bundle("rules:\n" + rules, revision="r")
    [lint] = bundle.lints()
    assert (lint.code, lint.line, lint.rule_id) == ("dotted-argument-key", 6, "own-repo")
    assert '{"arguments": {"owner": …}}' in lint.message
    from kernel.domain.decision import PolicyInput
    nested = PolicyInput(agent_id="a", kind="tool_call", target="github_create_issue",
                         args={"arguments": {"owner": "acme"}})
    assert bundle.evaluate(nested).rule_id == "default"  # what the lint warns about


def test_a_dotted_argument_key_fails_policy_check_under_strict(tmp_path: Path) -> None:
    bundle = tmp_path / "b.yaml"
    bundle.write_text("rules:\n  - id: r\n    when:\n      target: t\n      arguments:\n"
                      "        a.b: {equals: x}\n    then: {decision: allow}\n")
    assert cli_main(["policy", "check", str(bundle)]) == 0
    assert cli_main(["policy", "check", "--strict", str(bundle)]) == 1
