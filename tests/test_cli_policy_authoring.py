"""`regent policy` for authors: eval's whole input documents and probes, JSON explain and check,
line coverage and its threshold, --strict, JUnit for CI annotators, skip/xfail, quiet engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kernel.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAYMENTS_REGO = ROOT / "bundles" / "payments-rego"
PAYMENTS_YAML = ROOT / "bundles" / "payments.yaml"

BUDGET_POLICY = """package budget
import rego.v1

decision := {"decision": "deny", "rule_id": "over-budget", "reason": sprintf("%v tokens used", [used])} if {
	used > 1000
}

decision := {"decision": "allow", "rule_id": "night-shift"} if {
	used <= 1000
	startswith(input.now, "2026-12-02T23")
	input.execution.id == "exec-night"
	input.agent_id == "batch"
}

used := input.usage.input_tokens + input.usage.output_tokens
"""


def rego_bundle(tmp: Path, name: str, policy: str) -> Path:
    d = tmp / name
    d.mkdir()
    (d / ".manifest").write_text(json.dumps({"roots": [name]}))
    (d / "policy.rego").write_text(policy)
    return d


def eval_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["policy", "eval", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_eval_takes_a_whole_input_document_and_the_probe_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "budget", BUDGET_POLICY)
    doc = tmp_path / "input.json"
    doc.write_text(json.dumps({"agent_id": "batch", "kind": "llm_call", "target": "gpt", "args": {},
                               "now": "2026-12-02T23:10:00Z", "execution": {"id": "exec-night"},
                               "usage": {"input_tokens": 10, "output_tokens": 5}}))
    got = eval_json(capsys, str(b), "--input", str(doc))
    assert got["decision"]["rule_id"] == "night-shift"  # type: ignore[index]
    # Each flag overrides the document's field.
    assert eval_json(capsys, str(b), "--input", str(doc), "--usage", '{"input_tokens": 2000}')["decision"] == {
        "decision": "deny", "rule_id": "over-budget", "reason": "2000 tokens used",
        "policy_kind": "rego", "policy_revision": json.loads(json.dumps(got["decision"]))["policy_revision"]}
    for flag, value in (("--now", "2026-12-02T09:00:00Z"), ("--execution-id", "exec-day"), ("--agent-id", "other")):
        assert eval_json(capsys, str(b), "--input", str(doc), flag, value)["decision"]["rule_id"] == "default"  # type: ignore[index]


def test_eval_input_errors_name_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "budget", BUDGET_POLICY)
    doc = tmp_path / "input.json"
    doc.write_text('{"target": "gpt",\n "args": nope}')
    assert main(["policy", "eval", str(b), "--input", str(doc)]) == 1
    assert f"{doc}:2:10: not JSON" in capsys.readouterr().err
    doc.write_text('{"target": "gpt", "argz": {}}')
    assert main(["policy", "eval", str(b), "--input", str(doc)]) == 1
    assert "unknown key 'argz'" in capsys.readouterr().err
    assert main(["policy", "eval", str(b)]) == 1
    assert "a target is needed" in capsys.readouterr().err


def test_explain_is_json_with_options_as_objects(capsys: pytest.CaptureFixture[str]) -> None:
    rego = eval_json(capsys, str(PAYMENTS_REGO), "--target", "transfer_funds", "--args", '{"amount": 5000}', "--explain")
    yaml = eval_json(capsys, str(PAYMENTS_YAML), "--target", "transfer_funds", "--args", '{"amount": 5000}', "--explain")
    for doc in (rego, yaml):
        assert doc["decision"]["approval_config"] == {  # type: ignore[index]
            "approvers": ["finance"], "timeout_seconds": 3600.0,
            "message": "The payments bot wants to move more than 1000."}
    assert [m["rule_id"] for m in rego["decision_set"]] == ["approve-large-transfer"]  # type: ignore[union-attr,index]
    assert any(r["rule_id"] == "approve-large-transfer" and r["result"] == "held" for r in rego["trace"])  # type: ignore[union-attr,index]
    assert [r["rule_id"] for r in yaml["rules"] if r["selected"]] == ["approve-large-transfer"]  # type: ignore[union-attr,index]
    llm = eval_json(capsys, str(PAYMENTS_REGO), "--kind", "llm_call", "--target", "gpt", "--explain")
    assert llm["decision"]["rate_limit"]["max_calls"] == 30  # type: ignore[index]


def test_explain_pretty_shows_the_overridden_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "shell", """package shell
import rego.v1

decision contains {"decision": "allow", "rule_id": "allow-shell"} if input.target == "shell"

decision contains {"decision": "deny", "rule_id": "deny-rm"} if {
	input.target == "shell"
	startswith(input.args.command, "rm")
}
""")
    assert main(["policy", "eval", str(b), "--target", "shell", "--args", '{"command": "rm -rf /"}', "--explain"]) == 0
    text = capsys.readouterr().out
    assert "→ deny deny-rm" in text
    assert "allow allow-shell  (overridden by deny-rm: deny-overrides)" in text
    assert f"{b}/policy.rego:8  startswith(input.args.command, \"rm\")  (held)" in text


LINTED = ("default_action: deny\nrules:\n  - id: allow-ls\n    when:\n      target: shell\n      arguments:\n"
          "        command: {regex: 'ls'}\n    then: {decision: allow}\n")


def test_check_warns_with_the_line_and_formats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "b.yaml"
    p.write_text(LINTED)
    assert main(["policy", "check", str(p)]) == 0
    assert f'{p}:7: warning: rule "allow-ls": arguments.command.regex "ls" is not anchored' in capsys.readouterr().out
    assert main(["policy", "check", str(p), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["warnings"] == 1
    [w] = doc["bundles"][0]["warnings"]
    assert (w["code"], w["line"], w["rule_id"]) == ("unanchored-regex", 7, "allow-ls")
    assert main(["policy", "check", str(p), "--strict", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "line 7" in doc["bundles"][0]["problems"][0]


def test_check_json_lists_rego_problems_with_file_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "shell", 'package shell\nimport rego.v1\n\ndecision := {"decision": "deny", '
                    '"rule_id": "d", "reason": sprintf("%q", [input.target])} if { true }\n')
    assert main(["policy", "check", str(b), "--format", "json"]) == 1
    [row] = json.loads(capsys.readouterr().out)["bundles"]
    assert any(f"{b}/policy.rego:4:" in p and "%q" in p for p in row["problems"])


HELPER_POLICY = """package helper
import rego.v1

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


def test_coverage_json_is_opa_shaped_and_threshold_applies_to_the_named_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "helper", HELPER_POLICY)
    (tmp_path / "helper.policytest.yaml").write_text(
        "cases:\n  - {target: shell, args: {command: curl}, expect: deny, expect_rule: risky}\n")
    assert main(["policy", "test", str(b), "--coverage", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    file = report["line_coverage"]["files"][f"{b}/policy.rego"]
    assert file["not_covered"] == [{"start": {"row": 8}, "end": {"row": 8}}, {"start": {"row": 10}, "end": {"row": 10}}]
    assert report["coverage"]["percent"] == 100.0  # every rule id was exercised
    assert main(["policy", "test", str(b), "--threshold", "rules:100"]) == 0
    assert main(["policy", "test", str(b), "--threshold", "lines:90"]) == 2
    assert "line coverage 71.4% is below --threshold 90" in capsys.readouterr().err
    assert main(["policy", "test", str(b), "--threshold", "lines:70"]) == 0
    assert main(["policy", "test", str(b), "--coverage"]) == 0
    assert "not covered: lines 8, 10" in capsys.readouterr().out


def test_strict_test_fails_on_an_unused_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "helper", HELPER_POLICY.replace("import rego.v1\n", "import rego.v1\nimport data.lib\n"))
    (tmp_path / "helper.policytest.yaml").write_text("cases:\n  - {target: shell, args: {command: curl}, expect: deny}\n")
    assert main(["policy", "test", str(b)]) == 0
    assert main(["policy", "test", str(b), "--strict"]) == 1
    assert "import data.lib is never used (strict)" in capsys.readouterr().err


CASES = """cases:
  - name: read-only
    target: ls
    expect: allow
  - name: only the rego twin can tell
    target: ls
    expect: deny
    skip: {kind: yaml, reason: the YAML twin cannot express this}
  - name: known gap
    target: rm
    expect: allow
    xfail: rm is not allowed yet
"""
BUNDLE = "default_action: deny\nrules:\n  - id: allow-ls\n    when: {target: ls}\n    then: {decision: allow}\n"


def test_skip_and_xfail_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.yaml").write_text(BUNDLE)
    (tmp_path / "b.policytest.yaml").write_text(CASES)
    assert main(["policy", "test", str(tmp_path / "b.yaml"), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["suites"][0]["results"]
    assert [(r["name"], r["status"]) for r in rows] == [
        ("read-only", "pass"), ("only the rego twin can tell", "skip"), ("known gap", "xfail")]
    # An xfail case that passes is a failure (XPASS): the mark has gone stale.
    (tmp_path / "b.policytest.yaml").write_text(CASES.replace("target: rm", "target: ls"))
    assert main(["policy", "test", str(tmp_path / "b.yaml")]) == 2
    assert "XPASS" in capsys.readouterr().out


def test_junit_has_the_declaration_times_files_and_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.yaml").write_text(BUNDLE)
    (tmp_path / "b.policytest.yaml").write_text(CASES)
    assert main(["policy", "test", str(tmp_path / "b.yaml"), "--format", "junit"]) == 0
    text = capsys.readouterr().out
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    suite = ET.fromstring(text.split("\n", 1)[1]).find("testsuite")
    assert suite is not None and suite.get("skipped") == "2" and float(suite.get("time", "x")) >= 0
    cases = list(suite.iter("testcase"))
    assert [(c.get("file"), c.get("line")) for c in cases] == [(str(tmp_path / "b.policytest.yaml"), n) for n in ("2", "5", "9")]
    assert all(float(c.get("time", "x")) >= 0 for c in cases)
    assert cases[1].find("skipped") is not None and cases[2].find("skipped") is not None


def test_junit_for_rego_tests_names_their_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(PAYMENTS_REGO), "--format", "junit"]) == 0
    root = ET.fromstring(capsys.readouterr().out.split("\n", 1)[1])
    rego = [c for c in root.iter("testcase") if c.get("name", "").startswith("payments_test.")]
    assert [(Path(c.get("file", "")).name, c.get("line")) for c in rego] == [
        ("payments_test.rego", "6"), ("payments_test.rego", "12"), ("payments_test.rego", "16")]


def test_names_are_not_truncated_when_stdout_is_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long = "a case name long enough that a terminal table would have to cut it somewhere in the middle"
    (tmp_path / "b.yaml").write_text(BUNDLE)
    (tmp_path / "b.policytest.yaml").write_text(f"cases:\n  - {{name: {long}, target: ls, expect: allow}}\n"
                                                "  - {target: ls, args: {path: " + "x" * 80 + "}}\n")
    assert main(["policy", "test", str(tmp_path / "b.yaml")]) == 0
    text = capsys.readouterr().out
    assert long in text and "x" * 80 in text and "…" not in text


def test_engine_log_lines_stay_out_of_the_output_unless_verbose() -> None:
    def run(*extra: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "kernel.cli", "policy", "check", str(PAYMENTS_REGO), *extra],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout + proc.stderr

    assert " INFO " not in run()
    assert " INFO kernel.policy.rego: rego-cpp" in run("-v")


def test_bracketed_text_in_warnings_and_names_is_printed_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "b.yaml"
    p.write_text("rules:\n  - {id: ok, when: {target: a, arguments: {c: {regex: '[a-z]+'}}}, then: {decision: allow}}\n")
    (tmp_path / "b.policytest.yaml").write_text('cases:\n  - {name: "x [0-9] y", target: a, args: {c: zz}, expect: allow}\n')
    assert main(["policy", "check", str(p)]) == 0
    assert 'arguments.c.regex "[a-z]+" is not anchored' in capsys.readouterr().out
    assert main(["policy", "test", str(p)]) == 0
    assert "x [0-9] y" in capsys.readouterr().out


HELPER_TESTS = """package helper_test
import rego.v1
import data.helper

test_curl_is_risky if {
	helper.risky with input.args.command as "curl"
}

test_decision_when_risky_is_mocked if {
	d := data.helper.decision with data.helper.risky as true
	d.rule_id == "risky"
}

todo_test_network if {
	helper.risky with input.args.mode as "network" with input.args.port as 8080
}
"""


def test_coverage_counts_the_lines_rego_unit_tests_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "helper", HELPER_POLICY)
    (b / "helper_test.rego").write_text(HELPER_TESTS)
    assert main(["policy", "test", str(b), "--coverage", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["status"] for t in report["rego_tests"]] == ["skip", "pass", "pass"]
    policy = report["line_coverage"]["files"][f"{b}/policy.rego"]
    # The curl branch ran under the test's own `with` (and the network branch's first expression,
    # which failed); the network test is a todo; `decision` ran with `risky` mocked.
    assert policy["covered"] == [{"start": {"row": 4}, "end": {"row": 5}}, {"start": {"row": 9}, "end": {"row": 9}},
                                 {"start": {"row": 13}, "end": {"row": 14}}]
    assert policy["not_covered"] == [{"start": {"row": 8}, "end": {"row": 8}}, {"start": {"row": 10}, "end": {"row": 10}}]
    # The test file is reported too, as `opa test --coverage` does: both tests ran whole, the
    # todo did not run.
    tests = report["line_coverage"]["files"][str(b / "helper_test.rego")]
    assert tests["covered"] == [{"start": {"row": 5}, "end": {"row": 6}}, {"start": {"row": 9}, "end": {"row": 11}}]
    assert tests["not_covered"] == [{"start": {"row": 14}, "end": {"row": 15}}]
    assert "errors" not in report["line_coverage"]
    # Alone, the test that mocks `risky` covers `decision` and none of `risky`'s own lines.
    assert main(["policy", "test", str(b), "--coverage", "--format", "json", "--run", "mocked"]) == 0
    policy = json.loads(capsys.readouterr().out)["line_coverage"]["files"][f"{b}/policy.rego"]
    assert policy["covered"] == [{"start": {"row": 13}, "end": {"row": 14}}]
    assert policy["not_covered"] == [{"start": {"row": 4}, "end": {"row": 5}}, {"start": {"row": 8}, "end": {"row": 10}}]


IDIOM_TESTS = """package helper_test
import rego.v1

images := ["a:1", "b:latest"]

test_a_wildcard_argument if {
	endswith(images[_], ":latest")
	data.helper.risky with input.args.command as "curl"
}

test_a_guarded_builtin if {
	replace("ab", "", "-") == "-a-b-"
}
"""


def test_coverage_measures_unit_tests_as_the_runner_runs_them_with_load_time_rewrites(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `endswith(images[_], …)` does not compile in rego-cpp (idioms.py rewrites it), and
    # `replace(…, "", …)` never returned (guards.py appends a helper after the last line): the
    # coverage twin of the test file must get both rewrites, or nothing is measured.
    b = rego_bundle(tmp_path, "helper", HELPER_POLICY)
    (b / "idiom_test.rego").write_text(IDIOM_TESTS)
    assert main(["policy", "test", str(b), "--coverage", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["status"] for t in report["rego_tests"]] == ["pass", "pass"]
    assert "errors" not in report["line_coverage"]
    tests = report["line_coverage"]["files"][str(b / "idiom_test.rego")]
    assert tests["covered"] == [{"start": {"row": 4}, "end": {"row": 4}}, {"start": {"row": 6}, "end": {"row": 8}},
                                {"start": {"row": 11}, "end": {"row": 12}}]
    assert "not_covered" not in tests  # and no line past the file's last (the guard's helper)
    policy = report["line_coverage"]["files"][f"{b}/policy.rego"]
    assert policy["covered"] == [{"start": {"row": 4}, "end": {"row": 5}}, {"start": {"row": 9}, "end": {"row": 9}}]


def test_a_test_file_the_load_gate_refuses_is_reported_not_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "helper", HELPER_POLICY)
    (b / "with_test.rego").write_text(  # an iterated argument beside `with`: refused (idioms.py)
        'package with_test\nimport rego.v1\n\ntest_w if {\n\tendswith(input.i[_], "x") with input.i as ["x"]\n}\n')
    assert main(["policy", "test", str(b), "--coverage", "--format", "json"]) == 2  # the test is an ERROR
    report = json.loads(capsys.readouterr().out)
    assert [t["status"] for t in report["rego_tests"]] == ["error"]
    assert "in an expression with `with`" in report["rego_tests"][0]["message"]
    assert "errors" not in report["line_coverage"]  # was: "the test file's own lines: Expecting value…"
    assert report["line_coverage"]["files"][str(b / "with_test.rego")]["not_covered"] == [
        {"start": {"row": 4}, "end": {"row": 5}}]
    assert main(["policy", "test", str(b), "--coverage"]) == 2
    assert "line coverage incomplete" not in capsys.readouterr().out


def test_coverage_of_unit_tests_survives_a_test_that_crashes_the_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, "helper", HELPER_POLICY.replace(
        'input.args.command == "curl"', 'startswith(input.args.command, "curl")'))
    (b / "crash_test.rego").write_text(  # regopy hazard 1: a builtin on a whole `with input as`
        'package crash_test\nimport rego.v1\n\ntest_whole_input if {\n\tdata.helper.risky with input as {"args": {"command": "curl"}}\n}\n')
    (b / "field_test.rego").write_text(
        'package field_test\nimport rego.v1\n\ntest_field if {\n\tdata.helper.risky with input.args.command as "curl"\n}\n')
    assert main(["policy", "test", str(b), "--coverage", "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["status"]) for t in report["rego_tests"]] == [
        ("crash_test.test_whole_input", "error"), ("field_test.test_field", "pass")]
    files = report["line_coverage"]["files"]
    assert files[f"{b}/policy.rego"]["covered"][0] == {"start": {"row": 4}, "end": {"row": 5}}  # by test_field
    assert files[str(b / "field_test.rego")]["covered"] == [{"start": {"row": 4}, "end": {"row": 5}}]
    assert files[str(b / "crash_test.rego")]["not_covered"] == [{"start": {"row": 4}, "end": {"row": 5}}]
    assert "errors" not in report["line_coverage"]  # the crashed test is not measured again


def test_junit_names_nameless_cases_apart_as_the_pretty_format_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two cases without a name on one target were both `ls` in JUnit (a CI tool merges them).
    (tmp_path / "b.yaml").write_text(BUNDLE)
    (tmp_path / "b.policytest.yaml").write_text(
        "cases:\n  - {target: ls, args: {dir: a}, expect: allow}\n  - {target: ls, args: {dir: b}, expect: allow}\n")
    assert main(["policy", "test", str(tmp_path / "b.yaml"), "--format", "junit"]) == 0
    root = ET.fromstring(capsys.readouterr().out.split("\n", 1)[1])
    assert [c.get("name") for c in root.iter("testcase")] == ['ls {"dir":"a"}', 'ls {"dir":"b"}']
