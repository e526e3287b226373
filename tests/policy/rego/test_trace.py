"""Rego traces, line coverage and runtime-error locations, computed in the workers from the
instrumented twin of a bundle (kernel/policy/rego/instrument.py)."""

from __future__ import annotations

import json

import pytest

from kernel.domain.decision import Verdict
from kernel.errors import ValidationError
from kernel.policy.rego import RegoEngine, compile_rego_bundle, input_document
from kernel.policy.rego.rules import read_rules
from kernel.policy.rego.trace import explain_rego, traced_evaluate, traced_evaluate_many

from .conftest import bundle_of, step

OVERRIDE = """
decision contains {"decision": "allow", "rule_id": "allow-shell"} if {
	input.target == "shell_exec"
}

decision contains {"decision": "deny", "rule_id": "deny-rm"} if {
	input.target == "shell_exec"
	startswith(input.args.command, "rm")
}

decision contains {"decision": "allow", "rule_id": "allow-never"} if {
	input.target == "shell_exec"
	input.args.command == "never"
}
"""


def test_explain_shows_an_allow_overridden_by_deny(engine: RegoEngine) -> None:
    doc = explain_rego(engine, bundle_of(OVERRIDE), step(command="rm -rf /"))
    assert doc["decision"]["rule_id"] == "deny-rm"
    members = {m["rule_id"]: m for m in doc["decision_set"]}
    assert set(members) == {"allow-shell", "deny-rm"}
    assert members["deny-rm"]["selected"] is True
    assert members["allow-shell"]["selected"] is False
    assert members["allow-shell"]["overridden_by"] == {"rule_id": "deny-rm", "decision": "deny",
                                                       "why": "deny-overrides"}
    json.dumps(doc)  # plain JSON throughout


def test_explain_traces_each_body_expression_with_its_line(engine: RegoEngine) -> None:
    doc = explain_rego(engine, bundle_of(OVERRIDE), step(command="ls"))
    rows = {row["rule_id"]: row for row in doc["trace"]}
    never = rows["allow-never"]
    assert never["file"] == "shell/policy.rego" and never["line"] == 14
    assert [(e["line"], e["result"]) for e in never["expressions"]] == [(15, "held"), (16, "undefined")]
    assert never["result"] == "undefined"
    assert rows["allow-shell"]["result"] == "held"
    assert [e["result"] for e in rows["deny-rm"]["expressions"]] == ["held", "undefined"]


def test_explain_includes_the_rate_limit(engine: RegoEngine) -> None:
    policy = ('decision := {"decision": "allow", "rule_id": "llm", '
              '"rate_limit": {"max_calls": 5, "window": "1m"}} if { input.kind == "llm_call" }\n')
    doc = explain_rego(engine, bundle_of(policy), step(kind="llm_call", target="gpt"))
    assert doc["decision"]["rate_limit"] == {"max_calls": 5, "window_seconds": 60.0, "per_what": "execution",
                                             "max_wait_seconds": 0.0, "on_limiter_error": "allow"}


HELPER = """
risky if {
	input.args.command == "curl"
}

risky if {
	input.args.mode == "network"
	input.args.port > 1024
}

decision := {"decision": "deny", "rule_id": "risky"} if {
	risky
}
"""


def test_an_untested_helper_branch_shows_as_not_covered_with_its_lines(engine: RegoEngine) -> None:
    bundle = bundle_of(HELPER)
    traced = traced_evaluate(engine, bundle, input_document(step(command="curl")))
    assert traced.decision.rule_id == "risky"
    report = bundle.instrumented[1].line_coverage(traced.hits).report()
    file = report["files"]["shell/policy.rego"]
    # The second `risky` (line 9): its head never held and `input.args.port > 1024` never ran.
    assert file["not_covered"] == [{"start": {"row": 9}, "end": {"row": 9}}, {"start": {"row": 11}, "end": {"row": 11}}]
    assert file["covered"] == [{"start": {"row": 5}, "end": {"row": 6}}, {"start": {"row": 10}, "end": {"row": 10}},
                               {"start": {"row": 14}, "end": {"row": 15}}]  # line 10 ran (and was false)
    assert (file["covered_lines"], file["not_covered_lines"], file["coverage"]) == (5, 2, 71.43)
    assert 0 < report["coverage"] < 100


CONFLICT = """
mode := "read" if {
	input.args.command == "ls"
}

mode := "write" if {
	input.target == "shell_exec"
}

decision := {"decision": "allow", "rule_id": "read"} if {
	mode == "read"
}
"""


def test_an_eval_conflict_names_its_file_lines_and_rule(engine: RegoEngine) -> None:
    d = engine.evaluate(bundle_of(CONFLICT), step(command="ls"))
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "eval-error")
    assert "complete rules must not produce multiple outputs" in d.reason
    assert "shell/policy.rego:5, shell/policy.rego:9 (rule mode" in d.reason


def test_a_division_by_zero_under_strict_names_the_expression(engine: RegoEngine) -> None:
    policy = ('decision := {"decision": "allow", "rule_id": "ratio"} if {\n'
              '\tinput.target == "shell_exec"\n\t10 / input.args.n > 1\n}\n')
    lenient = compile_rego_bundle(bundle_of(policy), engine=engine)
    assert engine.evaluate(lenient, step(n=0)).rule_id == "default"  # undefined, as in OPA
    strict = compile_rego_bundle(bundle_of(policy), engine=engine, strict=True)
    d = engine.evaluate(strict, step(n=0))
    assert d.rule_id == "eval-error"
    assert "divide by zero at shell/policy.rego:6 (rule decision: 10 / input.args.n > 1)" in d.reason
    assert engine.evaluate(strict, step(n=2)).rule_id == "ratio"


def test_sprintf_q_is_refused_at_load_with_file_line(engine: RegoEngine) -> None:
    policy = ('decision := {"decision": "deny", "rule_id": "d",\n'
              '\t"reason": sprintf("command %q refused", [input.args.command])} if { true }\n')
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(bundle_of(policy), engine=engine)
    assert "shell/policy.rego:5:20: sprintf verb %q is not supported by rego-cpp" in info.value.message


def test_strict_refuses_unused_imports(engine: RegoEngine) -> None:
    policy = ("package shell\nimport rego.v1\nimport data.lib.unused\n\n"
              'decision := {"decision": "allow", "rule_id": "a"} if { input.target == "ls" }\n')
    compile_rego_bundle(bundle_of(policy), engine=engine)  # fine without --strict
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(bundle_of(policy), engine=engine, strict=True)
    assert "shell/policy.rego:3:1: import data.lib.unused is never used (strict)" in info.value.message


def test_deprecated_builtins_are_named_as_such(engine: RegoEngine) -> None:
    policy = 'decision := {"decision": "allow", "rule_id": "a"} if { re_match("^ls", input.args.command) }\n'
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(bundle_of(policy), engine=engine)
    assert "builtin re_match is deprecated in OPA and rego-cpp does not have it; use regex.match" in info.value.message


def test_rule_reader_splits_bodies_and_else_chains() -> None:
    source = ("package p\nimport rego.v1\n\nx := 1 if {\n\ta == 1; b == 2\n\tc in {\n\t\t1, 2,\n\t}\n}"
              " else := 2 if d\n\nf(y) := y + 1\n\nz contains v if some v in [1]\n")
    rules = read_rules(source).rules
    assert [(r.name, r.kind, r.line, r.chain) for r in rules] == [
        ("x", "complete", 4, ()), ("x", "complete", 9, (0,)), ("f", "function", 11, ()), ("z", "multi", 13, ())]
    assert [(e.line, e.end_line, e.text) for e in rules[0].body] == [
        (5, 5, "a == 1"), (5, 5, "b == 2"), (6, 8, "c in {\n\t\t1, 2,\n\t}")]
    assert [e.text for e in rules[1].body] == ["d"]


def test_shipped_bundles_instrument_and_agree_with_the_plain_evaluation(engine: RegoEngine) -> None:
    from pathlib import Path

    from kernel.policy.rego import load_rego_bundle

    root = Path(__file__).resolve().parents[3] / "bundles"
    for twin in sorted(root.glob("*-rego")):
        bundle = compile_rego_bundle(load_rego_bundle(twin), engine=engine)
        inp = step(target="transfer_funds", amount=5000, command="ls")
        traced = traced_evaluate(engine, bundle, input_document(inp))
        assert traced.error == "", twin
        assert traced.decision == engine.evaluate(bundle, inp), twin
        assert bundle.instrumented[1].skipped == {}, twin


def test_traced_evaluation_in_batches_answers_what_one_at_a_time_does(engine: RegoEngine) -> None:
    """The --coverage run's batches (one worker call for many cases) against one call per case,
    an evaluation error among them (a conflict: the plain path decides and locates it)."""
    bundle = bundle_of(OVERRIDE + 'mode := "a" if input.args.command == "x"\nmode := "b" if input.args.command == "x"\n'
                       'decision contains {"decision": "deny", "rule_id": "m"} if mode == "c"\n')
    docs = [input_document(step(command=c)) for c in ("ls", "rm -rf /", "never", "x", "ls")]
    one = [traced_evaluate(engine, bundle, d) for d in docs]
    many = traced_evaluate_many(engine, bundle, docs)
    assert [(t.decision, t.hits, t.error) for t in many] == [(t.decision, t.hits, t.error) for t in one]
    assert many[3].decision.rule_id == "eval-error" and many[0].hits
