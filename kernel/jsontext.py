"""Compact JSON text, as `json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode` writes it,
at a lower cost per call.

`JSONEncoder.encode` builds the C encoder anew on every call (about a microsecond, as much as
encoding a small payload); a step round trip encodes about ten (event payloads, results, the
answers). Here the C encoder is built once and reused: it is kept without the circular-reference
map (`check_circular=False`), which is the one per-call state it would hold, so one encoder serves
every thread. The values encoded are decoded JSON or dicts the kernel builds, never cyclic.

`dumps`/`loads` are the JSON text of the store's TEXT columns (the core writes the few the store
keeps opaque, a resource's binding and configuration).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _json_encoder
from typing import Any


def compact_encoder(ensure_ascii: bool) -> Callable[[Any], str]:
    """`value -> text`: compact separators, NaN and infinities refused (ValueError), the text
    `JSONEncoder(ensure_ascii=…, separators=(",", ":"), allow_nan=False).encode` gives."""
    fallback = json.JSONEncoder(ensure_ascii=ensure_ascii, separators=(",", ":"), allow_nan=False,
                                check_circular=False)
    make: Any = getattr(_json_encoder, "c_make_encoder", None)
    quote: Any = (getattr(_json_encoder, "c_encode_basestring_ascii", None) if ensure_ascii
                  else getattr(_json_encoder, "c_encode_basestring", None))
    if make is None or quote is None:  # no C accelerator: the plain encoder
        return fallback.encode
    c_encode = make(None, fallback.default, quote, None, ":", ",", False, False, False)
    join = "".join

    def encode(value: Any) -> str:
        if value.__class__ is str:
            return quote(value)  # type: ignore[no-any-return]
        return join(c_encode(value, 0))

    return encode


_encode = compact_encoder(ensure_ascii=False)
_encode_ascii = compact_encoder(ensure_ascii=True)


def dumps(value: Any) -> str:
    """Compact JSON text, raw UTF-8 where it can be. A value holding a lone surrogate (valid JSON,
    which Python's `surrogateescape` makes routinely) is not UTF-8, so its text is written with
    every non-ASCII character escaped instead: stored losslessly, read back the same. (NUL is
    always escaped in JSON text, so TEXT columns never see one.)"""
    text = _encode(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return _encode_ascii(value)
    return text


def dumps_or_none(value: Any) -> str | None:
    return None if value is None else dumps(value)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


__all__ = ["compact_encoder", "dumps", "dumps_or_none", "loads"]
