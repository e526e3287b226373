"""`regent policy test|check|eval`: exit codes and the three output formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kernel.cli import main

ROOT = Path(__file__).resolve().parents[1]

BUNDLE = "default_action: deny\nrules:\n  - id: allow-ls\n    when: {target: ls}\n    then: {decision: allow}\n"


def write(tmp: Path, bundle: str, cases: str) -> Path:
    (tmp / "b.yaml").write_text(bundle)
    (tmp / "b.policytest.yaml").write_text(cases)
    return tmp / "b.yaml"


def test_passing_suite_exits_zero(tmp_path: Path) -> None:
    p = write(tmp_path, BUNDLE, "cases:\n  - {target: ls, expect: allow, expect_rule: allow-ls}\n")
    assert main(["policy", "test", str(p)]) == 0


def test_failing_suite_exits_two_and_json_reports_the_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, BUNDLE, "cases:\n  - {name: rm, target: rm, expect: allow}\n")
    assert main(["policy", "test", str(p), "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    [row] = report["suites"][0]["results"]
    assert (row["pass"], row["failure"], row["rule_id"]) == (False, "deny, want allow", "default")
    assert report["suites"][0]["unexercised_rules"] == ["allow-ls"]


def test_junit_output_parses_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, BUNDLE, "cases:\n  - {name: ok, target: ls, expect: allow}\n  - {name: bad, target: rm, expect: allow}\n")
    assert main(["policy", "test", str(p), "--format", "junit"]) == 2
    root = ET.fromstring(capsys.readouterr().out)
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    failed = [tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert failed == ["bad"]


def test_bad_bundle_exits_one_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, "rules: [{id: x, then: {decision: maybe}}]\n", "cases: []\n")
    assert main(["policy", "test", str(p)]) == 1
    assert "b.yaml" in capsys.readouterr().err


def test_bad_case_file_exits_one(tmp_path: Path) -> None:
    p = write(tmp_path, BUNDLE, "cases:\n  - {target: ls, expects: allow}\n")
    assert main(["policy", "test", str(p)]) == 1


def test_run_filter_and_fail_on_empty(tmp_path: Path) -> None:
    p = write(tmp_path, BUNDLE, "cases:\n  - {name: one, target: ls, expect: allow}\n")
    assert main(["policy", "test", str(p), "-r", "nomatch", "--fail-on-empty"]) == 1
    assert main(["policy", "test", str(p), "-r", "on"]) == 0


def test_check_and_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, BUNDLE, "cases: []\n")
    assert main(["policy", "check", str(p)]) == 0
    assert main(["policy", "eval", str(p), "--target", "ls", "--explain"]) == 0
    text = capsys.readouterr().out
    assert "allow  allow-ls" in text and "line 3" in text


def test_shipped_bundles_pass(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    assert main(["policy", "test", str(root / "bundles"), "--fail-on-empty"]) == 0


def test_policy_test_imports_no_web_stack_store_or_settings() -> None:
    """Start-up is most of `regent policy test`'s wall time (issue 18 P6): the policy commands load
    neither the web stack nor SQLAlchemy, pydantic-settings, PyJWT or greenlet (regopy-notes hazard 3)."""
    code = (
        "import sys\n"
        "from kernel.cli import main\n"
        f"rc = main(['policy', 'test', {str(ROOT / 'bundles' / 'payments-rego')!r}, '--format', 'json'])\n"
        "heavy = ('sqlalchemy', 'sqlmodel', 'pydantic_settings', 'fastapi', 'starlette', 'uvicorn', 'jwt', 'greenlet')\n"
        "print(rc, sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.stderr.strip().splitlines()[-1] == "0 []", proc.stderr[-2000:]
