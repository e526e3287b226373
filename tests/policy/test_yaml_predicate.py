"""Argument values formatted like Go's %v (rebuno-v0.md §3.4) and RE2-only regexes."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from kernel.policy.yaml.predicate import args_decodable, format_value
from kernel.policy.yaml.regex import RegexError, compile_regex

# (raw JSON value, Go %v text). The numbers are decoded the way the kernel decodes args.
FORMATS = [
    ('"ls -la"', "ls -la"),
    ('""', ""),
    ("1000000", "1e+06"),
    ("1048576", "1.048576e+06"),
    ("100000", "100000"),
    ("999999", "999999"),
    ("1.50", "1.5"),
    ("1.0", "1"),
    ("5", "5"),
    ("-5", "-5"),
    ("0", "0"),
    ("-0.0", "-0"),
    ("0.00001", "1e-05"),
    ("0.0001", "0.0001"),
    ("0.000123456", "0.000123456"),
    ("123456.7", "123456.7"),
    ("1234567.8", "1.2345678e+06"),
    ("123456789", "1.23456789e+08"),
    ("1e21", "1e+21"),
    ("1e100", "1e+100"),
    ("1E2", "100"),
    ("0.1", "0.1"),
    ("5e-324", "5e-324"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"),
    ("9007199254740993", "9.007199254740992e+15"),  # above 2^53: precision is lost, as in Go
    ("true", "true"),
    ("false", "false"),
    ("null", "<nil>"),
    ('["a",1]', "[a 1]"),
    ("[]", "[]"),
    ('[null,[true,"x y"]]', "[<nil> [true x y]]"),
    ('{"b":2,"a":"x"}', "map[a:x b:2]"),
    ("{}", "map[]"),
    ('{"z":{"y":1e6,"x":[1.5]}}', "map[z:map[x:[1.5] y:1e+06]]"),
]


@pytest.mark.parametrize(("raw", "text"), FORMATS, ids=[r for r, _ in FORMATS])
def test_format_value_matches_go_percent_v(raw: str, text: str) -> None:
    assert format_value(json.loads(raw)) == text


@pytest.mark.parametrize(
    ("raw", "text"),
    [("1000000", "1e+06"), ("1.50", "1.5"), ("0.00001", "1e-05")],
    ids=["1e6", "1.5", "1e-5"],
)
def test_format_value_formats_decimals_as_float64(raw: str, text: str) -> None:
    assert format_value(json.loads(raw, parse_float=Decimal, parse_int=Decimal)) == text


def test_format_value_handles_deep_nesting_without_recursion() -> None:
    value: Any = "x"
    for _ in range(50_000):
        value = [value]
    assert format_value(value) == "[" * 50_000 + "x" + "]" * 50_000


DECODABLE = [
    ({"command": "ls"}, True),
    ({}, True),
    ({"n": None}, True),
    ({"n": 10**300}, True),
    ({"n": [1, {"m": 10**400}]}, False),  # float64 cannot hold it: Go fails the whole decode
    ({"n": float("inf")}, False),
    ({"n": float("nan")}, False),
    ({"n": Decimal("1e400")}, False),
    ({"n": Decimal("1.5")}, True),
    # The flat fast path: scalars at the top need no walk, and its bounds are exact.
    ({"a": "x", "b": True, "c": None, "d": 5, "e": 0.5, "f": -(10**300)}, True),
    ({"n": 2**1023}, True),  # the edge of the fast path's integer bound: walked, still a float64
    ({"n": 2**1024}, False),
    ({"n": -(2**1024)}, False),
    ({"a": "x", "n": float("-inf")}, False),
    ({"a": "x", "n": [float("nan")]}, False),
    (None, False),
    ([{"command": "ls"}], False),
    ("ls", False),
    (5, False),
]


@pytest.mark.parametrize(("args", "ok"), DECODABLE, ids=[repr(a)[:40] for a, _ in DECODABLE])
def test_args_decodable_only_for_objects_go_can_decode(args: Any, ok: bool) -> None:
    assert args_decodable(args) is ok


SEARCHES = [
    ("rm", "farm", True),
    ("^rm", "farm", False),
    ("^rm$", "rm", True),
    ("rm\\s+-rf", "sudo rm  -rf /", True),
    ("(?i)DROP", "drop table", True),
    ("\\d{3}", "ab12", False),
    ("\\pL", "é", True),
    ("a.c", "a\nc", False),  # RE2 like Go: `.` does not match a newline without (?s)
    ("\\Qa.c\\E", "a.c", True),
    ("\\Qa\\Cb\\E", "a\\Cb", True),
]


@pytest.mark.parametrize(("pattern", "text", "found"), SEARCHES, ids=[p for p, _, _ in SEARCHES])
def test_regex_is_an_unanchored_re2_search(pattern: str, text: str, found: bool) -> None:
    assert compile_regex(pattern)(text) is found


NOT_RE2 = [
    ("(?=a)b", "invalid perl operator"),
    ("(?!a)b", "invalid perl operator"),
    ("(?<=a)b", "invalid perl operator"),
    ("(?<!a)b", "invalid perl operator"),
    ("(a)\\1", "invalid escape sequence"),
    ("(?P<n>a)(?P=n)", "invalid"),
    ("a++", "bad repetition operator"),
    ("(?>a)", "invalid"),
    ("\\Z", "invalid escape sequence"),
    ("\\C", "invalid escape sequence: \\\\C"),
    ("a{1001}", "invalid repetition size"),
    ("(", "missing \\)"),
    ("[a", "missing \\]"),
    ("*a", "no argument for repetition operator"),
]


@pytest.mark.parametrize(("pattern", "message"), NOT_RE2, ids=[p for p, _ in NOT_RE2])
def test_regex_rejects_constructs_re2_lacks(pattern: str, message: str) -> None:
    with pytest.raises(RegexError, match=message):
        compile_regex(pattern)


def test_regex_search_tolerates_lone_surrogate_in_value() -> None:
    assert compile_regex("a.b")("a\ud800b") is True


AGREEMENT_PATTERNS = ["^ls", "ls", "^(ls|cat)( |$)", "", "x*", "^$", "(?i)é", "\\d+", "a.b", "^[0-9]{4,}$", "\\b"]
AGREEMENT_TEXTS = ["ls -la", "", "cat", "aé", "É", "1000", "a\ud800b", "\u00e9\u00e9ls", "x\ny", "日本ls"]


def test_the_direct_matcher_agrees_with_re2s_own_api() -> None:
    """compile_regex/compile_fullmatch call RE2.Match on the UTF-8 bytes directly (the wrapper's
    per-call generator is most of a decision's cost); they must answer what the public
    ``search``/``fullmatch`` answer, lone surrogates (replaced) and empty matches included."""
    import re2

    from kernel.policy.yaml.regex import _OPTIONS, compile_fullmatch, to_valid_unicode

    for pattern in AGREEMENT_PATTERNS:
        search, full = compile_regex(pattern), compile_fullmatch(pattern)
        reference = re2.compile(pattern, _OPTIONS)
        for text in AGREEMENT_TEXTS:
            valid = to_valid_unicode(text)
            assert search(text) is (reference.search(valid) is not None), (pattern, text)
            assert full(text) is (reference.fullmatch(valid) is not None), (pattern, text)
