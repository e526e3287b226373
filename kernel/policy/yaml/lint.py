"""Static lint: rules that can never win because an earlier rule always matches first.

`lint_rules` adds the authoring traps `regent policy check` warns about: an allow rule's regex
that is not anchored at the start, and a regex that tries to compare numbers through their text.

Shadowing is sound, not complete: a pair is reported only when every input the later rule matches provably
matches the earlier one (same or wider step kind, agents, targets and argument predicates). A rule
that is unreachable for subtler reasons is not reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernel.domain.decision import Verdict
from kernel.policy.yaml.glob import Glob
from kernel.policy.yaml.predicate import Predicate
from kernel.policy.yaml.rule import Rule

__all__ = ["Lint", "covers", "lint_rules", "shadowed_rules"]


def shadowed_rules(rules: tuple[Rule, ...]) -> list[tuple[str, str]]:
    """``(rule_id, shadowing_rule_id)`` in file order, naming the first earlier rule that covers it."""
    found: list[tuple[str, str]] = []
    catch_all: Rule | None = None
    by_target: dict[str, list[Rule]] = {}
    unindexed: list[Rule] = []
    for rule in rules:
        shadow = next((a for a in _candidates(rule, by_target, unindexed) if covers(a, rule)), None)
        if shadow is not None:
            found.append((rule.id, shadow.id))
        if catch_all is not None:
            continue  # rules after a catch-all can only be covered by it or by earlier rules
        if not rule.has_conditions:
            catch_all = rule
        literals = rule.literal_targets
        if literals is None:
            unindexed.append(rule)
        else:
            for literal in literals:
                by_target.setdefault(literal, []).append(rule)
    return found


def _candidates(rule: Rule, by_target: dict[str, list[Rule]], unindexed: list[Rule]) -> list[Rule]:
    # An earlier rule limited to literal targets can only cover a rule whose targets are all
    # among them; looking only there keeps the lint near-linear for literal-target bundles.
    literals = rule.literal_targets
    if not literals:
        return unindexed
    groups = [{a.index: a for a in by_target.get(t, ())} for t in literals]
    common = set(groups[0]).intersection(*groups[1:])
    return sorted([groups[0][i] for i in common] + unindexed, key=lambda a: a.index)


def covers(a: Rule, b: Rule) -> bool:
    """Whether every input matching ``b`` certainly matches ``a``."""
    if a.step_kind and a.step_kind != b.step_kind:
        return False
    agents_a, agents_b = _agents(a), _agents(b)
    if agents_a is not None and (agents_b is None or not agents_b <= agents_a):
        return False
    if a.target is not None and not _target_condition_covered((a.target,), b):
        return False
    if a.targets and not _target_condition_covered(a.targets, b):
        return False
    for pa in a.predicates:
        pb = next((p for p in b.predicates if p.key == pa.key), None)
        if pb is None or not _implies(pb, pa):
            return False
    return True


def _agents(rule: Rule) -> frozenset[str] | None:
    if rule.agent_id and rule.agent_ids:
        return frozenset((rule.agent_id,)) & frozenset(rule.agent_ids)
    if rule.agent_id:
        return frozenset((rule.agent_id,))
    if rule.agent_ids:
        return frozenset(rule.agent_ids)
    return None


def _target_condition_covered(any_of: tuple[Glob, ...], b: Rule) -> bool:
    """Whether every target ``b`` can match matches one of the globs ``any_of``."""
    if any(g.universal for g in any_of):
        return True
    literals = b.literal_targets  # a superset of what b matches, so checking it is sound
    if literals is not None:
        return all(any(g.match(t) for g in any_of) for t in literals)
    patterns = {g.pattern for g in any_of}
    if b.target is not None and b.target.pattern in patterns:
        return True
    return bool(b.targets) and all(g.pattern in patterns for g in b.targets)


def _implies(pb: Predicate, pa: Predicate) -> bool:
    """Whether every value text ``pb`` accepts is accepted by ``pa``."""
    if pa.extended or pb.extended:
        return False  # typed constraints, presence and `not` are not reasoned about (still sound)
    if pb.equals:
        values: tuple[str, ...] | None = (pb.equals,)
    elif pb.one_of:
        values = pb.one_of
    else:
        values = None
    if values is not None:
        return all(pa.accepts(v) for v in values if pb.accepts(v))
    if pa.equals or pa.one_of:
        return False
    if pa.contains and pa.contains not in pb.contains:
        return False
    return not pa.regex or pa.regex == pb.regex


@dataclass(frozen=True, slots=True)
class Lint:
    """One warning: ``code`` is stable (``unanchored-regex``, ``numeric-regex``, ``shadowed``,
    ``rate-limit-never-limits``, ``rate-limit-past-redis``, ``budget-ignored``,
    ``dotted-argument-key``)."""

    code: str
    line: int
    rule_id: str
    message: str


# A regex built only of digits, digit classes, dots, signs, groups, alternations and quantifiers.
_NUMERIC_PIECES = re.compile(r"\\d|\[[0-9\-]+\]|\\[.+\-]|[0-9]|[()|?*+.,{}^$\-]|[eE]")
_DIGIT = re.compile(r"\\d|\[[0-9\-]+\]|[0-9]")


def numeric_looking(regex: str) -> bool:
    """Whether ``regex`` only matches number-like text (``^[0-9]{4,}$``, ``^\\d+(\\.\\d+)?$``)."""
    return bool(_DIGIT.search(regex)) and _NUMERIC_PIECES.sub("", regex) == ""


def _regexes(rule: Rule) -> list[tuple[Predicate, bool]]:
    """Every regex predicate of a rule, with whether it sits under a `not`."""
    found: list[tuple[Predicate, bool]] = []
    for top in rule.predicates:
        p: Predicate | None = top
        negated = False
        while p is not None:
            if p.regex:
                found.append((p, negated))
            p, negated = p.negated, not negated
    return found


# Redis counts in Lua numbers (doubles): past 2^53 its limiter answers an error for every call.
REDIS_MAX_CALLS = 2**53


def _limit_lints(rule: Rule) -> list[Lint]:
    """A rate limit or budget that Rebuno accepts silently and that does nothing (rebuno-v0 §3.1)."""
    out: list[Lint] = []
    rl, budget = rule.decision.rate_limit, rule.decision.budget
    if rl is not None and (rl.max_calls <= 0 or rl.window_seconds <= 0):
        why = "max_calls is not above 0" if rl.max_calls <= 0 else "it has no window"
        out.append(Lint("rate-limit-never-limits", rule.line, rule.id,
                        f"then.rate_limit never limits: {why} (a limit needs max_calls >= 1 and a window)"))
    elif rl is not None and rl.max_calls > REDIS_MAX_CALLS:
        out.append(Lint("rate-limit-past-redis", rule.line, rule.id, (
            f"then.rate_limit.max_calls {rl.max_calls} is past what the Redis limiter counts (2^53): with "
            "REGENT_RATE_LIMIT_STORAGE=redis://… every call is a limiter error (on_limiter_error decides)")))
    if budget is not None and rule.decision.verdict is not Verdict.ALLOW:
        out.append(Lint("budget-ignored", rule.line, rule.id,
                        "then.budget is ignored on a rule that does not allow (budgets apply to allowed steps)"))
    elif budget is not None and budget.max_tokens <= 0:
        out.append(Lint("budget-ignored", rule.line, rule.id,
                        "then.budget is ignored: max_tokens is not above 0 (0 or less disables it)"))
    return out


def lint_rules(rules: tuple[Rule, ...]) -> list[Lint]:
    """The authoring warnings for a compiled rule list, in file order (shadowing included)."""
    lints: list[Lint] = []
    by_id = {rule.id: rule for rule in rules}
    for rule in rules:
        for p, negated in _regexes(rule):
            where = f"arguments.{p.key}.regex"
            if numeric_looking(p.regex):
                lints.append(Lint("numeric-regex", p.line, rule.id, (
                    f'{where} "{p.regex}" compares a number through its text: numbers render as '
                    'Go prints them (1000000 is "1e+06", 0.00001 is "1e-05") and the string "500" '
                    "matches too; use `type: number` with gt/gte/lt/lte (a Regent extension)")))
            if rule.decision.verdict is Verdict.ALLOW and not negated and not p.regex.startswith(("^", "\\A")):
                lints.append(Lint("unanchored-regex", p.line, rule.id, (
                    f'{where} "{p.regex}" is not anchored: RE2 searches anywhere in the value, so '
                    f'this allow rule also matches text that merely contains it; anchor it with ^…$')))
        lints.extend(_limit_lints(rule))
        for p in rule.predicates:
            if "." in p.key:
                lints.append(Lint("dotted-argument-key", p.line, rule.id, (
                    f'arguments key "{p.key}" is one literal key with a dot in it (as in Rebuno), not a '
                    f'path: it never matches {{"{p.key.split(".", 1)[0]}": {{"{p.key.split(".", 1)[1]}": …}}}}; '
                    "match a top-level argument, or test nested arguments in a Rego bundle")))
    for rule_id, by in shadowed_rules(rules):
        rule = by_id[rule_id]
        lints.append(Lint("shadowed", rule.line, rule_id, f"never matches: shadowed by rule {by}"))
    return sorted(lints, key=lambda x: x.line)
