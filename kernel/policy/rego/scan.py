"""A lexical scan of Rego modules: package, imports, rule heads and function calls (pure).

rego-cpp's compiler accepts calls to functions it does not have (they fail, or go undefined, at
evaluation), so the load gate finds calls itself. This is a tokenizer with bracket depth and a
statement-start heuristic, not a parser: rego-cpp still parses every module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Call", "ModuleScan", "Token", "byte_col", "scan_module", "tokens"]

_KEYWORDS = frozenset(
    {
        "not",
        "some",
        "every",
        "if",
        "else",
        "in",
        "with",
        "as",
        "default",
        "import",
        "package",
        "true",
        "false",
        "null",
        "contains",
    }
)
# A line whose previous significant token is one of these continues the statement before it.
_CONTINUES = frozenset(
    {
        ":=",
        "=",
        "==",
        "!=",
        "<",
        ">",
        "<=",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "%",
        "|",
        "&",
        ",",
        ".",
        ":",
        ";",
        "if",
        "else",
        "contains",
        "in",
        "not",
        "with",
        "as",
        "some",
        "every",
        "default",
        "import",
        "package",
    }
)
_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\f\v]+)
  | (?P<nl>\n)
  | (?P<comment>\#[^\n]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>:=|==|!=|<=|>=|[()\[\]{},.;:=<>+\-*/%|&])
  | (?P<other>.)
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    line: int
    col: int


@dataclass(frozen=True, slots=True)
class ModuleScan:
    package: str = ""
    package_line: int = 0
    imports: dict[str, str] = field(default_factory=dict)  # alias → imported ref
    heads: frozenset[str] = frozenset()  # rule and function names (first segment and full ref)
    calls: tuple[Call, ...] = ()
    whole_input_with: tuple[tuple[int, int], ...] = ()  # `with input as …` positions
    formats: tuple[tuple[int, int, str], ...] = ()  # sprintf's literal format strings (line, col, text)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    line: int
    col: int  # 1-based, in characters (`byte_col` gives rego-cpp's byte column)
    start: int  # offsets into the source
    end: int
    first_on_line: bool


def tokens(source: str) -> list[Token]:
    """The module's tokens, whitespace and comments dropped: the one tokenizer of the scan, the
    load gate's v0 and idiom checks (v0_syntax.py, idioms.py, guards.py), the rule reader
    (rules.py) and the time lint (timelint.py)."""
    out: list[Token] = []
    line, line_start, last_line = 1, 0, 0
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup or "other"
        if kind == "nl":
            line += 1
            line_start = m.end()
            continue
        if kind in ("ws", "comment"):
            continue
        out.append(Token(kind, m.group(), line, m.start() - line_start + 1, m.start(), m.end(), line != last_line))
        last_line = line
        if kind == "raw" and "\n" in m.group():  # raw strings may span lines
            line += m.group().count("\n")
            line_start = m.start() + m.group().rfind("\n") + 1
    return out


def byte_col(source: str, tok: Token) -> int:
    """``tok``'s 1-based column in UTF-8 bytes, as rego-cpp's own report counts (diagnostics.py)."""
    return len(source[tok.start - tok.col + 1 : tok.start].encode("utf-8")) + 1


def _ref(toks: list[Token], i: int) -> tuple[list[str], int]:
    """Read `a.b.c` (and `["x"]` parts) starting at toks[i]; return the segments and next index."""
    parts = [toks[i].text]
    i += 1
    while i < len(toks):
        if toks[i].text == "." and i + 1 < len(toks) and toks[i + 1].kind == "ident":
            parts.append(toks[i + 1].text)
            i += 2
        elif (
            toks[i].text == "["
            and i + 2 < len(toks)
            and toks[i + 1].kind == "str"
            and toks[i + 2].text == "]"
        ):
            parts.append(toks[i + 1].text[1:-1])
            i += 3
        else:
            break
    return parts, i


def scan_module(source: str) -> ModuleScan:
    toks = tokens(source)
    package, package_line = "", 0
    imports: dict[str, str] = {}
    heads: set[str] = set()
    calls: list[Call] = []
    whole_input: list[tuple[int, int]] = []
    formats: list[tuple[int, int, str]] = []
    depth = 0
    i, n = 0, len(toks)
    prev: Token | None = None
    while i < n:
        tok = toks[i]
        starts = depth == 0 and (
            prev is None or (tok.first_on_line and prev.text not in _CONTINUES)
        )
        if starts and tok.text == "package" and i + 1 < n and toks[i + 1].kind == "ident":
            parts, j = _ref(toks, i + 1)
            package, package_line = ".".join(parts), tok.line
            prev, i = toks[j - 1], j
            continue
        if starts and tok.text == "import" and i + 1 < n and toks[i + 1].kind == "ident":
            parts, j = _ref(toks, i + 1)
            alias = parts[-1]
            if j + 1 < n and toks[j].text == "as" and toks[j + 1].kind == "ident":
                alias = toks[j + 1].text
                j += 2
            if parts[0] in ("data", "input"):
                imports[alias] = ".".join(parts)
            # An import ends at its line, even one ending in a keyword (`import future.keywords.in`).
            prev, i = Token("end", "", tok.line, 0, 0, 0, False), j
            continue
        if starts and tok.text == "default" and i + 1 < n and toks[i + 1].kind == "ident":
            prev, i, tok = tok, i + 1, toks[i + 1]
            starts = True
        if starts and tok.kind == "ident" and tok.text not in _KEYWORDS:
            parts, j = _ref(toks, i)
            heads.add(parts[0])
            heads.add(".".join(parts))
            prev, i = toks[j - 1], j  # a function head's `(` is a parameter list, not a call
            continue
        if tok.kind == "ident" and (prev is None or prev.text != "."):
            parts, j = _ref(toks, i)
            if (
                j < n
                and toks[j].text == "("
                and (tok.text not in _KEYWORDS or tok.text == "contains")
            ):
                calls.append(Call(".".join(parts), tok.line, byte_col(source, tok)))
                if parts == ["sprintf"] and j + 1 < n and toks[j + 1].kind in ("str", "raw"):
                    fmt = toks[j + 1]
                    formats.append((fmt.line, byte_col(source, fmt), fmt.text[1:-1]))
            if (
                tok.text == "with"
                and i + 2 < n
                and toks[i + 1].text == "input"
                and toks[i + 2].text == "as"
            ):
                whole_input.append((tok.line, byte_col(source, tok)))
            if j > i + 1:
                prev, i = toks[j - 1], j
                continue
        if tok.text in ("(", "[", "{"):
            depth += 1
        elif tok.text in (")", "]", "}"):
            depth = max(depth - 1, 0)
        prev = tok
        i += 1
    return ModuleScan(
        package=package,
        package_line=package_line,
        imports=imports,
        heads=frozenset(heads),
        calls=tuple(calls),
        whole_input_with=tuple(whole_input),
        formats=tuple(formats),
    )
