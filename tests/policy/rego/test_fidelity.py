"""What a Rego bundle sees is what the step held: numbers digit for digit, a clock rego-cpp's time
built-ins read, and an explain that never calls an undefined value held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.cli import main as cli_main
from kernel.domain.decision import PolicyInput, Verdict
from kernel.policy.rego import RegoEngine, input_document
from kernel.policy.rego.timelint import rego_cpp_parses_time, time_literal_lints
from kernel.policy.rego.trace import explain_rego

from .conftest import bundle_of, step

ECHO = 'decision := {"decision": "allow", "rule_id": "echo", "reason": json.marshal(input.args)} if { true }\n'
ABOVE = """
decision := {"decision": "require_approval", "rule_id": "above"} if { input.args.amount > 1000 }
decision := {"decision": "allow", "rule_id": "at-most"} if { input.args.amount <= 1000 }
"""


@pytest.mark.parametrize(("raw", "rule_id"), [
    ("1000.0000004", "above"),       # regoInputFloat kept six decimals: it was 1000.0 and allowed
    ("1000.00000001", "above"),
    ("1000.000000000001", "above"),
    ("1000", "at-most"),
    ("999.9999996", "at-most"),
    ("12345678901234567890", "above"),  # beyond int64: was eval-error
    ("1e300", "above"),
    ("-12345678901234567890", "at-most"),
])
def test_rego_compares_input_numbers_as_written(engine: RegoEngine, raw: str, rule_id: str) -> None:
    decision = engine.evaluate(bundle_of(ABOVE), step(amount=json.loads(raw)))
    assert decision.rule_id == rule_id


def test_a_tiny_decimal_is_not_zero(engine: RegoEngine) -> None:
    policy = 'decision := {"decision": "allow", "rule_id": "positive"} if { input.args.x > 0 }\n'
    assert engine.evaluate(bundle_of(policy), step(x=0.0000004)).rule_id == "positive"


def test_input_numbers_reach_rego_digit_for_digit(engine: RegoEngine) -> None:
    args = {"f": 0.1, "g": 1000.0000004, "big": 123456789012345678901234567890, "neg": -4e-7, "s": 'a"b\x00é'}
    decision = engine.evaluate(bundle_of(ECHO), step(**args))
    assert json.loads(decision.reason) == args


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 5e-324, -1e-310])
def test_a_number_outside_float64s_normal_range_denies_eval_error_with_one_reason(
        engine: RegoEngine, value: float) -> None:
    from kernel.policy.yaml import compile_yaml_bundle

    yaml_bundle = compile_yaml_bundle("rules:\n  - {id: any, when: {target: shell_exec}, then: {decision: allow}}\n",
                                      revision="y")
    inp = step(amount=value)
    rego = engine.evaluate(bundle_of(ABOVE), inp)
    yaml = yaml_bundle.evaluate(inp)
    assert (rego.verdict, rego.rule_id) == (yaml.verdict, yaml.rule_id) == (Verdict.DENY, "eval-error")
    assert rego.reason == yaml.reason and "outside the range policies compare" in rego.reason


TIME_POLICY = """
now_ns := time.parse_rfc3339_ns(input.now)

decision := {"decision": "allow", "rule_id": "office-hours"} if {
	[hour, _, _] := time.clock(now_ns)
	hour >= 9
	hour < 20
}
"""


@pytest.mark.parametrize("now", ["2026-12-02T19:00:00Z", "2026-12-02T19:00:00.123456Z", "2026-12-02t19:00:00z",
                                 "2026-12-02T19:00:00+00:00", "2026-12-02T20:30:00+01:30"])
def test_time_rules_hold_on_the_kernels_clock(engine: RegoEngine, now: str) -> None:
    inp = PolicyInput(agent_id="a", kind="tool_call", target="t", args={}, now=now)
    assert engine.evaluate(bundle_of(TIME_POLICY), inp).rule_id == "office-hours"


def test_input_now_is_given_with_a_numeric_offset() -> None:
    inp = PolicyInput(agent_id="a", kind="tool_call", target="t", args={}, now="2026-12-02T19:00:00.000001Z",
                      execution={"id": "e", "created_at": "2026-12-02T18:00:00Z"})
    doc = input_document(inp)
    assert doc["now"] == "2026-12-02T19:00:00.000001+00:00"
    assert doc["execution"] == {"id": "e", "created_at": "2026-12-02T18:00:00+00:00"}
    assert inp.execution["created_at"] == "2026-12-02T18:00:00Z"  # the step's own record is untouched


def test_an_executions_age_is_computable_in_rego(engine: RegoEngine) -> None:
    policy = """
age_ns := time.parse_rfc3339_ns(input.now) - time.parse_rfc3339_ns(input.execution.created_at)
decision := {"decision": "allow", "rule_id": "young"} if { age_ns < time.parse_duration_ns("5m") }
"""
    assert engine.evaluate(bundle_of(policy), step()).rule_id == "young"  # created 18:59, now 19:00


def test_explain_does_not_call_a_rule_held_when_its_value_is_undefined(engine: RegoEngine) -> None:
    policy = """
cutoff := time.parse_rfc3339_ns("2026-01-01T00:00:00Z")

decision := {"decision": "allow", "rule_id": "after-cutoff"} if {
	time.parse_rfc3339_ns(input.now) > cutoff
}
"""
    doc = explain_rego(engine, bundle_of(policy), step(), rules=("cutoff",))
    rows = {row["rule"]: row for row in doc["trace"]}
    assert rows["cutoff"]["result"] == "undefined"
    assert rows["cutoff"]["why"] == "its value is undefined (the body held)"
    assert rows["decision"]["result"] == "undefined"


@pytest.mark.parametrize(("text", "parses"), [
    ("2026-01-01T00:00:00Z", False), ("2026-01-01T00:00:00.5z", False), ("2026-01-01t00:00:00+00:00", False),
    ("2026-01-01T00:00:00+00:00", True), ("2026-01-01T00:00:00.123456789-05:30", True),
    ("2026-02-30T00:00:00+00:00", False), ("3000-01-01T00:00:00+00:00", False), ("1900-01-01T00:00:00+00:00", True),
])
def test_the_time_lint_knows_what_rego_cpp_parses(engine: RegoEngine, text: str, parses: bool) -> None:
    assert rego_cpp_parses_time(text) is parses
    policy = f'decision := {{"decision": "allow", "rule_id": "t"}} if {{ time.parse_rfc3339_ns("{text}") }}\n'
    assert (engine.evaluate(bundle_of(policy), step()).rule_id == "t") is parses  # the oracle: rego-cpp


def test_policy_check_warns_about_a_literal_time_and_fails_under_strict(tmp_path: Path) -> None:
    b = tmp_path / "b"
    b.mkdir()
    (b / ".manifest").write_text('{"revision": "t1", "roots": ["t"]}')
    (b / "policy.rego").write_text('package t\n\nimport rego.v1\n\n# time.parse_rfc3339_ns("2026-01-01T00:00:00Z")\n'
                                   'cutoff := time.parse_rfc3339_ns("2026-01-01T00:00:00Z")\n'
                                   'decision := {"decision": "allow", "rule_id": "x"} if { cutoff > 0 }\n')
    [lint] = time_literal_lints({"policy.rego": (b / "policy.rego").read_text()})
    assert (lint.line, lint.col) == (6, 33) and '"2026-01-01T00:00:00+00:00"' in lint.message
    assert cli_main(["policy", "check", str(b)]) == 0
    assert cli_main(["policy", "check", "--strict", str(b)]) == 1


@pytest.mark.parametrize("now", ["2026-12-02T19:00:00Z", "'2026-12-02T19:00:00Z'", "2026-12-02T20:30:00+01:30",
                                 "2026-12-02 19:00:00"])
def test_a_case_files_context_now_reaches_rego_time_rules(engine: RegoEngine, now: str) -> None:
    from kernel.policy.cases import parse_cases, run_cases
    from kernel.policy.resolver import RegoCompiled

    [case] = parse_cases(f"cases:\n  - {{name: t, target: t, context: {{now: {now}}}, expect: allow}}\n")
    assert isinstance(case.context["now"], str)  # an unquoted YAML timestamp is a datetime until here
    report = run_cases(RegoCompiled(bundle_of(TIME_POLICY), engine), [case])
    assert [(r.decision, r.rule_id) for r in report.results] == [("allow", "office-hours")]


@pytest.mark.parametrize("now", ["2026-12-02", "yesterday", "2026-12-02T19:00:00"])
def test_a_case_files_context_now_must_be_a_time_with_a_zone(now: str) -> None:
    from kernel.errors import ValidationError
    from kernel.policy.cases import parse_cases

    with pytest.raises(ValidationError, match=r"case 1: .*context\.now"):
        parse_cases(f"cases:\n  - {{name: t, target: t, context: {{now: '{now}' }}}}\n".replace("'2026-12-02'", "2026-12-02"))
