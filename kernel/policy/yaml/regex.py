"""RE2 access for the YAML engine: Go `regexp` syntax, linear-time matching, no stderr logging.

Python's `re` accepts look-around and back-references and can backtrack exponentially; RE2 (the
library Go's regexp follows) rejects the former and matches in linear time, so a bundle that loads
here loads in Rebuno and no argument can stall evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

import re2

__all__ = ["RegexError", "compile_fullmatch", "compile_regex", "to_valid_unicode"]


class RegexError(ValueError):
    """A regex that RE2 (Go's regexp syntax) does not accept."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is reported to the caller, not logged to stderr
    options.never_capture = True  # only match/no-match is needed; lets RE2 stay on its DFA
    return options


_OPTIONS = _options()


def to_valid_unicode(s: str) -> str:
    """Replace lone surrogates with U+FFFD, as Go's JSON decoder does before policy sees a string."""
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def compile_regex(pattern: str) -> Callable[[str], bool]:
    """Compile a Go/RE2 pattern for unanchored search; raises RegexError for anything Go's regexp
    rejects: look-around, back-references, possessive quantifiers, ``\\C``, bad syntax."""
    _reject_any_byte_escape(pattern)
    search = _compile(pattern).search

    def matches(text: str) -> bool:
        try:
            return search(text) is not None
        except UnicodeEncodeError:
            return search(to_valid_unicode(text)) is not None

    return matches


def compile_fullmatch(pattern: str) -> Callable[[str], bool]:
    """Compile an RE2 pattern that must match the whole text (used for translated globs)."""
    fullmatch = _compile(pattern).fullmatch

    def matches(text: str) -> bool:
        try:
            return fullmatch(text) is not None
        except UnicodeEncodeError:
            return fullmatch(to_valid_unicode(text)) is not None

    return matches


def _compile(pattern: str) -> re2._Regexp:
    try:
        return re2.compile(pattern, _OPTIONS)
    except UnicodeEncodeError as exc:
        raise RegexError("pattern is not valid Unicode (lone surrogate)") from exc
    except re2.error as exc:
        detail = exc.args[0] if exc.args else ""
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise RegexError(str(detail) or "invalid regex") from exc


def _reject_any_byte_escape(pattern: str) -> None:
    # RE2 accepts `\C` (any byte) outside a class; Go's regexp does not, and a byte matcher
    # would split UTF-8 code points. `\Q...\E` runs are literal text, where `\C` is harmless.
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] != "\\" or i + 1 >= n:
            i += 1
            continue
        nxt = pattern[i + 1]
        if nxt == "C":
            raise RegexError("invalid escape sequence: \\C")
        if nxt == "Q":
            end = pattern.find("\\E", i + 2)
            i = n if end < 0 else end + 2
            continue
        i += 2
