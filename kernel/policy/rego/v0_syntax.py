"""OPA v0 syntax that rego-cpp reads as something else: finding it (the load gate) and rewriting it
to v1 (`regent policy fmt --v0-v1`). Pure; scan.py's tokens with bracket depth.

rego-cpp 1.5.2 parses a v0 rule head such as ``blocked[cmd] { … }`` as a v1 rule building the
object ``{cmd: true}``; OPA v1 refuses the module and OPA v0 builds the set ``{cmd}``. A deny rule
iterating such a helper (``some c in blocked``) then iterates ``true``s and stops matching.
"""

from __future__ import annotations

from dataclasses import dataclass

from .scan import _CONTINUES, _KEYWORDS, Token, tokens

__all__ = ["Token", "V0Head", "find_v0_heads", "operator_line_problems", "reserved_name_problems", "rewrite_v0_v1",
           "set_head_problems", "tokens", "v1_problems"]

# A `{` after one of these at depth 0 opens a body with no `if`: the v0 form.
_VALUE_END_KINDS = frozenset({"num", "str", "raw"})
_VALUE_END_OPS = frozenset({"]", ")", "}"})


def statements(toks: list[Token]) -> list[tuple[int, int]]:
    """[start, end) token ranges of the module's top-level statements (package, imports, rules;
    an `else` on a new line continues its rule)."""
    out: list[tuple[int, int]] = []
    depth, start = 0, 0
    for j, t in enumerate(toks):
        # An import line ending in a keyword (`import future.keywords.if`) does not continue.
        declaration = toks[start].text in ("package", "import")
        if (j > start and depth == 0 and t.first_on_line and t.text != "else"
                and (declaration or toks[j - 1].text not in _CONTINUES)):
            out.append((start, j))
            start = j
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth = max(depth - 1, 0)
    if start < len(toks):
        out.append((start, len(toks)))
    return out


def matching(toks: list[Token], j: int, end: int) -> int:
    """Index of the bracket closing toks[j] (or ``end`` - 1 when unbalanced)."""
    depth = 0
    for k in range(j, end):
        t = toks[k]
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
            if depth == 0:
                return k
    return end - 1


@dataclass(frozen=True, slots=True)
class V0Head:
    """A rule head (or `else`) whose body has no `if`."""

    line: int
    col: int
    head: str  # the head as written, without its body: "blocked[cmd]", "f(x) = y", "else = 2"
    v1: str  # how OPA v1 writes it: "blocked contains cmd if", "f(x) = y if", "else = 2 if"
    brace: int  # offset of the body's `{`
    contains_at: tuple[int, int, str] | None  # (start, end, text): `[x]` → ` contains x`


def _value_end(t: Token) -> bool:
    if t.kind == "ident":
        return t.text not in _KEYWORDS or t.text in ("true", "false", "null", "else")
    return t.kind in _VALUE_END_KINDS or (t.kind == "op" and t.text in _VALUE_END_OPS)


def _set_head(source: str, toks: list[Token], a: int, b: int) -> tuple[int, int, str] | None:
    """When the head toks[a:b] is a v0 partial set (`name[x]` / `a.b[x]`, no value): the span of
    its last `[x]` and the text that replaces it (` contains x`)."""
    j = a
    if toks[j].kind != "ident":
        return None
    j += 1
    while j + 1 < b and toks[j].text == "." and toks[j + 1].kind == "ident":
        j += 2
    if j >= b or toks[j].text != "[":
        return None
    close = matching(toks, j, b)
    if close != b - 1:  # something follows the brackets (`= v`, `if`): not a plain set head
        return None
    inner = source[toks[j + 1].start : toks[close - 1].end] if close > j + 1 else ""
    return toks[j].start, toks[close].end, f" contains {inner}"


def find_v0_heads(source: str) -> list[V0Head]:
    """Every rule head whose body is opened without `if` (v0), in source order."""
    toks = tokens(source)
    found: list[V0Head] = []
    for a, b in statements(toks):
        first = toks[a]
        if first.kind != "ident" or first.text in ("package", "import") or (
            first.text in _KEYWORDS and first.text != "default"
        ):
            continue
        head_start = a
        j = a
        while j < b:
            t = toks[j]
            if t.kind == "op" and t.text in "([":
                j = matching(toks, j, b) + 1
                continue
            if t.kind == "ident" and t.text == "if":
                # A v1 body: braces, or one expression up to an `else`.
                j += 1
                if j < b and toks[j].text == "{":
                    j = matching(toks, j, b) + 1
                else:
                    while j < b and not (toks[j].kind == "ident" and toks[j].text == "else"):
                        j = matching(toks, j, b) + 1 if toks[j].kind == "op" and toks[j].text in "([{" else j + 1
                continue
            if t.kind == "ident" and t.text == "else":
                head_start = j
                j += 1
                continue
            if t.kind == "op" and t.text == "{":
                close = matching(toks, j, b)
                if j > head_start and _value_end(toks[j - 1]):
                    head = source[toks[head_start].start : toks[j - 1].end]
                    contains_at = None
                    if toks[head_start].text != "else":
                        contains_at = _set_head(source, toks, head_start, j)
                    v1 = head
                    if contains_at is not None:
                        s, e, text = contains_at
                        off = toks[head_start].start
                        v1 = head[: s - off] + text + head[e - off :]
                    found.append(V0Head(toks[head_start].line, toks[head_start].col, " ".join(head.split()),
                                        " ".join(v1.split()) + " if", t.start, contains_at))
                j = close + 1
                continue
            j += 1
    return found


def reserved_name_problems(source: str) -> list[tuple[int, int, str]]:
    """`input` or `data` as a rule name or an assigned variable: OPA v1 refuses both (they are
    reserved), rego-cpp lets the local name shadow the document."""
    toks = tokens(source)
    out: list[tuple[int, int, str]] = []
    starts = {a for a, _ in statements(toks)}
    for j, t in enumerate(toks):
        if t.kind != "ident" or t.text not in ("input", "data"):
            continue
        if j > 0 and toks[j - 1].text in (".", "import", "package"):
            continue
        nxt = toks[j + 1].text if j + 1 < len(toks) else ""
        if j in starts and nxt in (":=", "=", "if", "{", "contains", "[", "("):
            out.append((t.line, t.col, f"`{t.text}` is reserved in OPA v1 and cannot name a rule"))
        elif j not in starts and nxt == ":=":
            out.append((t.line, t.col, f"`{t.text}` is reserved in OPA v1 and cannot be assigned (`{t.text} := …`)"))
    return out


def set_head_problems(source: str) -> list[tuple[int, int, str]]:
    """A bare `p["a"]` / `p[x]` (one name, one bracket, no value, no body): OPA reads it as a
    partial-set member (v1 then refuses it: "`contains` keyword is required for partial set
    rules"; v0 builds the set {"a"}); rego-cpp 1.5.2 builds the object {"a": true}. With `if`
    (`p[x] if { … }`) OPA too builds the object (ast/parser.go: "p[x] if ... becomes a
    single-value rule"), so that form is left alone; with a `{` body and no `if` it is a v0 head."""
    toks = tokens(source)
    out: list[tuple[int, int, str]] = []
    for a, b in statements(toks):
        first = toks[a]
        if first.kind != "ident" or first.text in _KEYWORDS or a + 1 >= b or toks[a + 1].text != "[":
            continue
        close = matching(toks, a + 1, b)
        if close != b - 1:
            continue  # `p[k] := v`, `p[x] if …`, `p[x] { … }` (a v0 head), `p[x].y …`
        head = " ".join(source[first.start : toks[close].end].split())
        member = " ".join(source[toks[a + 1].end : toks[close].start].split())
        out.append((first.line, first.col, (
            f"bare partial-set head `{head}` (OPA v1 refuses it without `contains`, OPA v0 builds a set, "
            f"rego-cpp builds an object of `true`s); write `{first.text} contains {member}` for a set, or "
            f"`{head} := true` for an object (`regent policy fmt --v0-v1 --write` rewrites the module)")))
    return out


_BINARY = frozenset({"==", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "&", "|", "=", ":="})


def _term_end(t: Token) -> bool:
    if t.kind == "ident":
        return t.text not in _KEYWORDS or t.text in ("true", "false", "null")
    return t.kind in _VALUE_END_KINDS or (t.kind == "op" and t.text in _VALUE_END_OPS)


def _query_brace(toks: list[Token], j: int) -> bool:
    """Whether the `{` at toks[j] opens a query (a rule body after `if`/`else`, an `every` body),
    where a newline ends an expression, rather than an object or set literal."""
    if j == 0:
        return False
    if toks[j - 1].kind == "ident" and toks[j - 1].text in ("if", "else"):
        return True
    k = j - 1
    while k >= 0 and toks[k].text not in (";", "{", "}", "if") and not (toks[k].kind == "ident" and toks[k].text == "every"):
        if toks[k].first_on_line:
            return False
        k -= 1
    return k >= 0 and toks[k].text == "every"


def operator_line_problems(source: str) -> list[tuple[int, int, str]]:
    """A line in a query that starts with a binary operator after a complete expression
    (`y := input.a` then `-1 < y`): OPA and rego-cpp both read it as continuing the line before
    (`y := input.a - 1 < y`); OPA then refuses the unsafe `y`, rego-cpp evaluates it (false). In
    array, object and call brackets (`[\n -1,\n -2]`) and before a comprehension's `|` the newline
    never ended anything, so those lines are left alone."""
    toks = tokens(source)
    out: list[tuple[int, int, str]] = []
    queries: list[bool] = []  # per open bracket: is its content (now) a query
    for j, t in enumerate(toks):
        if (t.first_on_line and t.kind == "op" and t.text in _BINARY and queries and queries[-1]
                and _term_end(toks[j - 1])):
            line_text = source.splitlines()[t.line - 1].strip()
            out.append((t.line, t.col, (
                f"a line starting with `{t.text}` continues the expression on the line before (`{line_text}` "
                "is read as its right-hand side), in OPA as in rego-cpp; OPA then refuses a variable that "
                "becomes unsafe where rego-cpp evaluates it, silently. End the line before with the "
                "operator to continue it, or start the new expression with a term (`y > -1`, not `-1 < y`)")))
        if t.kind == "op" and t.text in "([{":
            queries.append(t.text == "{" and _query_brace(toks, j))
        elif t.kind == "op" and t.text in ")]}":
            if queries:
                queries.pop()
        elif t.kind == "op" and t.text == "|" and queries and toks[j - 1].text != "|":
            queries[-1] = True  # a comprehension's body follows its `|`
    return out


def v1_problems(source: str) -> list[tuple[int, int, str]]:
    """(line, col, message) for each construct OPA v1 refuses and rego-cpp reads differently."""
    out: list[tuple[int, int, str]] = set_head_problems(source) + operator_line_problems(source)
    for h in find_v0_heads(source):
        if h.contains_at is not None:
            meaning = "rego-cpp reads it as a rule building an object of `true`s, OPA v0 as a set"
        elif h.head.startswith("else"):
            meaning = "OPA v1 requires `if` before every body"
        else:
            meaning = "OPA v1 requires `if` before every rule body"
        out.append((h.line, h.col, f"OPA v0 rule head `{h.head} {{ … }}` ({meaning}); write "
                    f"`{h.v1} {{ … }}` (`regent policy fmt --v0-v1 --write` rewrites the module)"))
    out += reserved_name_problems(source)
    return sorted(out)


def rewrite_v0_v1(source: str) -> str:
    """The module with every v0 head in v1 form: `if` before each body, `contains` for partial
    sets, and bare set members (`p["a"]`) as `p contains "a"`. Everything else is kept byte for
    byte (comments, layout), so the diff shows only the heads."""
    edits: list[tuple[int, int, str]] = []
    for h in find_v0_heads(source):
        if h.contains_at is not None:
            edits.append(h.contains_at)
        edits.append((h.brace, h.brace, "if "))
    toks = tokens(source)
    for a, b in statements(toks):
        first = toks[a]
        if first.kind != "ident" or first.text in _KEYWORDS:
            continue
        has_if = any(t.kind == "ident" and t.text in ("if", "contains") for t in toks[a:b])
        if not has_if and not any(t.text in (":=", "=", "{") and t.kind == "op" for t in toks[a:b]):
            bare = _set_head(source, toks, a, b)
            if bare is not None:
                edits.append(bare)
        elif has_if:
            # `p[x] if { … }` in a v0 module (with `import future.keywords.if`) is a partial set too.
            k = next(k for k in range(a, b) if toks[k].kind == "ident" and toks[k].text in ("if", "contains"))
            if toks[k].text == "if":
                span = _set_head(source, toks, a, k)
                if span is not None:
                    edits.append(span)
    out = source
    for start, end, text in sorted(set(edits), key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + text + out[end:]
    return out
