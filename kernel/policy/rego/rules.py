"""Rego rule definitions and their body expressions, with lines (pure: no regopy here).

What the trace (`regent policy eval --explain`), line coverage and the runtime-error locator need:
each rule definition's head line, its body split into top-level expressions, and its place in an
`else` chain. Like `scan.py` this is a tokenizer with bracket depth, not a parser; rego-cpp still
parses every module, and a module this reader cannot follow is reported as not instrumented.
"""

from __future__ import annotations

from dataclasses import dataclass

from .scan import _CONTINUES, _KEYWORDS, Token, tokens

__all__ = ["Expr", "ModuleRules", "RuleDef", "read_rules"]


@dataclass(frozen=True, slots=True)
class Expr:
    text: str
    line: int
    end_line: int


@dataclass(frozen=True, slots=True)
class RuleDef:
    """One definition (or `else` branch) of a rule. ``index`` is its position in the module."""

    name: str  # the head's first segment: "decision", "helper", "f"
    index: int
    line: int  # where the head (or the `else`) is
    end_line: int
    body: tuple[Expr, ...]
    kind: str  # "complete" (:= / bare), "multi" (contains / [key]), "function", "default"
    chain: tuple[int, ...] = ()  # indexes of the earlier branches of its `else` chain
    rule_id: str = ""  # the "rule_id" literal in its head, when there is one
    value: str = ""  # the head's value expression (after `:=`, `=` or `contains`), when it has one


@dataclass(frozen=True, slots=True)
class ModuleRules:
    package: str
    imports: tuple[str, ...]  # the import lines, verbatim
    rules: tuple[RuleDef, ...]


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.toks = tokens(source)
        self.i = 0

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def statement_end(self, start: int) -> int:
        """Index just past the statement starting at ``start`` (depth-0 newline heuristic)."""
        depth = 0
        j = start
        declaration = self.toks[start].text in ("package", "import")  # ends at its line
        while j < len(self.toks):
            t = self.toks[j]
            if (
                j > start
                and depth == 0
                and t.first_on_line
                and (declaration or self.toks[j - 1].text not in _CONTINUES)
                and t.text != "else"
            ):
                return j
            if t.text in "([{" and t.kind == "op":
                depth += 1
            elif t.text in ")]}" and t.kind == "op":
                depth = max(depth - 1, 0)
            j += 1
        return j

    def text(self, a: int, b: int) -> str:
        return self.source[self.toks[a].start : self.toks[b - 1].end]


def _split_body(r: _Reader, a: int, b: int) -> list[Expr]:
    """Top-level expressions of the body tokens [a, b) (inside the braces)."""
    exprs: list[Expr] = []
    depth = 0
    start = a
    j = a
    while j < b:
        t = r.toks[j]
        boundary = (
            j > start
            and depth == 0
            and (
                (t.first_on_line and r.toks[j - 1].text not in _CONTINUES)
                or r.toks[j - 1].text == ";"
            )
        )
        if boundary:
            end = j - 1 if r.toks[j - 1].text == ";" else j
            if end > start:
                exprs.append(Expr(r.text(start, end), r.toks[start].line, r.toks[end - 1].line))
            start = j
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth = max(depth - 1, 0)
        j += 1
    end = b - 1 if b > start and r.toks[b - 1].text == ";" else b
    if end > start:
        exprs.append(Expr(r.text(start, end), r.toks[start].line, r.toks[end - 1].line))
    return exprs


def _matching(r: _Reader, j: int) -> int:
    """Index of the bracket closing the one at ``j``."""
    depth = 0
    while j < len(r.toks):
        t = r.toks[j]
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise ValueError("unbalanced brackets")


def _rule_id(head: str) -> str:
    marker = '"rule_id"'
    k = head.find(marker)
    if k < 0:
        return ""
    rest = head[k + len(marker) :].lstrip()
    if not rest.startswith(":"):
        return ""
    rest = rest[1:].lstrip()
    if not rest.startswith('"'):
        return ""
    end = rest.find('"', 1)
    return rest[1:end] if end > 0 else ""


def _head_value(r: _Reader, a: int, b: int) -> str:
    """The value expression of the head tokens [a, b): after `:=`, `=` or `contains` at depth 0."""
    depth = 0
    for j in range(a, b):
        t = r.toks[j]
        if depth == 0 and ((t.kind == "op" and t.text in (":=", "=")) or (t.kind == "ident" and t.text == "contains")):
            return r.text(j + 1, b) if j + 1 < b else ""
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth = max(depth - 1, 0)
    return ""


def read_rules(source: str) -> ModuleRules:
    """Every rule definition of a module in source order; raises ValueError when the module is
    beyond this reader (unbalanced brackets and the like)."""
    r = _Reader(source)
    package = ""
    imports: list[str] = []
    rules: list[RuleDef] = []
    n = len(r.toks)
    while r.i < n:
        start = r.i
        end = r.statement_end(start)
        first = r.toks[start]
        r.i = end
        if first.text == "package":
            package = r.text(start + 1, end).replace(" ", "")
            continue
        if first.text == "import":
            imports.append(r.text(start, end))
            continue
        if first.kind != "ident" or (first.text in _KEYWORDS and first.text != "default"):
            continue
        if first.text == "default":
            name = r.toks[start + 1].text if start + 1 < end else ""
            rules.append(RuleDef(name, len(rules), first.line, r.toks[end - 1].line, (), "default"))
            continue
        _read_chain(r, start, end, rules)
    return ModuleRules(package, tuple(imports), tuple(rules))


def _read_chain(r: _Reader, start: int, end: int, rules: list[RuleDef]) -> None:
    name = r.toks[start].text
    kind = "complete"
    if start + 1 < end:
        nxt = r.toks[start + 1]
        if nxt.text == "(":
            kind = "function"
        elif nxt.text in ("contains", "["):
            kind = "multi"
    chain: list[int] = []
    j = start
    head_start = start
    while j < end:
        # The head runs to `if` (at depth 0), or to the end of the statement / the next `else`.
        depth = 0
        k = j if j != head_start else head_start
        while k < end:
            t = r.toks[k]
            if depth == 0 and t.text == "if" and t.kind == "ident":
                break
            if depth == 0 and t.text == "else" and t.kind == "ident" and k > head_start:
                break
            if t.kind == "op" and t.text in "([{":
                depth += 1
            elif t.kind == "op" and t.text in ")]}":
                depth = max(depth - 1, 0)
            k += 1
        head_text = r.text(head_start, k) if k > head_start else ""
        body: list[Expr] = []
        last = k
        if k < end and r.toks[k].text == "if":
            if k + 1 < end and r.toks[k + 1].text == "{":
                close = _matching(r, k + 1)
                body = _split_body(r, k + 2, close)
                last = close + 1
            else:  # `head if expr` on one line: the expression runs to an `else` or the end
                m = k + 1
                depth = 0
                while m < end:
                    t = r.toks[m]
                    if depth == 0 and t.text == "else" and t.kind == "ident":
                        break
                    if t.kind == "op" and t.text in "([{":
                        depth += 1
                    elif t.kind == "op" and t.text in ")]}":
                        depth = max(depth - 1, 0)
                    m += 1
                if m > k + 1:
                    body = [Expr(r.text(k + 1, m), r.toks[k + 1].line, r.toks[m - 1].line)]
                last = m
        index = len(rules)
        rules.append(
            RuleDef(
                name,
                index,
                r.toks[head_start].line,
                r.toks[max(last - 1, head_start)].line,
                tuple(body),
                kind,
                tuple(chain),
                _rule_id(head_text),
                _head_value(r, head_start, k) if kind != "function" else "",
            )
        )
        chain.append(index)
        if last < end and r.toks[last].text == "else":
            head_start = last
            j = last
            continue
        break
