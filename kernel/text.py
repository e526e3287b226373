"""Text the stores can keep: neither PostgreSQL's TEXT (no NUL) nor UTF-8 (no lone surrogate,
which JSON's `\\ud800` and Python's `surrogateescape` produce) holds every Python string. Every
layer that takes text from outside (the API, the console, the core's search filters) checks it
here, so the same input gets the same 400 on both stores."""

from __future__ import annotations

import re

from kernel.errors import invalid


def text_problem(value: str) -> str | None:
    """Why `value` cannot be an identifier or a TEXT column (NUL, a lone surrogate), or None.

    PostgreSQL's TEXT holds no NUL, and a lone surrogate (valid in JSON as `\\ud800`) is not
    UTF-8, so neither store can keep one; identifiers are refused rather than altered."""
    if value.isascii():
        return "must not contain NUL" if "\x00" in value else None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (a lone surrogate is not)"
    return "must not contain NUL" if "\x00" in value else None


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_text(value: str, what: str) -> str:
    """`value`, or a 400 naming `what` when it holds NUL or a lone surrogate."""
    problem = text_problem(value)
    if problem is not None:
        raise invalid(f"{what} {problem}")
    return value


def scrub_text(value: str) -> str:
    """Free text that is kept whatever it holds (an execution's `error`): NUL and lone surrogates
    become U+FFFD, as Go's JSON decoder (Rebuno) does with the latter."""
    if text_problem(value) is None:
        return value
    return _UNSTORABLE.sub("\ufffd", value)
