"""Reading a unit test's expressions for coverage: where the `with` clauses start, what they replace."""

from __future__ import annotations

import pytest

from kernel.policy.rego.testcover import instrument_tests, split_with


@pytest.mark.parametrize(("text", "expr", "clauses", "targets"), [
    ("allow", "allow", "", []),
    ('allow with input.x as "a"', "allow", 'with input.x as "a"', ["input.x"]),
    ('count(d) == 0 with input.a as 1 with data.p.r as true', "count(d) == 0",
     "with input.a as 1 with data.p.r as true", ["input.a", "data.p.r"]),
    ('x := [y | y := data.p.r with input as {}]', 'x := [y | y := data.p.r with input as {}]', "", []),
    ('not f("with") with f as g', 'not f("with")', "with f as g", ["f"]),
], ids=["none", "one", "two", "inside-brackets", "string-and-function"])
def test_split_with_finds_top_level_clauses(text: str, expr: str, clauses: str, targets: list[str]) -> None:
    assert split_with(text) == (expr, clauses, targets)


def test_a_test_expression_naming_no_bundle_rule_gets_no_query() -> None:
    policy = "package p\nimport rego.v1\n\nallow if {\n\tinput.x == 1\n}\n"
    tests = "package p_test\nimport rego.v1\n\ntest_a if {\n\t1 == 1\n\tdata.p.allow with input.x as 1\n}\n"
    cover = instrument_tests({"p.rego": policy}, "p/allow", "p_test.rego", tests, ["test_a"])
    [query] = cover.queries["test_a"]
    assert query.roots == (("p", "allow"),)
    # The query repeats the test's earlier expression, then reads the hits under its `with`.
    module = next(v for k, v in cover.modules.items() if k.endswith(".queries.rego"))
    assert "\t1 == 1\n" in module and "with input.x as 1" in module
