"""Every shipped bundle passes its case file in policy_tests/, and exercises every rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.policy.cases import parse_cases, run_cases
from kernel.policy.yaml import compile_yaml_bundle

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = sorted(p for p in (ROOT / "bundles").glob("*.yaml") if p.name != "regent.yaml")


@pytest.mark.parametrize("bundle_path", BUNDLES, ids=[p.stem for p in BUNDLES])
def test_shipped_bundle_passes_its_cases(bundle_path: Path) -> None:
    bundle = compile_yaml_bundle(bundle_path.read_text(), revision=bundle_path.stem)
    cases_path = ROOT / "policy_tests" / f"{bundle_path.stem}.policytest.yaml"
    cases = parse_cases(cases_path.read_text(), source=str(cases_path))
    assert cases, f"{cases_path} has no cases"
    report = run_cases(bundle, cases, bundle.rule_ids)
    failures = [(r.case.name, r.failure) for r in report.results if not r.passed]
    assert failures == []
    assert report.unexercised_rules == []
    assert bundle.shadowed_rules() == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cases:\n  - target: t\n    expects: allow\n", "case 1: unknown key 'expects'"),
        ("cases:\n  - name: x\n", "case 1: missing target"),
        ("cases:\n  - target: t\n    kind: shell\n", 'case 1: unknown kind "shell"'),
        ("cases:\n  - target: t\n    expect: judge\n", 'case 1: unknown expect "judge"'),
    ],
    ids=["unknown-key", "missing-target", "unknown-kind", "unknown-expect"],
)
def test_case_file_errors_name_the_file_and_case(text: str, message: str) -> None:
    from kernel.errors import ValidationError

    with pytest.raises(ValidationError, match=message):
        parse_cases(text, source="x.policytest.yaml")
