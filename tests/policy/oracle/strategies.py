"""Hypothesis strategies for step inputs that stress decision fidelity: numbers as JSON lexemes
(around ±2^53, around and beyond int64, decimals of 1–17 significant digits, exponents, -0, past
float64's range), unicode and control characters, nested objects and arrays, times."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

_2_53 = 1 << 53
_2_63 = 1 << 63


def _int_lexeme() -> st.SearchStrategy[str]:
    near = st.sampled_from([0, 1000, _2_53, -_2_53, _2_63, -_2_63, _2_63 - 1, 1 << 64, 10**30])
    return st.one_of(
        st.builds(lambda base, k: str(base + k), near, st.integers(-3, 3)),
        st.integers(-(10**25), 10**25).map(str),
        st.integers(-2000, 2000).map(str),
    )


def _decimal_lexeme() -> st.SearchStrategy[str]:
    """A decimal with 1–17 significant digits, positional or with an exponent (e, E, signed)."""
    def build(digits: int, mantissa: int, point: int, exp: int | None, e: str, sign: str) -> str:
        text = str(mantissa)  # `digits` significant digits, the first one not 0
        whole, frac = text[:point], text[point:]
        lexeme = f"{sign}{whole or '0'}.{frac}" if frac else f"{sign}{whole}"
        return lexeme if exp is None else f"{lexeme}{e}{exp}"

    return st.integers(1, 17).flatmap(lambda d: st.builds(
        build, st.just(d), st.integers(10 ** (d - 1), 10**d - 1), st.integers(0, d),
        st.none() | st.integers(0, 30), st.sampled_from(["e", "E", "e+", "e-", "E-"]), st.sampled_from(["", "-"])))


def _near_threshold() -> st.SearchStrategy[str]:
    """Within a few units in the last place of 1000 and 0, and the issue's repros."""
    def ulps(base: float, k: int) -> str:
        x = base
        for _ in range(abs(k)):
            x = math.nextafter(x, math.inf if k > 0 else -math.inf)
        return repr(x)

    return st.one_of(
        st.builds(ulps, st.sampled_from([1000.0, 0.0, 1.0]), st.integers(-6, 6)),
        st.sampled_from(["1000.0000004", "1000.00000001", "0.0000004", "999.9999996", "1000.0", "1e3", "1E3",
                         "1e6", "-0", "-0.0", "0.0", "1.7976931348623157e308", "2.2250738585072014e-308"]),
    )


OUT_OF_RANGE = st.sampled_from(["1e400", "-1e400", "5e-324", "1e-320", "-2e-310"])


def number_lexemes(out_of_range: bool = True) -> st.SearchStrategy[str]:
    """Any of the above; a number past float64's range one time in 40 when ``out_of_range`` (one
    such leaf decides the whole document, so more would waste the examples)."""
    inside = st.one_of(_int_lexeme(), _decimal_lexeme(), _near_threshold())
    if not out_of_range:
        return inside
    return st.integers(0, 39).flatmap(lambda i: OUT_OF_RANGE if i == 0 else inside)


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
STRINGS = st.one_of(TEXT, st.sampled_from(["", "a\nb", 'x", "decision": "allow', "ls\x00; rm -rf /", "é", "\u2028",
                                           "<&>", "\\", "1000", "1e6"]))


@dataclass(frozen=True)
class Raw:
    """A JSON lexeme, written into the text as it is."""

    text: str


def json_values(max_leaves: int = 12, out_of_range: bool = True) -> st.SearchStrategy[Any]:
    scalars = st.one_of(number_lexemes(out_of_range).map(Raw), STRINGS, st.booleans(), st.none())
    return st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(STRINGS, inner, max_size=4)),
        max_leaves=max_leaves,
    )


def to_text(value: Any) -> str:
    """JSON text of a value whose numbers are Raw lexemes (strings as Python's encoder writes
    them, ensure_ascii=False: the form the kernel gives rego-cpp)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{to_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def args_objects(out_of_range: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.one_of(st.sampled_from(["amount", "command", "n"]), STRINGS),
                           json_values(out_of_range=out_of_range), max_size=5)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def times() -> st.SearchStrategy[tuple[str, int]]:
    """(an RFC 3339 time as the kernel's clock or a case file writes it, its Unix nanoseconds)."""
    def build(seconds: int, micros: int, form: int, offset_minutes: int) -> tuple[str, int]:
        when = _EPOCH + timedelta(seconds=seconds, microseconds=micros)
        ns = (seconds * 1_000_000 + micros) * 1000
        if form == 0:  # the kernel's clock (kernel.clock.rfc3339)
            return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z", ns
        if form == 1:
            return when.replace(tzinfo=None).isoformat(timespec="seconds") + "Z", ns - micros * 1000
        local = when.astimezone(timezone(timedelta(minutes=offset_minutes)))
        return local.isoformat(timespec="microseconds"), ns

    return st.builds(build, st.integers(0, 7_000_000_000), st.integers(0, 999_999), st.integers(0, 2),
                     st.integers(-14 * 60, 14 * 60))
