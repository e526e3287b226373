"""OPA v0 syntax at the load gate, `regent policy fmt --v0-v1` on Gatekeeper-shaped policies, the
load-time idiom rewrites, and failing Rego tests explained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernel.cli import main
from kernel.errors import ValidationError
from kernel.policy.rego import RegoEngine, compile_rego_bundle, parse_rego_bundle
from kernel.policy.rego.idioms import rewrite_idioms
from kernel.policy.rego.v0_syntax import (
    operator_line_problems,
    rewrite_v0_v1,
    set_head_problems,
    v1_problems,
)
from kernel.policy.testing.rego_tests import run_rego_test_file

from .conftest import step

SHELL_V0_HELPER = """package shell
import rego.v1

blocked[cmd] {
	cmd := input.args.command
	startswith(cmd, "rm -rf")
}

decision := {"decision": "deny", "rule_id": "blocked", "reason": "destructive"} if {
	some c in blocked
	c != ""
}

default decision := {"decision": "allow", "rule_id": "default"}
"""

# Shaped like the Gatekeeper library's templates (written for these tests): a partial set of
# violation objects, helper functions in v0 form, a partial object and a bare set member.
REQUIRED_LABELS_V0 = """package k8srequiredlabels

violation[{"msg": msg, "details": {"missing_labels": missing}}] {
	provided := {label | input.review.object.metadata.labels[label]}
	required := {label | label := input.parameters.labels[_].key}
	missing := required - provided
	count(missing) > 0
	msg := sprintf("you must provide labels: %v", [missing])
}

violation[{"msg": msg}] {
	value := input.review.object.metadata.labels[key]
	expected := input.parameters.labels[_]
	expected.key == key
	not matches(value, expected)
	msg := sprintf("label <%v: %v> does not match <%v>", [key, value, expected.allowedRegex])
}

matches(value, expected) {
	expected.allowedRegex == ""
}

matches(value, expected) = true {
	regex.match(expected.allowedRegex, value)
}

label_values[key] = value {
	value := input.review.object.metadata.labels[key]
}

exempt["kube-system"]
"""

DENY_V0 = """package images

deny[msg] {
	image := input.containers[_].image
	not allowed(image)
	msg := sprintf("image %v is not from an allowed registry", [image])
}

allowed(image) {
	startswith(image, data.registries[_])
}

level = "strict" { count(deny) > 0 } else = "ok" { true }
"""


def gated(source: str, entrypoint: str, engine: RegoEngine, data: dict[str, Any] | None = None) -> Any:
    return compile_rego_bundle(parse_rego_bundle({
        "modules": {"policy.rego": source}, "data": data or {},
        "manifest": {"roots": [""], "metadata": {"regent": {"entrypoint": entrypoint}}},
    }), engine=engine)


def probe(engine: RegoEngine, bundle: Any, document: dict[str, Any], entrypoint: str) -> Any:
    """The rule at ``entrypoint`` of ``bundle``'s modules (built as that bundle's entrypoint)."""
    [source] = bundle.modules.values()
    built = gated(source, entrypoint, engine, bundle.data)
    [got] = engine.probe(built, document, [entrypoint])
    return got.get("value", "undefined")


def test_gate_refuses_a_v0_helper_that_would_answer_allow_for_rm_rf(engine: RegoEngine) -> None:
    with pytest.raises(ValidationError) as info:
        gated(SHELL_V0_HELPER, "shell/decision", engine)
    assert "policy.rego:4:1: OPA v0 rule head `blocked[cmd] { … }`" in info.value.message
    assert "write `blocked contains cmd if { … }`" in info.value.message


def test_rewritten_shell_helper_denies_rm_rf(engine: RegoEngine) -> None:
    bundle = gated(rewrite_v0_v1(SHELL_V0_HELPER), "shell/decision", engine)
    assert engine.evaluate(bundle, step(command="rm -rf /")).verdict == "deny"
    assert engine.evaluate(bundle, step(command="ls")).verdict == "allow"


@pytest.mark.parametrize("source", [REQUIRED_LABELS_V0, DENY_V0], ids=["required-labels", "deny-images"])
def test_gate_names_every_v0_head_with_its_v1_form(source: str) -> None:
    problems = v1_problems(source)
    heads = [m for _, _, m in problems]
    assert heads and all(("OPA v0 rule head" in m and " if { … }`" in m) or "partial-set head" in m for m in heads)
    assert not v1_problems(rewrite_v0_v1(source))


def test_fmt_rewrites_gatekeeper_shaped_heads_to_v1() -> None:
    out = rewrite_v0_v1(REQUIRED_LABELS_V0)
    assert 'violation contains {"msg": msg, "details": {"missing_labels": missing}} if {' in out
    assert "matches(value, expected) if {" in out
    assert "matches(value, expected) = true if {" in out
    assert "label_values[key] = value if {" in out
    assert 'exempt contains "kube-system"' in out
    assert out.count("\n") == REQUIRED_LABELS_V0.count("\n")  # lines kept: problems keep their lines


def test_rewritten_required_labels_decides_as_opa_v0_meant(engine: RegoEngine) -> None:
    bundle = gated(rewrite_v0_v1(REQUIRED_LABELS_V0), "k8srequiredlabels/violation", engine)
    review = {"review": {"object": {"metadata": {"labels": {"team": "x1"}}}},
              "parameters": {"labels": [{"key": "team", "allowedRegex": "^[a-z]+$"}, {"key": "owner", "allowedRegex": ""}]}}
    got = probe(engine, bundle, review, "k8srequiredlabels/violation")
    msgs = sorted(v["msg"] for v in got)  # a set of violation objects, as OPA v0 builds it
    assert msgs == ['label <team: x1> does not match <^[a-z]+$>', 'you must provide labels: {"owner"}']
    ok = {**review, "review": {"object": {"metadata": {"labels": {"team": "abc", "owner": "me"}}}}}
    assert probe(engine, bundle, ok, "k8srequiredlabels/violation") == []
    assert probe(engine, bundle, review, "k8srequiredlabels/label_values") == {"team": "x1"}
    assert probe(engine, bundle, review, "k8srequiredlabels/exempt") == ["kube-system"]


def test_rewritten_deny_rules_decide_as_opa_v0_meant(engine: RegoEngine) -> None:
    bundle = gated(rewrite_v0_v1(DENY_V0), "images/deny", engine, data={"registries": ["registry.local/"]})
    doc = {"containers": [{"image": "registry.local/app"}, {"image": "docker.io/evil"}]}
    assert probe(engine, bundle, doc, "images/deny") == ["image docker.io/evil is not from an allowed registry"]
    assert probe(engine, bundle, doc, "images/level") == "strict"
    assert probe(engine, bundle, {"containers": [{"image": "registry.local/app"}]}, "images/level") == "ok"


def test_policy_fmt_prints_a_diff_and_writes_with_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "shell"
    d.mkdir()
    (d / "policy.rego").write_text(SHELL_V0_HELPER)
    assert main(["policy", "check", str(d)]) == 1
    assert main(["policy", "fmt", "--v0-v1", str(d), "--fail"]) == 2
    out = capsys.readouterr().out
    assert "-blocked[cmd] {\n+blocked contains cmd if {\n" in out
    assert (d / "policy.rego").read_text() == SHELL_V0_HELPER  # a diff only
    assert main(["policy", "fmt", "--v0-v1", "--write", str(d)]) == 0
    assert "blocked contains cmd if {" in (d / "policy.rego").read_text()
    assert main(["policy", "check", "--strict", str(d)]) == 0
    assert main(["policy", "fmt", "--v0-v1", str(d), "--fail"]) == 0


def test_policy_check_prints_load_time_rewrites_as_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "images"
    d.mkdir()
    (d / "policy.rego").write_text(
        'package images\nimport rego.v1\n\ndecision := {"decision": "deny", "rule_id": "latest"} if {\n'
        '\tendswith(input.args.images[_], ":latest")\n}\n')
    assert main(["policy", "check", str(d), "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["bundles"][0]
    assert row["notes"] and "policy.rego:5:11" in row["notes"][0] and "__arg1 := input.args.images[_]" in row["notes"][0]


def test_failing_rego_test_names_its_failing_expression_and_values(tmp_path: Path) -> None:
    test_file = tmp_path / "policy_test.rego"
    test_file.write_text("""package pay_test
import rego.v1

test_big_denied if {
	d := data.pay.decision with input.amount as 500
	d.rule_id == "big"
}

test_not_allowed if {
	not data.pay.decision.rule_id
}
""")
    modules = {"pay/policy.rego": 'package pay\nimport rego.v1\n\ndefault decision := {"rule_id": "default"}\n'
               'decision := {"rule_id": "big"} if { input.amount > 1000 }\n'}
    results = {r.name: r for r in run_rego_test_file(test_file, modules, {})}
    big = results["pay_test.test_big_denied"]
    assert big.status == "fail"
    assert big.message == f'{test_file}:6: `d.rule_id == "big"` is false (left "default", right "big")'
    assert results["pay_test.test_not_allowed"].message == (
        f'{test_file}:10: `not data.pay.decision.rule_id` is false (`data.pay.decision.rule_id` is "default")')


@pytest.mark.parametrize(("head", "v1"), [
    ('exempt["kube-system"]', 'write `exempt contains "kube-system"` for a set'),
    ("blocked[input.cmd]", "write `blocked contains input.cmd` for a set"),
])
def test_gate_refuses_a_bare_set_member_which_rego_cpp_reads_as_an_object(
        engine: RegoEngine, head: str, v1: str) -> None:
    # OPA v1: "`contains` keyword is required for partial set rules"; rego-cpp: {"kube-system": true}.
    with pytest.raises(ValidationError) as info:
        gated(f"package t\n\n{head}\n", "t/deny", engine)
    assert "policy.rego:3:1: bare partial-set head" in info.value.message
    assert v1 in info.value.message


def test_ref_heads_with_if_a_value_or_a_longer_path_are_not_bare_set_heads() -> None:
    # OPA reads `p[x] if { … }` as the object {x: true} too (a single-value rule).
    source = ('package t\n\np[k] := 1 if { some k in ["a"] }\nq.r["a"]\nf(x) if { x }\n'
              'p2[x].y := 1 if { x := "a" }\np3[x] if { some x in ["a"] }\np4["a"] if { true }\n')
    assert set_head_problems(source) == []


@pytest.mark.parametrize(("body", "where"), [
    ("y := input.a\n\t-1 < y", (6, 2)),  # OPA: `y` unsafe; rego-cpp: false
    ("x := input.a\n\t== 5", (6, 2)),
    ("x := [a |\n\ta := input.b[_]\n\t-1 < a]", (7, 2)),  # a comprehension's body is a query
    ("every v in input.xs {\n\tv > 1\n\t* 2 }", (7, 2)),
])
def test_a_query_line_starting_with_a_binary_operator_is_refused_where_it_is(body: str, where: tuple[int, int]) -> None:
    source = f"package t\nimport rego.v1\n\np if {{\n\t{body}\n}}\n"
    problems = operator_line_problems(source)
    assert [(line, col) for line, col, _ in problems] == [where], problems
    assert "End the line before with the operator" in problems[0][2]
    assert v1_problems(source) == problems


def test_operator_lines_inside_literals_and_before_a_comprehension_bar_are_accepted() -> None:
    source = ('package t\n\np if {\n\txs := [\n\t\t-1,\n\t\t-2,\n\t]\n\tys := [y\n\t\t| some y in xs]\n'
              '\to := {"a": 1,\n\t\t"b": -2}\n\tz := input.a -\n\t\t1 < 2\n}\nq := input.a\n\t+ 1\n')
    assert operator_line_problems(source) == []


def test_iterated_references_in_head_values_are_bound_at_the_end_of_the_body_lines_kept() -> None:
    source = ('package t\n\np := [input.b[_], 1]\nq contains {"n": input.i[_].n} if {\n\tcount(input.i) > 0\n}\n'
              'r := {k: input.b[_] | k := "x"}\n')
    out = rewrite_idioms(source)
    assert out.source.splitlines()[2:7] == [
        "p := [__arg2, 1] if { __arg2 := input.b[_] }",
        'q contains {"n": __arg3} if {',
        "\tcount(input.i) > 0; __arg3 := input.i[_].n",
        "}",
        'r := {k: __arg1 | k := "x"; __arg1 := input.b[_]}',
    ]
    assert [line for line, _, _ in out.notes] == [3, 4, 7] and not out.problems


def test_an_iterated_reference_in_a_head_value_with_else_is_refused_with_the_rewrite() -> None:
    out = rewrite_idioms("package t\n\np := [input.b[_]] if { true } else := 1\n")
    [(line, col, message)] = out.problems
    assert (line, col) == (3, 7)
    assert "with `else`" in message and "`p := [v] if { v := x[_] }`" in message
