"""Settings durations: seconds as numbers or Go duration strings, read by the one parser bundles use."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.config import Settings, seconds

_SCALE = {"ns": Fraction(1, 10**9), "us": Fraction(1, 10**6), "µs": Fraction(1, 10**6),
          "ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600)}


@given(st.lists(st.tuples(st.integers(0, 10**5), st.sampled_from(sorted(_SCALE))), min_size=1, max_size=4))
def test_a_duration_string_is_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum((n * _SCALE[unit] for n, unit in parts), Fraction(0))
    assert seconds(text) == pytest.approx(float(expected), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(("value", "expected"), [
    (30, 30.0), (0.25, 0.25), ("30", 30.0), ("0.25", 0.25), (" 5m ", 300.0), ("1h30m", 5400.0),
    ("1.5h", 5400.0), (".5s", 0.5), ("300ms", 0.3), ("0", 0.0), ("", 0.0),
])
def test_settings_durations_read_numbers_and_go_strings(value: object, expected: float) -> None:
    assert seconds(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["+5s", "-5s", "5 s", "1h 30m", "5x", "s", "1d", "-1"])
def test_settings_durations_refuse_signs_spaces_and_unknown_units(value: str) -> None:
    with pytest.raises(ValueError, match=r"not a duration|must not be negative"):
        seconds(value)


def test_a_setting_given_as_a_go_duration_is_read_in_seconds() -> None:
    assert Settings(dispatch_lease_timeout="1m30s").dispatch_lease_timeout == 90.0
