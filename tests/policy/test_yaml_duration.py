"""Go duration parsing for bundle fields (kernel.duration)."""

from __future__ import annotations

import pytest

from kernel.duration import DurationError, parse_duration, parse_duration_ns

VALID = [
    ("0", 0),
    ("+0", 0),
    ("-0", 0),
    ("-0s", 0),
    ("0s", 0),
    ("300ms", 300_000_000),
    ("1.5h", 5_400_000_000_000),
    ("2h45m", 9_900_000_000_000),
    ("30s", 30_000_000_000),
    ("5m", 300_000_000_000),
    ("1h30m", 5_400_000_000_000),
    (".5s", 500_000_000),
    ("5.s", 5_000_000_000),
    ("1ns", 1),
    ("1us", 1_000),
    ("1\u00b5s", 1_000),
    ("1\u03bcs", 1_000),
    ("1h1m1s1ms1us1ns", 3_661_001_001_001),
    ("+2s", 2_000_000_000),
    ("1.000000001s", 1_000_000_001),
    ("1.0000000019s", 1_000_000_001),  # truncated to the nanosecond
    ("2562047h47m16.854775807s", (1 << 63) - 1),
]


@pytest.mark.parametrize(("text", "ns"), VALID, ids=[t for t, _ in VALID])
def test_parse_duration_accepts_go_syntax(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


INVALID = [
    ("", "invalid duration"),
    ("-", "invalid duration"),
    ("300", "missing unit"),
    ("00", "missing unit"),
    ("5x", 'unknown unit "x"'),
    ("5 s", 'unknown unit " s"'),
    ("5S", 'unknown unit "S"'),
    (".s", "invalid duration"),
    ("s", "invalid duration"),
    ("1h-5m", "unknown unit"),
    ("-5m", "negative duration"),
    ("-1.5h", "negative duration"),
    ("2562047h47m16.854775808s", "out of range"),
    ("1e3s", 'unknown unit "e"'),
]


@pytest.mark.parametrize(("text", "message"), INVALID, ids=[t or "empty" for t, _ in INVALID])
def test_parse_duration_rejects(text: str, message: str) -> None:
    with pytest.raises(DurationError, match=message):
        parse_duration_ns(text)


def test_parse_duration_rejects_non_strings() -> None:
    with pytest.raises(DurationError, match="must be a string"):
        parse_duration_ns(300)  # type: ignore[arg-type]


def test_parse_duration_returns_seconds() -> None:
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration("300ms") == 0.3
