"""`regent policy check` warnings: an allow rule's unanchored regex and a numeric-looking regex."""

from __future__ import annotations

import pytest

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
