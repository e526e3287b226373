"""Step identity: canonical JSON (number lexemes kept, Go-style escaping), args_hash, step_id."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from kernel.errors import ValidationError, invalid

MAX_DEPTH = 512
# Python's own bound on int <-> str conversion (sys.get_int_max_str_digits); a longer integer
# could not be stored or answered, so it is refused at parse time, lexical or not.
MAX_INT_DIGITS = 4300

_JSON_WS = " \t\n\r"
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING_CHUNK = re.compile(r'[^"\\\x00-\x1f]*')
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_GO_ESCAPE = {
    '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
    "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029",
}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029]')
# Characters Go's encoder escapes and Python's (ensure_ascii=False) leaves raw.
_GO_ONLY_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029"))
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


# -- canonical JSON: the exact parser ------------------------------------------------------------


def _encode_string(s: str) -> str:
    """Go's encoder on a string already free of surrogates (see `_Parser.string`)."""
    if _NEEDS_ESCAPE.search(s) is None:
        return '"' + s + '"'
    return '"' + _NEEDS_ESCAPE.sub(_go_escape_char, s) + '"'


def _go_escape_char(m: re.Match[str]) -> str:
    c = m.group(0)
    return _GO_ESCAPE.get(c) or f"\\u{ord(c):04x}"


class _Parser:
    """The reference reading of §1.2: emits canonical text directly, with an explicit stack.

    No recursion, so any nesting depth is answered with a ValidationError whatever the caller's
    stack, and strings are decoded the way Go's decoder does (unpaired surrogates → U+FFFD).
    """

    __slots__ = ("pos", "text")

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ValidationError:
        return invalid(f"malformed JSON at offset {self.pos}: {what}")

    def ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def key(self) -> str:
        self.ws()
        if not self.text.startswith('"', self.pos):
            raise self.fail("expected a key")
        k = self.string()
        self.ws()
        if not self.text.startswith(":", self.pos):
            raise self.fail("expected ':'")
        self.pos += 1
        return k

    def canonical(self) -> str:
        t = self.text
        # One frame per open container: [members dict, pending key] or [items list, None].
        stack: list[list[Any]] = []
        while True:
            self.ws()
            if self.pos >= len(t):
                raise self.fail("unexpected end")
            c = t[self.pos]
            value: str
            if c == "{" or c == "[":
                if len(stack) >= MAX_DEPTH:  # this container would be level MAX_DEPTH + 1
                    raise invalid(f"JSON nested deeper than {MAX_DEPTH}")
                self.pos += 1
                self.ws()
                if t.startswith("}" if c == "{" else "]", self.pos):
                    self.pos += 1
                    value = c + ("}" if c == "{" else "]")
                else:
                    stack.append([{}, self.key()] if c == "{" else [[], None])
                    continue  # read the container's first value
            elif c == '"':
                value = _encode_string(self.string())
            elif t.startswith("true", self.pos):
                self.pos += 4
                value = "true"
            elif t.startswith("false", self.pos):
                self.pos += 5
                value = "false"
            elif t.startswith("null", self.pos):
                self.pos += 4
                value = "null"
            else:
                m = _NUMBER.match(t, self.pos)
                if m is None:
                    raise self.fail(f"unexpected {c!r}")
                self.pos = m.end()
                value = m.group(0)  # the exact source lexeme
            # A value is complete: hand it to the open container, closing containers as they end.
            while True:
                if not stack:
                    return value
                frame = stack[-1]
                members = frame[0]
                is_object = frame[1] is not None
                if is_object:
                    members[frame[1]] = value  # a duplicate key: the last one wins
                else:
                    members.append(value)
                self.ws()
                if t.startswith(",", self.pos):
                    self.pos += 1
                    if is_object:
                        frame[1] = self.key()
                    break  # read the next value
                if t.startswith("}" if is_object else "]", self.pos):
                    self.pos += 1
                    stack.pop()
                    if is_object:
                        # No surrogates survive decoding, so code-point order is UTF-8 byte order.
                        value = "{" + ",".join(_encode_string(k) + ":" + members[k] for k in sorted(members)) + "}"
                    else:
                        value = "[" + ",".join(members) + "]"
                    continue
                raise self.fail("expected ',' or '}'" if is_object else "expected ',' or ']'")

    def string(self) -> str:
        t = self.text
        self.pos += 1
        parts: list[str] = []
        while True:
            m = _STRING_CHUNK.match(t, self.pos)
            chunk = m.group(0)  # type: ignore[union-attr]
            # A raw lone surrogate (from a str caller, or one per invalid byte of a bytes input)
            # becomes U+FFFD here, at decode time, so keys dedup and sort as their replacement.
            parts.append(_SURROGATE.sub("\ufffd", chunk) if not chunk.isascii() else chunk)
            self.pos = m.end()  # type: ignore[union-attr]
            if self.pos >= len(t):
                raise self.fail("unterminated string")
            c = t[self.pos]
            if c == '"':
                self.pos += 1
                return "".join(parts)
            if c != "\\":
                raise self.fail("control character in string")
            esc = t[self.pos + 1 : self.pos + 2]
            if esc in _ESCAPES:
                parts.append(_ESCAPES[esc])
                self.pos += 2
                continue
            if esc != "u" or not _HEX4.fullmatch(t, self.pos + 2, self.pos + 6):
                raise self.fail("bad escape")
            cp = int(t[self.pos + 2 : self.pos + 6], 16)
            self.pos += 6
            # As Go: a high surrogate pairs with an immediately following low-surrogate escape;
            # otherwise it is U+FFFD and the next escape is read on its own.
            if 0xD800 <= cp <= 0xDBFF and t.startswith("\\u", self.pos) and _HEX4.fullmatch(t, self.pos + 2, self.pos + 6):
                low = int(t[self.pos + 2 : self.pos + 6], 16)
                if 0xDC00 <= low <= 0xDFFF:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    self.pos += 6
            parts.append("\ufffd" if 0xD800 <= cp <= 0xDFFF else chr(cp))


def _canonical_exact(text: str) -> str:
    """Canonical text by the exact parser alone (the fast path must always agree with it)."""
    parser = _Parser(text)
    parser.ws()
    if parser.pos == len(text):
        return "null"
    return parser.canonical()


# -- canonical JSON: the fast path -----------------------------------------------------------------

# Python's C scanner and encoder do the work; each number lexeme travels as a string wrapped in a
# lone surrogate, which no decoded string can contain on this path, and is unwrapped afterwards.
_MARK = "\udfff"


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_FAST_DECODER = json.JSONDecoder(parse_int=(_MARK + "{}" + _MARK).format, parse_float=(_MARK + "{}" + _MARK).format,
                                 parse_constant=_reject_constant)
_FAST_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, check_circular=False,
                                 allow_nan=False)


def _fast_eligible(text: str, checked_utf8: bool) -> bool:
    # Surrogates need Go's decoding rules, so they take the exact parser; so does any text that
    # could nest deeper than MAX_DEPTH (counting brackets inside strings too only over-counts).
    if not checked_utf8 and not text.isascii() and _SURROGATE.search(text):
        return False
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        return False
    return text.count("[") + text.count("{") <= MAX_DEPTH


def _canonical_fast(text: str, start: int) -> str:
    value, _ = _FAST_DECODER.raw_decode(text, start)
    out = _FAST_ENCODER.encode(value)
    if _MARK in out:
        out = out.replace('"' + _MARK, "").replace(_MARK + '"', "")
    for char, escape in _GO_ONLY_ESCAPES:
        if char in out:
            out = out.replace(char, escape)
    return out


def canonical_json(raw: bytes | str | None) -> str:
    """The canonical text of spec §1.2. Absent or empty → `null`; only the first JSON value is read.

    Raises ValidationError on malformed JSON or nesting deeper than MAX_DEPTH.
    """
    if raw is None:
        return "null"
    if isinstance(raw, str):
        text, checked_utf8 = raw, False
    else:
        try:
            text, checked_utf8 = raw.decode("utf-8"), True
        except UnicodeDecodeError:
            # surrogateescape: each invalid byte becomes one U+FFFD, as in Go (not one per run).
            text, checked_utf8 = raw.decode("utf-8", "surrogateescape"), False
    start = len(text) - len(text.lstrip(_JSON_WS))
    if start == len(text):
        return "null"
    if _fast_eligible(text, checked_utf8):
        try:
            return _canonical_fast(text, start)
        except (ValueError, RecursionError):
            pass  # malformed (the exact parser words the error) or the caller's stack was deep
    return _canonical_exact(text)


def args_hash(raw: bytes | str | None) -> str:
    """SHA-256 hex of the canonical text of `raw`."""
    return canonical_hash(canonical_json(raw))


def canonical_hash(text: str) -> str:
    """`args_hash` of a text `canonical_json` returned, without canonicalising it again (a
    canonical text is its own canonical text): the submit route has just made it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- step ids --------------------------------------------------------------------------------------


def _l(s: str) -> str:
    return f"{len(s.encode('utf-8'))}:{s}"


def step_id(execution_id: str, kind: str, target: str, args_hash: str, occurrence: int) -> str:
    """SHA-256 hex of L(execution_id)‖L(kind)‖L(target)‖L(args_hash)‖L(occurrence) (spec §1.1)."""
    msg = _l(execution_id) + _l(kind) + _l(target) + _l(args_hash) + _l(str(occurrence))
    return hashlib.sha256(msg.encode("utf-8")).hexdigest()


# -- UUIDs -------------------------------------------------------------------------------------------
