"""Target globs (rebuno-v0.md §3.3): Go `path.Match` syntax, whole-string, wildcards cross `/`.

A pattern is parsed once into one of three matchers: plain equality (no metacharacters after
escapes), a star-only matcher (literal runs joined by `*`, done with str methods), or an RE2
program anchored at both ends for patterns with `?` or `[...]`. RE2 keeps matching linear.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from kernel.policy.yaml.regex import RegexError, compile_fullmatch

__all__ = ["Glob", "GlobError", "compile_glob"]


class GlobError(ValueError):
    """A malformed glob pattern (rejected at load)."""


_STAR = object()
_ANY = object()


@dataclass(frozen=True, slots=True)
class _Class:
    negated: bool
    ranges: tuple[tuple[str, str], ...]


_Token = object | str | _Class  # _STAR, _ANY, one literal code point, or a class


@dataclass(frozen=True, slots=True, eq=False)
class Glob:
    """A compiled glob. ``literal`` is set when the pattern is plain equality (after unescaping);
    ``universal`` when it is made only of stars (matches every string). ``prefix`` is the literal
    run every match starts with ("" when the pattern starts with a wildcard or a class)."""

    pattern: str
    literal: str | None
    universal: bool
    match: Callable[[str], bool]
    prefix: str = ""


def compile_glob(pattern: str) -> Glob:
    """Parse and compile ``pattern``; raises GlobError for a malformed one."""
    tokens = _parse(pattern)
    if all(isinstance(t, str) for t in tokens):
        literal = "".join(tokens)  # type: ignore[arg-type]
        return Glob(pattern, literal, False, partial(operator.eq, literal), literal)
    if all(t is _STAR for t in tokens):
        return Glob(pattern, None, True, _always)
    prefix = "".join(_literal_run(tokens))
    if all(t is _STAR or isinstance(t, str) for t in tokens):
        return Glob(pattern, None, False, _star_matcher(tokens), prefix)
    return Glob(pattern, None, False, _re2_matcher(tokens), prefix)


def _literal_run(tokens: list[_Token]) -> list[str]:
    run: list[str] = []
    for t in tokens:
        if not isinstance(t, str):
            break
        run.append(t)
    return run


def _always(_: str) -> bool:
    return True


def _never(_: str) -> bool:
    return False


def _parse(p: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "*":
            tokens.append(_STAR)
            i += 1
        elif c == "?":
            tokens.append(_ANY)
            i += 1
        elif c == "\\":
            if i + 1 >= n:
                raise GlobError('trailing "\\" at the end of the pattern')
            tokens.append(p[i + 1])
            i += 2
        elif c == "[":
            cls, i = _parse_class(p, i + 1)
            tokens.append(cls)
        else:
            tokens.append(c)
            i += 1
    return tokens


def _parse_class(p: str, i: int) -> tuple[_Class, int]:
    """Parse after the ``[``; return the class and the index after its ``]``."""
    n = len(p)
    negated = i < n and p[i] == "^"
    if negated:
        i += 1
    ranges: list[tuple[str, str]] = []
    while True:
        if i < n and p[i] == "]" and ranges:
            return _Class(negated, tuple(ranges)), i + 1
        if i < n and p[i] == "]":
            raise GlobError('empty character class ("]" right after "[" or "[^")')
        if i < n and p[i] == "-":
            where = "unexpected" if ranges else "leading"
            raise GlobError(f'{where} "-" in character class (escape it as "\\-")')
        lo, i = _class_char(p, i)
        hi = lo
        if p[i] == "-":  # _class_char guarantees a following character
            if i + 1 < n and p[i + 1] in "-]":
                raise GlobError('dangling "-" in character class (escape it as "\\-")')
            hi, i = _class_char(p, i + 1)
        ranges.append((lo, hi))


def _class_char(p: str, i: int) -> tuple[str, int]:
    n = len(p)
    if i >= n:
        raise GlobError("unterminated character class")
    c = p[i]
    if c == "\\":
        i += 1
        if i >= n:
            raise GlobError('trailing "\\" at the end of the pattern')
        c = p[i]
    i += 1
    if i >= n:
        raise GlobError("unterminated character class")
    return c, i


def _star_matcher(tokens: list[_Token]) -> Callable[[str], bool]:
    # Literal runs between stars: the first must be a prefix, the last a suffix, and the middle
    # ones found left to right (leftmost-first is optimal for literal runs).
    runs: list[str] = []
    current: list[str] = []
    for t in tokens:
        if t is _STAR:
            runs.append("".join(current))
            current = []
        else:
            current.append(t)  # type: ignore[arg-type]
    runs.append("".join(current))
    head, middle, tail = runs[0], tuple(r for r in runs[1:-1] if r), runs[-1]
    fixed = len(head) + len(tail)

    def match(s: str) -> bool:
        if len(s) < fixed or not s.startswith(head) or not s.endswith(tail):
            return False
        pos, end = len(head), len(s) - len(tail)
        for run in middle:
            found = s.find(run, pos, end)
            if found < 0:
                return False
            pos = found + len(run)
        return True

    return match


def _re2_matcher(tokens: list[_Token]) -> Callable[[str], bool]:
    parts: list[str] = ["(?s)"]  # `*` and `?` cross newlines too
    for t in tokens:
        if t is _STAR:
            parts.append(".*")
        elif t is _ANY:
            parts.append(".")
        elif isinstance(t, _Class):
            # Go accepts a reversed range (`[z-a]`) and it matches nothing; RE2 rejects it.
            ranges = [(lo, hi) for lo, hi in t.ranges if lo <= hi]
            if not ranges:
                if not t.negated:
                    return _never
                parts.append(".")
                continue
            body = "".join(_esc(lo) if lo == hi else f"{_esc(lo)}-{_esc(hi)}" for lo, hi in ranges)
            parts.append(f"[{'^' if t.negated else ''}{body}]")
        else:
            parts.append(_esc(t))  # type: ignore[arg-type]
    try:
        return compile_fullmatch("".join(parts))
    except RegexError as exc:  # only a lone surrogate: every other character is escaped
        raise GlobError(str(exc)) from exc


def _esc(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}"
