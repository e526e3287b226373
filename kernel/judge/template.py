"""The judge provider's `body` template: the subset of Go's text/template that provider files use.

Upstream provider files (rebuno `examples/judges/*.yaml`) are Go templates over
`{ToolCall, Question, Criteria, Instructions}`. Regent renders the same files without running any
code: a template is parsed once, at load, into text, field references (`{{.A.B}}`), `{{json .A}}`
and `{{if .A}}…{{else}}…{{end}}` blocks (with `{{-`/`-}}` trimming); anything else is a load error.
Rendering only reads fields of the request and stops at `max_bytes` of output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Template", "TemplateError"]

_ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.S)
_FIELD = re.compile(r"^(\.(?:[A-Za-z_][A-Za-z0-9_]*)?(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")


class TemplateError(ValueError):
    """The template uses something outside the supported subset, or rendering went too far."""


@dataclass(frozen=True, slots=True)
class _Text:
    text: str


@dataclass(frozen=True, slots=True)
class _Value:
    path: tuple[str, ...]
    as_json: bool


@dataclass(frozen=True, slots=True)
class _If:
    path: tuple[str, ...]
    then: tuple[Any, ...]
    otherwise: tuple[Any, ...]


class Template:
    def __init__(self, source: str) -> None:
        self.source = source
        self._nodes = _parse(source)

    def render(self, data: Mapping[str, Any], max_bytes: int) -> str:
        out: list[str] = []
        budget = [max_bytes]
        _render(self._nodes, data, out, budget)
        return "".join(out)


def _path(expr: str) -> tuple[str, ...]:
    m = _FIELD.match(expr)
    if m is None:
        raise TemplateError(f"unsupported template expression {expr!r} (fields such as .ToolCall only)")
    return tuple(p for p in expr.split(".") if p)


def _parse(source: str) -> tuple[Any, ...]:
    # A flat token list first (text and actions, with Go's trim markers applied), then blocks.
    tokens: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(source):
        text = source[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        if tokens and tokens[-1][0] == "trim":
            tokens.pop()
            text = text.lstrip()
        tokens.append(("text", text))
        tokens.append(("action", m.group(2)))
        if m.group(3):
            tokens.append(("trim", ""))
        pos = m.end()
    tail = source[pos:]
    if tokens and tokens[-1][0] == "trim":
        tokens.pop()
        tail = tail.lstrip()
    if "{{" in tail or "}}" in tail:
        raise TemplateError("unbalanced {{ }} in template")
    tokens.append(("text", tail))
    nodes, _, end = _block(tokens, 0)
    if end is not None:
        raise TemplateError(f"unexpected {{{{{end}}}}} in template")
    return nodes


def _block(tokens: list[tuple[str, str]], i: int) -> tuple[tuple[Any, ...], int, str | None]:
    nodes: list[Any] = []
    while i < len(tokens):
        kind, value = tokens[i]
        i += 1
        if kind == "text":
            if value:
                nodes.append(_Text(value))
            continue
        words = value.split()
        if not words:
            raise TemplateError("empty {{ }} in template")
        if words[0] in ("else", "end"):
            if len(words) != 1:
                raise TemplateError(f"unsupported template action {value!r}")
            return tuple(nodes), i, words[0]
        if words[0] == "if":
            if len(words) != 2:
                raise TemplateError(f"unsupported condition {value!r} (if .Field only)")
            then, i, stop = _block(tokens, i)
            otherwise: tuple[Any, ...] = ()
            if stop == "else":
                otherwise, i, stop = _block(tokens, i)
            if stop != "end":
                raise TemplateError(f"{{{{{value}}}}} has no {{{{end}}}}")
            nodes.append(_If(_path(words[1]), then, otherwise))
        elif words[0] == "json":
            if len(words) != 2:
                raise TemplateError(f"unsupported template action {value!r} (json .Field only)")
            nodes.append(_Value(_path(words[1]), as_json=True))
        elif len(words) == 1:
            nodes.append(_Value(_path(words[0]), as_json=False))
        else:
            raise TemplateError(f"unsupported template action {value!r}")
    return tuple(nodes), i, None


def _lookup(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, (list, dict)) and not value)


def _render(nodes: tuple[Any, ...], data: Mapping[str, Any], out: list[str], budget: list[int]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            piece = node.text
        elif isinstance(node, _Value):
            value = _lookup(data, node.path)
            if node.as_json:
                try:  # NaN and infinities are not JSON: a request holding one is not sent
                    piece = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                except ValueError:
                    raise TemplateError("the judge request would hold a number that is not finite") from None
            else:
                piece = "<no value>" if value is None else value if isinstance(value, str) else json.dumps(value)
        else:
            _render(node.then if _truthy(_lookup(data, node.path)) else node.otherwise, data, out, budget)
            continue
        budget[0] -= len(piece.encode())
        if budget[0] < 0:
            raise TemplateError("the rendered judge request is too large")
        out.append(piece)
