"""Lint: literal times in Rego that rego-cpp's time parsers cannot read (the call is undefined).

rego-cpp 1.5.2's `time.parse_rfc3339_ns` (and `time.parse_ns` with an RFC 3339 layout) is
undefined for a time ending in `Z` and for a lowercase `t`, where OPA parses both; a rule over such
a literal is silently undefined. `regent policy check` warns (an error under `--strict`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from .scan import tokens

__all__ = ["TimeLint", "rego_cpp_parses_time", "time_literal_lints"]

_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d*)?([+-])(\d{2}):?(\d{2})$")
_RFC3339_LAYOUTS = frozenset({"2006-01-02T15:04:05Z07:00", "2006-01-02T15:04:05.999999999Z07:00"})
_NS_RANGE = (-(1 << 63), (1 << 63) - 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class TimeLint:
    code: str  # "unparsable-time"
    file: str
    line: int
    col: int
    message: str


def rego_cpp_parses_time(text: str) -> bool:
    """Whether rego-cpp 1.5.2's `time.parse_rfc3339_ns` gives a value for ``text`` (measured:
    numeric offset, `T`, a valid date and time, within int64 nanoseconds since the epoch)."""
    m = _RFC3339.match(text)
    if m is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    sign = -1 if m.group(8) == "-" else 1
    try:
        tz = timezone(sign * timedelta(hours=int(m.group(9)), minutes=int(m.group(10))))
        when = datetime(year, month, day, hour, minute, second, tzinfo=tz)
    except ValueError:
        return False
    delta = when - _EPOCH
    ns = (delta.days * 86400 + delta.seconds) * 1_000_000_000
    return _NS_RANGE[0] <= ns <= _NS_RANGE[1]


def _string(tok_text: str) -> str | None:
    if tok_text.startswith("`"):
        return tok_text[1:-1]
    try:
        value = json.loads(tok_text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _advice(text: str) -> str:
    if text[-1:] in ("Z", "z"):
        fixed = text[:-1] + "+00:00"
        if len(fixed) > 10 and fixed[10] == "t":
            fixed = fixed[:10] + "T" + fixed[11:]
        return f'rego-cpp reads a UTC offset, not Z: write "{fixed}"'
    return "rego-cpp parses RFC 3339 with a numeric offset (+00:00), between 1677 and 2262"


def time_literal_lints(modules: dict[str, str], display: dict[str, str] | None = None) -> list[TimeLint]:
    """Every literal time passed to `time.parse_rfc3339_ns` (or `time.parse_ns` with an RFC 3339
    layout) that rego-cpp cannot parse, in module and line order."""
    out: list[TimeLint] = []
    for path, source in modules.items():
        toks = tokens(source)
        line_starts = [0] + [i + 1 for i, c in enumerate(source) if c == "\n"]
        for i in range(len(toks) - 5):
            if toks[i].text != "time" or toks[i + 1].text != "." or toks[i + 3].text != "(":
                continue
            name = toks[i + 2].text
            if name == "parse_rfc3339_ns":
                arg = i + 4
            elif name == "parse_ns" and i + 7 < len(toks) and toks[i + 5].text == ",":
                layout = _string(toks[i + 4].text) if toks[i + 4].kind in ("str", "raw") else None
                if layout not in _RFC3339_LAYOUTS:
                    continue
                arg = i + 6
            else:
                continue
            tok = toks[arg]
            if tok.kind not in ("str", "raw") or toks[arg + 1].text != ")":
                continue
            text = _string(tok.text)
            if text is None or rego_cpp_parses_time(text):
                continue
            col = tok.start - line_starts[tok.line - 1] + 1
            out.append(TimeLint("unparsable-time", (display or {}).get(path, path), tok.line, col, (
                f'time.{name}({tok.text}) is undefined in rego-cpp, so every rule over it is '
                f"undefined; {_advice(text)}")))
    return out
