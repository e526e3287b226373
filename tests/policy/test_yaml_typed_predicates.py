"""Regent's typed YAML predicates (gt/gte/lt/lte, type, exists/absent, not) compare the JSON value,
never its %v text; Rebuno's string constraints are unchanged; bad ones are load errors with lines."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from kernel.domain.decision import PolicyInput
from kernel.errors import ValidationError
from kernel.policy.yaml import compile_yaml_bundle


def _bundle(predicate: str) -> Any:
    return compile_yaml_bundle(
        "rules:\n  - id: r\n    when:\n      target: t\n      arguments:\n"
        f"        amount: {predicate}\n    then: {{decision: allow}}\n",
        revision="r",
    )


def _matches(predicate: str, args: dict[str, Any] | None) -> bool:
    inp = PolicyInput(agent_id="a", kind="tool_call", target="t", args=args)
    bundle = _bundle(predicate)
    decided = bundle.evaluate(inp).rule_id == "r"
    # The explanation agrees with the fast path, on every row.
    assert bundle.explain(inp)[0].matched is decided
    return decided


MISSING = object()
# (predicate, JSON value or MISSING, matches)
ROWS = [
    ("{gt: 1000}", "1000", False),
    ("{gt: 1000}", "1000.0001", True),
    ("{gt: 1000}", "1e6", True),
    ("{gt: 1000}", '"5000"', False),  # a string is never a number
    ("{gt: 1000}", "true", False),
    ("{gt: 1000}", "null", False),
    ("{gt: 1000}", MISSING, False),
    ("{gte: 1000}", "1000", True),
    ("{gte: 1000}", "1000.0", True),
    ("{lt: 0}", "-1", True),
    ("{lt: 0.001}", "0.00001", True),
    ("{lte: 1000.5}", "1000.5", True),
    ("{gt: 0, lte: 1000}", "0", False),
    ("{gt: 0, lte: 1000}", "0.00001", True),
    ("{type: number}", "1", True),
    ("{type: number}", '"1"', False),
    ("{type: number}", "true", False),
    ("{type: string}", '"500"', True),
    ("{type: string}", "500", False),
    ("{type: bool}", "false", True),
    ("{type: object}", '{"a": 1}', True),
    ("{type: array}", "[1]", True),
    ("{type: null}", "null", True),
    ("{type: null}", MISSING, False),
    ("{exists: true}", "null", True),
    ("{exists: true}", MISSING, False),
    ("{exists: false}", MISSING, True),
    ("{absent: true}", MISSING, True),
    ("{absent: true}", "0", False),
    ("{not: {regex: '^1'}}", "25", True),
    ("{not: {regex: '^1'}}", "15", False),
    ("{not: {regex: '^1'}}", MISSING, True),  # `not` is plain negation: add exists: true to require the key
    ("{exists: true, not: {regex: '^1'}}", MISSING, False),
    ("{not: {type: string}}", '"x"', False),
    ("{not: {not: {gt: 5}}}", "6", True),
    ("{type: string, regex: '^5'}", '"500"', True),
    ("{type: number, regex: '^5'}", '"500"', False),
]


@pytest.mark.parametrize(("predicate", "raw", "expected"), ROWS,
                         ids=[f"{p} {r if r is not MISSING else 'missing'}" for p, r, _ in ROWS])
def test_typed_predicate(predicate: str, raw: Any, expected: bool) -> None:
    args = {} if raw is MISSING else {"amount": json.loads(raw)}
    assert _matches(predicate, args) is expected


def test_numbers_decoded_as_decimal_compare_exactly() -> None:
    assert _matches("{gt: 1000}", {"amount": Decimal("1000.0000000000000001")})
    assert not _matches("{gte: 1000.0001}", {"amount": Decimal("1000.00009999")})
    assert _matches("{gte: 1000.0001}", {"amount": 1000.0001})


def test_string_constraints_keep_rebunos_meaning() -> None:
    # The %v text: a million renders 1e+06, and "500" and 500 look alike.
    assert _matches("{regex: '^1e\\+06$'}", {"amount": 1_000_000})
    assert _matches("{equals: '500'}", {"amount": 500}) and _matches("{equals: '500'}", {"amount": "500"})


def test_args_that_are_not_an_object_match_no_argument_rule() -> None:
    bundle = _bundle("{absent: true}")
    assert bundle.evaluate(PolicyInput(agent_id="a", kind="tool_call", target="t", args=None)).rule_id == "default"


@pytest.mark.parametrize(("predicate", "message"), [
    ("{gt: '1000'}", 'line 6: rule "r": when.arguments.amount.gt must be a number, got string "1000"'),
    ("{gt: 017}", "read as different values by YAML 1.1 and YAML 1.2"),
    ("{gt: '1000'}", "a quoted value is a string: write the number without quotes"),
    ("{gt: 1e400}", "must be a finite number"),
    ("{gt: .nan}", "must be a finite number"),
    ("{type: integer}", "when.arguments.amount.type must be one of string, number, bool, object, array, null"),
    ("{exists: yes please}", "when.arguments.amount.exists must be true or false"),
    ("{absent: true, gt: 1}", "absent cannot be combined"),
    ("{exists: true, absent: true}", "exists and absent contradict"),
    ("{not: {}}", "has no constraint"),
    ("{not: {not: {not: {not: {not: {gt: 1}}}}}}", "nested more than 4 deep"),
    ("{greater: 1}", 'unknown key "greater" in when.arguments.amount'),
])
def test_bad_typed_predicates_are_load_errors_with_the_line(predicate: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        _bundle(predicate)
    assert message in info.value.message


def test_a_typed_predicate_never_counts_as_shadowing() -> None:
    text = (
        "rules:\n"
        "  - {id: a, when: {target: t, arguments: {x: {gt: 5}}}, then: {decision: allow}}\n"
        "  - {id: b, when: {target: t, arguments: {x: {gt: 5}}}, then: {decision: deny}}\n"
        "  - {id: c, when: {target: t, arguments: {x: {equals: '9'}}}, then: {decision: deny}}\n"
    )
    assert compile_yaml_bundle(text, revision="r").shadowed_rules() == []
