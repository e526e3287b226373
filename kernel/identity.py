"""Step identity: canonical JSON (number lexemes kept, Go-style escaping), args_hash, step_id, ids."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import uuid

from kernel.errors import ValidationError

MAX_DEPTH = 512

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING_CHUNK = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_GO_ESCAPE = {
    '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
    "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029",
}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')


def _go_escape_char(m: re.Match[str]) -> str:
    c = m.group(0)
    if c in _GO_ESCAPE:
        return _GO_ESCAPE[c]
    if "\ud800" <= c <= "\udfff":
        return "\ufffd"  # an unpaired surrogate is replaced, as Go's encoder does
    return f"\\u{ord(c):04x}"


def _encode_string(s: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(_go_escape_char, s) + '"'


class _Parser:
    """A small JSON parser that emits canonical text directly (iterative depth check)."""

    __slots__ = ("pos", "text")

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ValidationError:
        return ValidationError(f"validation error: malformed JSON at offset {self.pos}: {what}")

    def ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def value(self, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise ValidationError(f"validation error: JSON nested deeper than {MAX_DEPTH}")
        self.ws()
        t = self.text
        if self.pos >= len(t):
            raise self.fail("unexpected end")
        c = t[self.pos]
        if c == "{":
            self.pos += 1
            members: dict[str, str] = {}
            self.ws()
            if t.startswith("}", self.pos):
                self.pos += 1
                return "{}"
            while True:
                self.ws()
                if not t.startswith('"', self.pos):
                    raise self.fail("expected a key")
                key = self.string()
                self.ws()
                if not t.startswith(":", self.pos):
                    raise self.fail("expected ':'")
                self.pos += 1
                members[key] = self.value(depth + 1)  # duplicate keys: the last one wins
                self.ws()
                if t.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if t.startswith("}", self.pos):
                    self.pos += 1
                    break
                raise self.fail("expected ',' or '}'")
            items = sorted(members.items(), key=lambda kv: kv[0].encode("utf-8", "surrogatepass"))
            return "{" + ",".join(_encode_string(k) + ":" + v for k, v in items) + "}"
        if c == "[":
            self.pos += 1
            out: list[str] = []
            self.ws()
            if t.startswith("]", self.pos):
                self.pos += 1
                return "[]"
            while True:
                out.append(self.value(depth + 1))
                self.ws()
                if t.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if t.startswith("]", self.pos):
                    self.pos += 1
                    break
                raise self.fail("expected ',' or ']'")
            return "[" + ",".join(out) + "]"
        if c == '"':
            return _encode_string(self.string())
        for lit in ("true", "false", "null"):
            if t.startswith(lit, self.pos):
                self.pos += len(lit)
                return lit
        m = _NUMBER.match(t, self.pos)
        if m and m.end() > self.pos:
            self.pos = m.end()
            return m.group(0)  # the exact source lexeme
        raise self.fail(f"unexpected {c!r}")

    def string(self) -> str:
        t = self.text
        self.pos += 1
        parts: list[str] = []
        while True:
            m = _STRING_CHUNK.match(t, self.pos)
            parts.append(m.group(0))  # type: ignore[union-attr]
            self.pos = m.end()  # type: ignore[union-attr]
            if self.pos >= len(t):
                raise self.fail("unterminated string")
            c = t[self.pos]
            if c == '"':
                self.pos += 1
                break
            if c != "\\":
                raise self.fail("control character in string")
            esc = t[self.pos + 1 : self.pos + 2]
            if esc in _ESCAPES:
                parts.append(_ESCAPES[esc])
                self.pos += 2
            elif esc == "u":
                hexd = t[self.pos + 2 : self.pos + 6]
                if len(hexd) != 4 or not all(h in "0123456789abcdefABCDEF" for h in hexd):
                    raise self.fail("bad \\u escape")
                cp = int(hexd, 16)
                self.pos += 6
                if 0xD800 <= cp <= 0xDBFF and t.startswith("\\u", self.pos):
                    low_hex = t[self.pos + 2 : self.pos + 6]
                    if len(low_hex) == 4 and all(h in "0123456789abcdefABCDEF" for h in low_hex):
                        low = int(low_hex, 16)
                        if 0xDC00 <= low <= 0xDFFF:
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                            self.pos += 6
                parts.append("\ufffd" if 0xD800 <= cp <= 0xDFFF else chr(cp))
            else:
                raise self.fail("bad escape")
        return "".join(parts)


def canonical_json(raw: bytes | str | None) -> str:
    """The canonical text of spec §1.2. Absent or empty → `null`; the first JSON value is read."""
    if raw is None:
        return "null"
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not text.strip():
        return "null"
    return _Parser(text).value(0)


def args_hash(raw: bytes | str | None) -> str:
    return hashlib.sha256(canonical_json(raw).encode("utf-8")).hexdigest()


def _hash_canonical(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _l(s: str) -> str:
    return f"{len(s.encode('utf-8'))}:{s}"


def step_id(execution_id: str, kind: str, target: str, args_hash: str, occurrence: int) -> str:
    msg = _l(execution_id) + _l(kind) + _l(target) + _l(args_hash) + _l(str(occurrence))
    return hashlib.sha256(msg.encode("utf-8")).hexdigest()


def parse_uuid(text: str) -> str:
    """Any accepted UUID spelling → the canonical lowercase hyphenated form."""
    s = text.strip()
    if s.lower().startswith("urn:uuid:"):
        s = s[9:]
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    if not (len(s) == 36 and s.count("-") == 4) and not (len(s) == 32 and "-" not in s):
        raise ValidationError(f"validation error: invalid id {text!r}")
    try:
        return str(uuid.UUID(hex=s))
    except ValueError:
        raise ValidationError(f"validation error: invalid id {text!r}") from None


_uuid_lock = threading.Lock()
_last = [0, 0]  # millisecond, counter


def new_uuid7() -> str:
    """A UUIDv7, monotonic within the process (a counter in rand_a for the same millisecond)."""
    with _uuid_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last[0]:
            ms = _last[0]
            _last[1] += 1
            if _last[1] > 0xFFF:
                ms += 1
                _last[1] = 0
        else:
            _last[1] = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _last[0] = ms
        counter = _last[1]
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))
