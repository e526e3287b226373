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
_NO_MATCH = (-1, -1)


def to_valid_unicode(s: str) -> str:
    """Replace lone surrogates with U+FFFD, as Go's JSON decoder does before policy sees a string."""
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def compile_regex(pattern: str) -> Callable[[str], bool]:
    """Compile a Go/RE2 pattern for unanchored search; raises RegexError for anything Go's regexp
    rejects: look-around, back-references, possessive quantifiers, ``\\C``, bad syntax."""
    _reject_any_byte_escape(pattern)
    return _matcher(_compile(pattern), unanchored=True)


def compile_fullmatch(pattern: str) -> Callable[[str], bool]:
    """Compile an RE2 pattern that must match the whole text (used for translated globs)."""
    return _matcher(_compile(pattern), unanchored=False)


def _matcher(regexp: re2._Regexp, *, unanchored: bool) -> Callable[[str], bool]:
    """Match/no-match of ``regexp`` on a str, straight through the binding's ``RE2.Match``.

    ``_Regexp.search``/``fullmatch`` run a generator per call that maps byte offsets back to str
    offsets and builds a match object; a decision needs neither, and that wrapper cost more than
    RE2's own matching on policy-sized text (about 2 of a 1-rule YAML decision's 4 us). The text is
    encoded to UTF-8 as the wrapper does (RE2's default encoding); a lone surrogate, which UTF-8
    cannot hold, becomes U+FFFD first, as Go's decoder would have made it.
    """
    raw = getattr(regexp, "_regexp", None)
    match = getattr(raw, "Match", None)
    anchor = getattr(re2, "_Anchor", None)
    if match is None or anchor is None:  # another binding: its public API, slower but the same
        public = regexp.search if unanchored else regexp.fullmatch

        def matches_public(text: str) -> bool:
            try:
                return public(text) is not None
            except UnicodeEncodeError:
                return public(to_valid_unicode(text)) is not None

        return matches_public
    how = anchor.UNANCHORED if unanchored else anchor.ANCHOR_BOTH

    def matches(text: str) -> bool:
        try:
            data = text.encode()
        except UnicodeEncodeError:
            data = to_valid_unicode(text).encode()
        found: bool = match(how, data, 0, len(data))[0] != _NO_MATCH
        return found

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
