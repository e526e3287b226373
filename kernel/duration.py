"""Go duration strings (`300ms`, `1.5h`, `2h45m`, `0`) as used by bundles and config files.

Syntax is Go's ``time.ParseDuration``: an optional sign, then one or more ``<number><unit>``
pairs where the number may have a fraction (``1.5h``, ``.5s``) and the unit is one of ``ns``,
``us`` (or ``µs``/``μs``), ``ms``, ``s``, ``m``, ``h``; the bare string ``0`` is zero. Unlike Go,
a negative duration is rejected: Rebuno accepts ``-5m`` and then creates already-expired approvals
(rebuno-v0.md §3.1 [Q]); Regent refuses it at load instead. ``-0s`` is zero, not negative.
"""

from __future__ import annotations

__all__ = ["DurationError", "parse_duration", "parse_duration_ns"]

_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3_600 * 1_000_000_000,
}
_MAX_NS = (1 << 63) - 1  # Go's time.Duration is an int64 of nanoseconds
_DIGITS = frozenset("0123456789")


class DurationError(ValueError):
    """A string that is not a non-negative Go duration."""


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration string into whole nanoseconds; raises DurationError."""
    if not isinstance(text, str):
        raise DurationError(f"duration must be a string, got {type(text).__name__}")
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise DurationError(f"invalid duration {_quote(text)}")
    total = 0
    i, n = 0, len(s)
    while i < n:
        if s[i] != "." and s[i] not in _DIGITS:
            raise DurationError(f"invalid duration {_quote(text)}")
        start = i
        while i < n and s[i] in _DIGITS:
            i += 1
        whole = s[start:i]
        fraction = ""
        if i < n and s[i] == ".":
            i += 1
            start = i
            while i < n and s[i] in _DIGITS:
                i += 1
            fraction = s[start:i]
        if not whole and not fraction:  # ".s", "-.5" without digits before or after the point
            raise DurationError(f"invalid duration {_quote(text)}")
        start = i
        while i < n and s[i] != "." and s[i] not in _DIGITS:
            i += 1
        unit = s[start:i]
        if not unit:
            raise DurationError(f"missing unit in duration {_quote(text)}")
        scale = _UNIT_NS.get(unit)
        if scale is None:
            raise DurationError(f"unknown unit {_quote(unit)} in duration {_quote(text)}")
        # Exact integer arithmetic; Go truncates the fraction the same way (to the nanosecond).
        total += int(whole or "0") * scale
        if fraction:
            total += int(fraction) * scale // 10 ** len(fraction)
        if total > _MAX_NS:
            raise DurationError(f"invalid duration {_quote(text)}: out of range")
    if negative and total:
        raise DurationError(f"negative duration {_quote(text)} is not allowed")
    return total


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds (float); raises DurationError."""
    return parse_duration_ns(text) / 1_000_000_000


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
