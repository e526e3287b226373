"""Ids: UUID spellings parsed to one form, new UUIDv7s, and whole numbers read from text."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

from kernel.errors import invalid

_UUID36 = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")


def parse_uuid(text: str) -> str:
    """Any accepted UUID spelling → the canonical lowercase hyphenated form.

    Accepted, as Go's uuid.Parse: the 36-character form (any case), `urn:uuid:` + it (prefix in
    any case), `{` it `}`, and 32 hex digits. Nothing else: no surrounding whitespace, no `0x`,
    `+` or `_` (which Python's `int(…, 16)` inside `uuid.UUID` would otherwise let through).
    """
    s = text
    if len(s) == 45 and s[:9].lower() == "urn:uuid:":
        s = s[9:]
    elif len(s) == 38 and s[0] == "{" and s[-1] == "}":
        s = s[1:-1]
    if _UUID36.fullmatch(s):
        return s.lower()
    if _HEX32.fullmatch(s):
        return str(uuid.UUID(hex=s))
    raise invalid(f"invalid id {text!r}")


INT64_MAX = 2**63 - 1
_INT64_DIGITS = len(str(INT64_MAX))


def whole_number(text: str | None, most: int = INT64_MAX) -> int | None:
    """`text` as a whole number from 0 to `most` (at most INT64_MAX) when it is plain ASCII decimal
    digits (no sign, space or underscore), else None. `str.isdigit` alone is not enough before
    `int`: it also passes superscripts such as "²", which `int` refuses, and digits of any length.
    Read on every agent call (the lease's attempt, the body's length)."""
    if not text or len(text) > _INT64_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    n = int(text)
    return n if n <= most else None


_uuid_lock = threading.Lock()
_uuid_last = [0, 0]  # the last millisecond used, and the counter within it


def new_uuid7() -> str:
    """A UUIDv7, monotonic within the process (a counter in rand_a for the same millisecond)."""
    with _uuid_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _uuid_last[0]:  # the same millisecond, or the clock stepped back
            ms = _uuid_last[0]
            _uuid_last[1] += 1
            if _uuid_last[1] > 0xFFF:  # 4096 ids in one millisecond: borrow the next one
                ms += 1
                _uuid_last[1] = 0
        else:
            # A random start in the low 10 of the 12 bits leaves room to count up.
            _uuid_last[1] = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _uuid_last[0] = ms
        counter = _uuid_last[1]
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))
