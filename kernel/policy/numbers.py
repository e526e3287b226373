"""The numbers both policy engines compare alike, and the one answer for an input holding another."""

from __future__ import annotations

from typing import Any

__all__ = ["OUT_OF_RANGE_RULE", "out_of_range_reason", "unrepresentable_number"]

# rego-cpp reads a number with std::stod when a rule compares or computes with it; stod fails
# below the smallest normal float64 (5e-324, 1e-320) and beyond the largest (1e400 decodes to
# inf), so Rego could only error there while YAML compared. Both engines deny such an input.
_MIN_NORMAL = 2.2250738585072014e-308
_MAX = 1.7976931348623157e308
OUT_OF_RANGE_RULE = "eval-error"


def unrepresentable_number(value: Any) -> float | None:
    """The first float in ``value`` (decoded JSON) that is not finite, or not zero but smaller
    in magnitude than float64's smallest normal number; None when there is none."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is float:
            if v != 0.0 and not _MIN_NORMAL <= abs(v) <= _MAX:  # NaN fails both comparisons
                return v  # type: ignore[no-any-return]
        elif t is dict:
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
    return None


def out_of_range_reason(number: float) -> str:
    return (f"input number {number!r} is outside the range policies compare (a float64 that is "
            "finite and 0 or at least 2.2250738585072014e-308 in magnitude)")
