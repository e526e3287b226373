"""OPA idioms rego-cpp refuses or misreads, rewritten at load where a faithful rewrite exists and
refused (with the rewrite shown) where none does. Pure; line numbers are kept.

- An iterated reference as a call argument (`endswith(input.images[_], ":latest")`,
  `contains(a[_], b[_])`, `f(x[i])`): rego-cpp 1.5.2 refuses `_` there ("Invalid bracket
  argument") and evaluates a named unbound index (`x[i]`) to undefined. OPA iterates it. The
  reference is bound first, in the same expression: `__arg1 := input.images[_]; endswith(__arg1,
  ":latest")` iterates exactly what OPA iterates (each `_` stays its own variable). Inside `not`
  no such binding can be placed, so that form is refused.
- The same reference inside an array, set or object literal (`[input.b[_]] == [7]`,
  `p := [input.b[_], 1]`, `violation contains {"msg": x[_]}`): rego-cpp refuses `_` and reads a
  named index as undefined. In a body it is bound first as above; in a rule head, at the end of
  the rule's body (a body is added when there is none; a head with `else` is refused); in a
  comprehension's head, at the end of the comprehension's body (each solution of the body makes
  one element, as OPA iterates it).
- A line starting with `(` after a complete expression: OPA ends the expression at the newline,
  rego-cpp reads the `(` as a call of the reference before it. A `;` is put after that expression.
- Built-ins rego-cpp never returns from on an empty argument (`replace(s, "", y)`, …) are routed
  through helper functions appended to the module (guards.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .guards import guard_builtins, guard_notes
from .scan import _CONTINUES, _KEYWORDS
from .v0_syntax import Token, _query_brace, matching, statements, tokens

__all__ = ["IdiomRewrite", "rewrite_idioms"]

_PREFIX = "__arg"


@dataclass(frozen=True, slots=True)
class IdiomRewrite:
    source: str  # the module as rego-cpp is given it (same lines as the author's)
    notes: tuple[tuple[int, int, str], ...]  # (line, col, what was rewritten)
    problems: tuple[tuple[int, int, str], ...]  # (line, col, why refused and how to write it)


def _queries(toks: list[Token]) -> list[tuple[int, int, bool]]:
    """(first, end, braced) token ranges of every query: rule bodies after `if`, `every` bodies,
    comprehension bodies after `|`. Unbraced one-line bodies run to an `else` or the line's end."""
    out: list[tuple[int, int, bool]] = []
    n = len(toks)
    for j, t in enumerate(toks):
        if t.kind == "ident" and t.text == "if" and j + 1 < n:
            if toks[j + 1].text == "{":
                out.append((j + 2, matching(toks, j + 1, n), True))
            else:
                k = j + 1
                while k < n and not (toks[k].kind == "ident" and toks[k].text == "else") and (
                    k == j + 1 or not toks[k].first_on_line or toks[k - 1].text in _CONTINUES
                ):
                    k = matching(toks, k, n) + 1 if toks[k].kind == "op" and toks[k].text in "([{" else k + 1
                out.append((j + 1, k, False))
        elif t.kind == "ident" and t.text == "every":
            k = j + 1
            while k < n and toks[k].text != "{":
                k += 1
            if k < n:
                out.append((k + 1, matching(toks, k, n), True))
        elif t.kind == "op" and t.text in "[{":
            close = matching(toks, j, n)
            bar = _bar(toks, j, close)
            if bar is not None:
                out.append((bar + 1, close, True))
    return out


def _expressions(toks: list[Token], a: int, b: int) -> list[tuple[int, int]]:
    """[start, end) of each top-level expression of the query toks[a:b]."""
    out: list[tuple[int, int]] = []
    depth, start = 0, a
    for j in range(a, b):
        t = toks[j]
        if j > start and depth == 0 and (
            (t.first_on_line and toks[j - 1].text not in _CONTINUES) or toks[j - 1].text == ";"
        ):
            out.append((start, j - 1 if toks[j - 1].text == ";" else j))
            start = j
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
    if start < b:
        out.append((start, b))
    return out


def _iterated_refs(toks: list[Token], a: int, b: int) -> list[tuple[int, int]]:
    """[start, end) of each reference with a variable index (`x[_]`, `input.a[i].b`) among the
    argument tokens toks[a:b], comprehensions skipped (their bodies are queries of their own)."""
    out: list[tuple[int, int]] = []
    j = a
    while j < b:
        t = toks[j]
        if t.kind == "op" and t.text in "[{":
            close = matching(toks, j, b)
            if any(toks[k].text == "|" for k in range(j + 1, close)):
                j = close + 1  # a comprehension (or a nested one): not an argument reference
                continue
        if t.kind == "ident" and t.text not in _KEYWORDS and (j == a or toks[j - 1].text != "."):
            k = j + 1
            iterated = False
            while k < b:
                if toks[k].text == "." and k + 1 < b and toks[k + 1].kind == "ident":
                    k += 2
                elif toks[k].text == "[":
                    close = matching(toks, k, b)
                    inner = toks[k + 1 : close]
                    if len(inner) == 1 and inner[0].kind == "ident" and inner[0].text not in _KEYWORDS:
                        iterated = True
                    k = close + 1
                else:
                    break
            if k < b and toks[k].text == "(":
                j = k  # a call's name, not a reference: its arguments are scanned in turn
                continue
            if iterated:
                out.append((j, k))
            j = k
            continue
        j += 1
    return out


def _calls(toks: list[Token], a: int, b: int) -> list[tuple[int, int, int]]:
    """(name, open, close) token indexes of the calls in toks[a:b]."""
    out = []
    for j in range(a, b):
        t = toks[j]
        if t.kind == "op" and t.text == "(" and j > a and toks[j - 1].kind == "ident" and (
            toks[j - 1].text not in _KEYWORDS or toks[j - 1].text == "contains"
        ):
            k = j - 1
            while k - 2 >= a and toks[k - 1].text == "." and toks[k - 2].kind == "ident":
                k -= 2
            out.append((k, j, matching(toks, j, b)))
    return out


def _term_end(t: Token) -> bool:
    return (t.kind == "ident" and t.text not in _KEYWORDS) or (t.kind == "op" and t.text in ")]}")


def _bar(toks: list[Token], j: int, close: int) -> int | None:
    """Index of the `|` of the comprehension opened at toks[j], or None for a literal."""
    depth = 0
    for k in range(j + 1, close):
        x = toks[k]
        if x.kind == "op" and x.text in "([{":
            depth += 1
        elif x.kind == "op" and x.text in ")]}":
            depth -= 1
        elif depth == 0 and x.text == "|":
            return k
    return None


def _literals(toks: list[Token], a: int, b: int, *, comprehensions: bool = False) -> list[tuple[int, int]]:
    """(open, close) of the array, set and object literals in toks[a:b] (or, with
    ``comprehensions``, of the comprehensions): not an index (`x[i]`), not a query's brace."""
    out = []
    for j in range(a, b):
        t = toks[j]
        if t.kind != "op" or t.text not in "[{" or (j > 0 and t.text == "[" and _term_end(toks[j - 1])):
            continue
        if t.text == "{" and _query_brace(toks, j):
            continue
        close = matching(toks, j, b)
        if (_bar(toks, j, close) is not None) == comprehensions:
            out.append((j, close))
    return out


def _head_problem(where: tuple[int, int], head: str, refs: list[str]) -> tuple[int, int, str]:
    return (*where, f"`{head}`: an iterated reference ({', '.join(refs)}) inside a composite value of a rule "
                    "head with `else` (rego-cpp refuses `_` there and reads a named index as undefined); bind it "
                    "in the body: `p := [v] if { v := x[_] }`")


def rewrite_idioms(source: str) -> IdiomRewrite:
    toks = tokens(source)
    edits: list[tuple[int, int, str]] = []
    notes: list[tuple[int, int, str]] = []
    problems: list[tuple[int, int, str]] = []
    queries = _queries(toks)
    claimed: set[int] = set()  # ref start tokens already handled by an inner query
    counter = 0

    def bind(refs: list[tuple[int, int]]) -> list[str]:
        nonlocal counter
        bindings = []
        for r0, r1 in refs:
            counter += 1
            var = f"{_PREFIX}{counter}"
            edits.append((toks[r0].start, toks[r1 - 1].end, var))
            bindings.append(f"{var} := {source[toks[r0].start : toks[r1 - 1].end]}")
        return bindings

    # A comprehension's head is evaluated per solution of its body: its iterated references are
    # bound at the end of that body (innermost comprehensions first).
    for j, close in sorted(_literals(toks, 0, len(toks), comprehensions=True), key=lambda c: c[1] - c[0]):
        bar = _bar(toks, j, close)
        assert bar is not None
        crefs = [r for r in _iterated_refs(toks, j + 1, bar) if r[0] not in claimed]
        if not crefs:
            continue
        claimed.update(r[0] for r in crefs)
        texts = [source[toks[r0].start : toks[r1 - 1].end] for r0, r1 in crefs]
        cbind = bind(crefs)
        edits.append((toks[close - 1].end, toks[close - 1].end, "; " + "; ".join(cbind)))
        notes.append((toks[crefs[0][0]].line, toks[crefs[0][0]].col,
                      f"the iterated reference{'s' if len(crefs) > 1 else ''} {', '.join(texts)} in a comprehension's "
                      f"head bound at the end of its body (`{'; '.join(cbind)}`), as OPA iterates "
                      f"{'them' if len(crefs) > 1 else 'it'}"))
    # A rule head's composite value (`p := [x[_]]`, `p contains {"a": x[i]}`): bound at the end of
    # the rule's body (one is made when there is none).
    for a, b in statements(toks):
        first = toks[a]
        if first.kind != "ident" or first.text in _KEYWORDS:
            continue
        h = next((k for k in range(a, b) if toks[k].kind == "ident" and toks[k].text == "if"
                  and not any(q0 <= k < q1 for q0, q1, _ in queries)), b)
        hrefs: list[tuple[int, int]] = []
        for j, close in _literals(toks, a, h):
            hrefs += [r for r in _iterated_refs(toks, j + 1, close) if r[0] not in claimed]
        hrefs = sorted({r[0]: r for r in hrefs}.values())
        if not hrefs:
            continue
        claimed.update(r[0] for r in hrefs)
        texts = [source[toks[r0].start : toks[r1 - 1].end] for r0, r1 in hrefs]
        where = (toks[hrefs[0][0]].line, toks[hrefs[0][0]].col)
        if any(toks[k].kind == "ident" and toks[k].text == "else" for k in range(a, b)):
            problems.append(_head_problem(where, " ".join(source[first.start : toks[h - 1].end].split()), texts))
            continue
        hbind = "; ".join(bind(hrefs))
        if h == b:
            edits.append((toks[b - 1].end, toks[b - 1].end, f" if {{ {hbind} }}"))
        elif toks[h + 1].text == "{":
            body_close = matching(toks, h + 1, b)
            last = toks[body_close - 1]
            edits.append((last.end, last.end, ("; " if body_close > h + 2 else " ") + hbind))
        else:
            edits.append((toks[h + 1].start, toks[h + 1].start, "{ "))
            edits.append((toks[b - 1].end, toks[b - 1].end, f"; {hbind} }}"))
        notes.append((*where, f"the iterated reference{'s' if len(hrefs) > 1 else ''} {', '.join(texts)} in a rule "
                              f"head's value bound at the end of its body (`{hbind}`), as OPA iterates "
                              f"{'them' if len(hrefs) > 1 else 'it'}"))
    # Innermost queries first, so a comprehension's own expression takes its references.
    for a, b, braced in sorted(queries, key=lambda q: q[1] - q[0]):
        for s, e in _expressions(toks, a, b):
            inner = [q for q in queries if s <= q[0] and q[1] <= e and (q[0], q[1]) != (a, b)]
            refs: list[tuple[int, int]] = []
            spans = [(op, close) for _name, op, close in _calls(toks, s, e)] + _literals(toks, s, e)
            for op, close in spans:
                for r in _iterated_refs(toks, op + 1, close):
                    if r[0] in claimed or any(q0 <= r[0] < q1 for q0, q1, _ in inner):
                        continue
                    claimed.add(r[0])
                    refs.append(r)
            if not refs:
                continue
            refs.sort()
            ref_texts = [source[toks[r0].start : toks[r1 - 1].end] for r0, r1 in refs]
            where = (toks[refs[0][0]].line, toks[refs[0][0]].col)
            expr = " ".join(source[toks[s].start : toks[e - 1].end].split())
            if any(toks[k].kind == "ident" and toks[k].text == "with" for k in range(s, e)):
                problems.append((*where, (
                    f"`{expr}`: an iterated reference ({', '.join(ref_texts)}) as a call argument or in a "
                    "composite value in an expression with `with` (rego-cpp refuses `_` there and reads a named index as "
                    "undefined); bind it first in a helper rule the `with` applies to")))
                continue
            if toks[s].text == "not":
                problems.append((*where, (
                    f"`{expr}`: an iterated reference ({', '.join(ref_texts)}) as a call argument or in a "
                    "composite value inside `not` (rego-cpp refuses `_` there and reads a named index as undefined); move the "
                    "test into a helper rule and negate that: `matches if { some i; x := "
                    f"{ref_texts[0].replace('[_]', '[i]', 1)}; … }}` then `not matches`")))
                continue
            lead = "; ".join(bind(refs)) + "; "
            if braced:
                edits.append((toks[s].start, toks[s].start, lead))
            else:
                edits.append((toks[s].start, toks[s].start, "{ " + lead))
                edits.append((toks[e - 1].end, toks[e - 1].end, " }"))
            notes.append((*where, f"`{expr}`: the iterated reference{'s' if len(refs) > 1 else ''} "
                                  f"{', '.join(ref_texts)} bound first (`{lead.rstrip('; ')}`), as OPA iterates "
                                  f"{'them' if len(refs) > 1 else 'it'}"))
    for a, b, braced in queries:
        if not braced:
            continue
        for s, _e in _expressions(toks, a, b)[1:]:
            t = toks[s]
            prev = toks[s - 1]
            if t.text == "(" and t.first_on_line and prev.text != ";":
                edits.append((prev.end, prev.end, ";"))
                notes.append((t.line, t.col, "a line starting with `(` begins a new expression, as in OPA "
                                             "(rego-cpp would call the reference on the line before)"))
    out = source
    for start, end, text in sorted(edits, key=lambda x: (x[0], x[1]), reverse=True):
        out = out[:start] + text + out[end:]
    notes += guard_notes(source)
    return IdiomRewrite(guard_builtins(out), tuple(sorted(notes)), tuple(sorted(problems)))
