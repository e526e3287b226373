"""The policy test runner over passing, failing, erroring and crashing suites of both kinds."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kernel.cli import main
from kernel.policy.testing import run_rego_test_file

ROOT = Path(__file__).resolve().parents[3]
REGO = 'package t\nimport rego.v1\n\ndecision := {"decision": "allow", "rule_id": "allow-ls"} if input.target == "ls"\n'
MANIFEST = '{"roots": ["t"], "metadata": {"regent": {"entrypoint": "t/decision"}}}'


def rego_bundle(tmp: Path, test_source: str | None = None, cases: str | None = None) -> Path:
    b = tmp / "t"
    b.mkdir()
    (b / "policy.rego").write_text(REGO)
    (b / ".manifest").write_text(MANIFEST)
    if test_source is not None:
        (b / "t_test.rego").write_text(test_source)
    if cases is not None:
        (tmp / "t.policytest.yaml").write_text(cases)
    return b


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    rc = main(["policy", "test", *args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_shipped_bundles_and_policy_tests_all_pass(capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = run_json([str(ROOT / "bundles")], capsys)
    assert rc == 0, report
    assert report["failed"] == 0
    kinds = {Path(s["bundle"]).name for s in report["suites"]}
    assert {"shell.yaml", "shell-rego", "researcher-rego", "filesystem-rego"} <= kinds
    assert {x["status"] for x in report["rego_tests"]} == {"pass", "skip"}


def test_rego_bundle_case_file_passes_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, cases="cases:\n  - {name: ok, target: ls, expect: allow, expect_rule: allow-ls}\n"
                                    "  - {name: bad, target: rm, expect: allow}\n")
    rc, report = run_json([str(b)], capsys)
    assert rc == 2
    rows = {r["name"]: r for r in report["suites"][0]["results"]}
    assert rows["ok"]["pass"] is True
    assert (rows["bad"]["pass"], rows["bad"]["failure"]) == (False, "deny, want allow")


def test_rego_unit_tests_pass_fail_and_skip(tmp_path: Path) -> None:
    src = ('package t_test\nimport rego.v1\n'
           'test_ls if { data.t.decision.rule_id == "allow-ls" with input.target as "ls" }\n'
           'test_rm if { data.t.decision.rule_id == "allow-ls" with input.target as "rm" }\n'
           'todo_test_later if { false }\n')
    b = rego_bundle(tmp_path, src)
    results = run_rego_test_file(b / "t_test.rego", {"policy.rego": REGO}, {})
    assert {r.name: r.status for r in results} == {"t_test.test_ls": "pass", "t_test.test_rm": "fail",
                                                   "t_test.todo_test_later": "skip"}


def test_rego_segfault_is_an_error_naming_the_test_and_the_run_goes_on(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    src = ('package m\nimport rego.v1\nd if { startswith(input.c, "ls") }\n'
           'test_crash if { d with input as {"c": "ls -la"} }\n'
           'test_after if { true }\n')
    b = rego_bundle(tmp_path, src)
    (tmp_path / "other_test.rego").write_text("package o\nimport rego.v1\ntest_fine if { true }\n")
    [crash, after] = run_rego_test_file(b / "t_test.rego", {}, {})
    assert (crash.name, crash.status) == ("m.test_crash", "error")
    assert "SIGSEGV" in crash.message and "with input as" in crash.message
    assert after.status == "error" and "died before it" in after.message
    [fine] = run_rego_test_file(tmp_path / "other_test.rego", {}, {})
    assert fine.status == "pass"
    rc, report = run_json([str(b)], capsys)
    assert rc == 2
    assert report["rego_tests"][0]["status"] == "error"


def test_junit_counts_rego_errors_and_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = ('package m\nimport rego.v1\nd if { startswith(input.c, "ls") }\n'
           'test_crash if { d with input as {"c": "ls -la"} }\ntodo_test_x if { false }\n')
    b = rego_bundle(tmp_path, src, cases="cases:\n  - {name: bad, target: rm, expect: allow}\n")
    assert main(["policy", "test", str(b), "--format", "junit"]) == 2
    root = ET.fromstring(capsys.readouterr().out)
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    cases_suite, rego_suite = suites
    assert (cases_suite.get("tests"), cases_suite.get("failures")) == ("1", "1")
    assert cases_suite.find("testcase/failure") is not None
    assert (rego_suite.get("tests"), rego_suite.get("errors"), rego_suite.get("skipped")) == ("2", "1", "1")
    assert len(rego_suite.findall("testcase/error")) == 1
    assert len(rego_suite.findall("testcase/skipped")) == 1


def test_bad_rego_bundle_exits_one_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = tmp_path / "bad"
    b.mkdir()
    (b / "policy.rego").write_text("package t\nimport rego.v1\ndecision := {\n")
    (tmp_path / "bad.policytest.yaml").write_text("cases: []\n")
    assert main(["policy", "test", str(b)]) == 1
    assert str(b) in capsys.readouterr().err


def test_bad_case_file_names_file_case_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, cases="cases:\n  - {target: ls}\n  - {target: ls, expects: allow}\n")
    assert main(["policy", "test", str(b)]) == 1
    msg = capsys.readouterr().err
    assert "t.policytest.yaml" in msg and "case 2" in msg and "expects" in msg


def test_threshold_fails_when_coverage_is_below(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.yaml").write_text("default_action: deny\nrules:\n  - {id: a, when: {target: a}, then: {decision: allow}}\n"
                                     "  - {id: b, when: {target: b}, then: {decision: allow}}\n")
    (tmp_path / "b.policytest.yaml").write_text("cases:\n  - {target: a, expect: allow}\n")
    rc, report = run_json([str(tmp_path / "b.yaml"), "--threshold", "80"], capsys)
    assert rc == 2 and report["coverage"]["percent"] == 50.0
    assert main(["policy", "test", str(tmp_path / "b.yaml"), "--threshold", "50"]) == 0


def test_yaml_shadowed_rule_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.yaml").write_text("default_action: deny\nrules:\n  - {id: all, when: {target: '*'}, then: {decision: allow}}\n"
                                     "  - {id: ls, when: {target: ls}, then: {decision: deny}}\n")
    (tmp_path / "b.policytest.yaml").write_text("cases:\n  - {target: ls, expect: allow}\n")
    rc, report = run_json([str(tmp_path / "b.yaml")], capsys)
    assert rc == 0
    assert report["shadowed"] == [{"bundle": str(tmp_path / "b.yaml"), "rule_id": "ls", "shadowed_by": "all"}]


def test_rebuno_format_case_file_runs_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # rebuno-v0 §4.1's example, verbatim, against a bundle with the rule it names.
    (tmp_path / "shell.yaml").write_text(
        "default_action: deny\nrules:\n  - id: allow-safe-shell\n    when: {target: shell_exec}\n    then: {decision: allow}\n")
    (tmp_path / "shell.policytest.yaml").write_text(
        "agent_id: shell          # default for cases without one\ncases:\n  - name: read-only command\n"
        "    agent_id: shell      # optional\n    kind: tool_call      # tool_call (default) | llm_call | local\n"
        "    target: shell_exec   # required\n    args: { command: \"ls -la /tmp\" }   # optional mapping\n"
        "    expect: allow        # optional: allow | deny | require_approval\n"
        "    expect_rule: allow-safe-shell      # optional\n")
    rc, report = run_json([str(tmp_path / "shell.yaml")], capsys)
    assert rc == 0
    [row] = report["suites"][0]["results"]
    assert (row["decision"], row["rule_id"], row["pass"]) == ("allow", "allow-safe-shell", True)


def test_rego_eval_prints_decision_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["policy", "eval", str(ROOT / "bundles/shell-rego"), "--target", "shell_exec",
               "--args", '{"command": "ls"}', "--explain"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "allow-read-only" in text and "entrypoint data.shell.decision" in text


def test_fail_on_empty_exits_one(tmp_path: Path) -> None:
    b = rego_bundle(tmp_path, cases="cases: []\n")
    assert main(["policy", "test", str(b)]) == 0
    assert main(["policy", "test", str(b), "--fail-on-empty"]) == 1


def test_run_regex_selects_rego_tests_and_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = 'package t_test\nimport rego.v1\ntest_one if { true }\ntest_two if { false }\n'
    b = rego_bundle(tmp_path, src, cases="cases:\n  - {name: one-case, target: ls}\n  - {name: two, target: rm, expect: allow}\n")
    rc, report = run_json([str(b), "-r", "one"], capsys)
    assert rc == 0
    assert [x["name"] for x in report["rego_tests"]] == ["t_test.test_one"]
    assert [x["name"] for x in report["suites"][0]["results"]] == ["one-case"]


def test_context_and_expect_reason_against_yaml_and_rego_twins(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    cases = ("agent_id: researcher\ncases:\n"
             "  - {name: exhausted, target: arxiv/search, context: {rate_limit: {allow-search-tools: exhausted}},"
             " expect: rate_limited, expect_reason: rate_limit}\n"
             "  - {name: reason, kind: llm_call, target: llama-3, expect: deny, expect_reason: 'not approved'}\n"
             "  - {name: ctx, target: web_search, context: {now: '2026-01-01T00:00:00Z', usage: {input_tokens: 5},"
             " execution: {id: x}}, expect: allow}\n")
    (tmp_path / "case.policytest.yaml").write_text(cases)
    for bundle in ("researcher.yaml", "researcher-rego"):
        rc, report = run_json([str(ROOT / "bundles" / bundle), "--cases", str(tmp_path / "case.policytest.yaml")], capsys)
        assert rc == 0, (bundle, report)
        assert [r["decision"] for r in report["suites"][0]["results"]] == ["rate_limited", "deny", "allow"]


def test_unknown_context_key_names_file_case_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = rego_bundle(tmp_path, cases="cases:\n  - {target: ls, context: {clock: x}}\n")
    assert main(["policy", "test", str(b)]) == 1
    msg = capsys.readouterr().err
    assert "t.policytest.yaml" in msg and "case 1" in msg and "context.clock" in msg


def test_rego_eval_explain_shows_the_policys_print_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = ('package t\nimport rego.v1\n\ndecision := {"decision": "allow", "rule_id": "allow-ls"} if {\n'
           '\tprint("target is", input.target)\n\tinput.target == "ls"\n}\n')
    b = rego_bundle(tmp_path)
    (b / "policy.rego").write_text(src)
    rc = main(["policy", "eval", str(b), "--target", "ls", "--explain"])
    text = capsys.readouterr().out
    assert rc == 0 and "allow-ls" in text
    assert "print lines (1):" in text and "      target is ls" in text.splitlines()
    # Without --explain nothing is captured or shown, and evaluation is the ordinary path.
    assert main(["policy", "eval", str(b), "--target", "ls"]) == 0
    assert "print lines" not in capsys.readouterr().out
