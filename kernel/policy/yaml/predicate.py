"""Argument predicates (rebuno-v0.md §3.4): Go `%v` formatting of decoded JSON, and constraints.

Rebuno decodes `args` into Go's `map[string]any` (numbers become float64) and formats each value
with `fmt.Sprintf("%v", v)`; the constraints then compare strings. This module reproduces that
formatting exactly and compiles each constraint once, at load.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

__all__ = [
    "COMPARISONS",
    "JSON_TYPES",
    "Predicate",
    "args_decodable",
    "comparison",
    "format_float",
    "format_value",
    "is_number",
    "type_check",
]


def format_value(value: Any) -> str:
    """Format a decoded JSON value the way Go's ``%v`` formats it after ``json.Unmarshal``.

    Iterative, so arbitrarily deep values cannot exhaust the Python stack.
    """
    if isinstance(value, str):
        return value
    if not isinstance(value, (dict, list, tuple)):
        return _format_scalar(value)
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):  # a string value or a piece of punctuation: both print as-is
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = ["map["]
            for i, key in enumerate(sorted(item)):
                if i:
                    parts.append(" ")
                parts.append(f"{key}:")
                parts.append(item[key])
            parts.append("]")
            stack.extend(reversed(parts))
        elif isinstance(item, (list, tuple)):
            parts = ["["]
            for i, element in enumerate(item):
                if i:
                    parts.append(" ")
                parts.append(element)
            parts.append("]")
            stack.extend(reversed(parts))
        else:
            out.append(_format_scalar(item))
    return "".join(out)


def _format_scalar(value: Any) -> str:
    if value is None:
        return "<nil>"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float, Decimal)):  # Decimal: args decoded with parse_float=Decimal
        try:
            return format_float(float(value))
        except OverflowError:
            return "+Inf" if value > 0 else "-Inf"
    return str(value)


def format_float(f: float) -> str:
    """Go's ``strconv.FormatFloat(f, 'g', -1, 64)``: shortest round-trip digits, exponent form
    when the decimal exponent is < -4 or >= 6 (the shortest-precision threshold is 6, not 21)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, f) < 0 else ""
    if f == 0:
        return sign + "0"
    # repr() gives the same shortest round-trip digits as Go; re-lay them out with Go's rule.
    mantissa, _, exponent = repr(abs(f)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    stripped = digits.lstrip("0")
    point = (
        len(whole) + int(exponent or 0) - (len(digits) - len(stripped))
    )  # value = 0.DIGITS * 10**point
    digits = stripped.rstrip("0")
    exp = point - 1
    if exp < -4 or exp >= 6:
        rest = digits[1:]
        body = digits[0] + ("." + rest if rest else "")
        return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


_SAFE_INT = 1 << 1023


def args_decodable(args: Any) -> bool:
    """Whether Go would decode ``args`` into ``map[string]any`` at all: it must be an object, and
    every number must fit a finite float64 (``1e400`` or a huge integer fails the whole decode)."""
    if not isinstance(args, dict):
        return False
    for value in args.values():  # flat args (the usual) need no walk; anything else is walked
        kind = type(value)
        if kind is str or kind is bool or value is None:
            continue
        if kind is int and -_SAFE_INT < value < _SAFE_INT:  # converts to a finite float64
            continue
        if kind is float and value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
            continue
        break
    else:
        return True
    stack: list[Any] = [args]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, (float, Decimal)):
            if not math.isfinite(item):  # a Decimal too large for float64 converts to inf
                return False
        elif isinstance(item, int) and not isinstance(item, bool):
            try:
                float(item)
            except OverflowError:
                return False
    return True


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float, Decimal)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, (list, tuple)),
    "null": lambda v: v is None,
}
JSON_TYPES = tuple(_JSON_TYPES)
COMPARISONS = ("gt", "gte", "lt", "lte")
_COMPARE = {
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def type_check(name: str) -> Callable[[Any], bool]:
    """`type: NAME` on the JSON value (string, number, bool, object, array, null)."""
    return _JSON_TYPES[name]


def comparison(op: str, bound: int | float, text: str) -> Callable[[Any], bool]:
    """`gt`/`gte`/`lt`/`lte` on the JSON value: only numbers compare (a string "500" never does).

    ints and floats compare exactly against the bound as written (Python compares int and float
    mathematically); args decoded with ``parse_float=Decimal`` compare against the bound's text.
    """
    compare = _COMPARE[op]
    exact = Decimal(text) if text else Decimal(bound)

    def check(value: Any) -> bool:
        t = type(value)
        if t is int or t is float:
            return bool(compare(value, bound))
        if t is Decimal:
            return bool(compare(value, exact))
        return False

    return check


@dataclass(frozen=True, slots=True, eq=False)
class Predicate:
    """One compiled ``arguments.<key>`` predicate. Empty/None constraints are unset.

    Rebuno's constraints (``equals``, ``contains``, ``one_of``, ``regex``) compare the ``%v`` text;
    Regent's typed ones (``checks``: ``type``, ``gt``…; ``presence``: ``exists``/``absent``;
    ``negated``: ``not``) look at the JSON value. ``extended`` is set when any typed one is.
    """

    key: str
    line: int
    equals: str = ""
    contains: str = ""
    one_of: tuple[str, ...] = ()
    regex: str = ""
    one_of_set: frozenset[str] = frozenset()
    search: Callable[[str], bool] | None = None
    checks: tuple[tuple[str, Callable[[Any], bool]], ...] = ()  # (constraint name, test)
    presence: str = ""  # "" (the key must be present), "exists" or "absent"
    negated: Predicate | None = None
    extended: bool = False
    text_checked: bool = True  # any of the string constraints is set

    def first_failure(self, text: str) -> str | None:
        """The first constraint ``text`` fails (``equals``, ``contains``, ``one_of``, ``regex``)."""
        if self.equals and text != self.equals:
            return "equals"
        if self.contains and self.contains not in text:
            return "contains"
        if self.one_of and text not in self.one_of_set:
            return "one_of"
        if self.search is not None and not self.search(text):
            return "regex"
        return None

    def accepts(self, text: str) -> bool:
        return self.first_failure(text) is None

    def text_test(self) -> Callable[[str], bool]:
        """``accepts`` as one closure over only the string constraints that are set, composed once
        for a rule's decision path (``first_failure`` names the failing one, for explain)."""
        tests: list[Callable[[str], bool]] = []
        if self.equals:
            tests.append(partial(operator.eq, self.equals))
        if self.contains:
            needle = self.contains
            tests.append(lambda text: needle in text)
        if self.one_of:
            tests.append(self.one_of_set.__contains__)
        if self.search is not None:
            tests.append(self.search)
        if len(tests) == 1:
            return tests[0]
        frozen = tuple(tests)
        return lambda text: all(test(text) for test in frozen)

    def failure_in(self, args: dict[str, Any]) -> str | None:
        """The first constraint this predicate fails against ``args`` (already a dict): ``exists``
        (key missing), ``absent`` (key present), a typed constraint's name, a string
        constraint's name or ``not``; None when it holds."""
        present = self.key in args
        if self.presence == "absent":
            return "absent" if present else None
        if not present:
            if self.negated is not None and not self.checks and not self.text_checked and not self.presence:
                return None if self.negated.failure_in(args) is not None else "not"
            return "exists"
        value = args[self.key]
        for name, check in self.checks:
            if not check(value):
                return name
        if self.text_checked:
            failed = self.first_failure(value if type(value) is str else format_value(value))
            if failed is not None:
                return failed
        if self.negated is not None and self.negated.failure_in(args) is None:
            return "not"
        return None
