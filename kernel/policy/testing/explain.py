"""Why a Rego unit test failed, as `opa test --explain fails` tells: its first expression that is
false or undefined, with file:line and the values of a comparison's two sides (pure).

For a failing test with body e1 … en, query rules are appended to the test file, in its package
(so names resolve as the test's do):

    __regent_x<t>_<k> if { e1; …; ek }                 # k = 1 … n: the first undefined one fails
    __regent_x<t>_<k>_l := L if { e1; …; e(k-1) }     # when ek is `L op R`: the values of L and R
    __regent_x<t>_<k>_r := R if { e1; …; e(k-1) }

The queries run in a child process of their own, after the tests (a crash costs the explanation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernel.policy.rego.rules import read_rules
from kernel.policy.rego.v0_syntax import tokens

__all__ = ["ExplainPlan", "plan_explanations"]

_COMPARISONS = ("==", "!=", "<=", ">=", "<", ">")
_MAX_VALUE = 200


@dataclass
class ExplainPlan:
    source: str  # the test file with the query rules appended
    queries: list[list[str]]  # [key, query]
    steps: dict[str, list[tuple[int, str, str, str]]]  # test → [(line, expr, left, right)]

    def message(self, test: str, file: str, answers: dict[str, Any]) -> str:
        """The failing expression, from the answers to ``queries`` (key → value, absent when
        undefined); "" when no expression can be blamed (every one held)."""
        for k, (line, expr, left, right) in enumerate(self.steps.get(test, []), start=1):
            key = _key(test, k)
            if answers.get(key) is True:
                continue
            shown = " ".join(expr.split())
            if len(shown) > 120:
                shown = shown[:117] + "…"
            if left and right:
                both = key + "_l" in answers and key + "_r" in answers
                return (f"{file}:{line}: `{shown}` is {'false' if both else 'undefined'} "
                        f"(left {_show(answers, key + '_l')}, right {_show(answers, key + '_r')})")
            if left:  # `not X`: what X was
                return f"{file}:{line}: `{shown}` is false (`{left}` is {_show(answers, key + '_l')})"
            return f"{file}:{line}: `{shown}` is false or undefined"
        return ""


def _key(test: str, k: int) -> str:
    return f"{test.rsplit('.', 1)[-1]}_{k}"


def _show(answers: dict[str, Any], key: str) -> str:
    if key not in answers:
        return "undefined"
    text = json.dumps(answers[key], ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 1] + "…"


def _sides(expr: str) -> tuple[str, str]:
    """(L, R) when ``expr`` is one comparison at depth 0 (no `with`), (X, "") for `not X`, else
    ("", "")."""
    toks = tokens(expr)
    if toks and toks[0].text == "not" and not any(t.text == "with" for t in toks):
        return expr[toks[1].start :].strip() if len(toks) > 1 else "", ""
    depth = 0
    found = None
    for j, t in enumerate(toks):
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
        elif depth == 0 and t.kind == "ident" and t.text in ("with", "not", "some", "every"):
            return "", ""
        elif depth == 0 and t.kind == "op" and t.text in _COMPARISONS:
            if found is not None:
                return "", ""
            found = j
    if found is None or found == 0 or found == len(toks) - 1:
        return "", ""
    return expr[: toks[found].start].strip(), expr[toks[found].end :].strip()


def plan_explanations(source: str, package: str, failing: list[str]) -> ExplainPlan:
    """The query rules that explain the ``failing`` tests (package.test_x) of the test file."""
    try:
        rules = read_rules(source).rules
    except ValueError:
        return ExplainPlan(source, [], {})
    first: dict[str, Any] = {}
    for r in rules:
        first.setdefault(r.name, r)
    extra: list[str] = []
    queries: list[list[str]] = []
    steps: dict[str, list[tuple[int, str, str, str]]] = {}
    for t in failing:
        rule = first.get(t.rsplit(".", 1)[-1])
        if rule is None or not rule.body or rule.kind not in ("complete", "function") or rule.chain:
            continue
        plan = []
        exprs = [e.text for e in rule.body]
        for k, e in enumerate(rule.body, start=1):
            key = _key(t, k)
            body = "\n  ".join(exprs[:k])
            extra.append(f"__regent_x{key} if {{\n  {body}\n}}")
            queries.append([key, f"x := data.{package}.__regent_x{key}"])
            left, right = _sides(e.text)
            if left:
                before = "\n  ".join([*exprs[: k - 1], "true"])
                for side, term in (("l", left), ("r", right)):
                    if not term:
                        continue
                    extra.append(f"__regent_x{key}_{side} := {term} if {{\n  {before}\n}}")
                    queries.append([f"{key}_{side}", f"x := data.{package}.__regent_x{key}_{side}"])
            plan.append((e.line, e.text, left, right))
        steps[t] = plan
    return ExplainPlan(source.rstrip("\n") + "\n\n" + "\n\n".join(extra) + "\n", queries, steps)
