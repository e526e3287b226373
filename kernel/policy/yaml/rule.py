"""One compiled YAML rule: its `when` as precomputed checks, its `then` as a ready Decision."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kernel.domain.decision import Decision, PolicyInput
from kernel.policy.yaml.glob import Glob
from kernel.policy.yaml.predicate import Predicate, format_value

__all__ = ["Rule", "RuleTrace", "build_rule"]

_Check = Callable[[PolicyInput], bool]


@dataclass(frozen=True, slots=True)
class RuleTrace:
    """How one rule fared against one input (``regent policy eval --explain``).

    ``failed`` names the first condition that did not hold, in the fixed order ``step_kind``,
    ``agent_id``, ``agent_ids``, ``target``, ``targets``, ``arguments`` (args not an object),
    ``arguments.<key>`` (key absent) and ``arguments.<key>.<constraint>``; None when matched.
    ``selected`` marks the rule that decided (the first match in file order).
    """

    rule_id: str
    line: int
    matched: bool
    selected: bool = False
    failed: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """A compiled rule. Empty strings and empty tuples mean "condition not set"."""

    id: str
    index: int  # position in the file, 0-based
    line: int
    decision: Decision
    step_kind: str = ""
    agent_id: str = ""
    agent_ids: tuple[str, ...] = ()
    target: Glob | None = None
    targets: tuple[Glob, ...] = ()
    predicates: tuple[Predicate, ...] = ()
    head: _Check = field(default=lambda _: True, repr=False)  # every condition but `arguments`
    # `head` without the target conditions (None: nothing left), for a step found through the
    # bundle's target index, whose target is known to match.
    rest: _Check | None = field(default=None, repr=False)
    # The `arguments` predicates as one test of a decodable args dict (see args_match).
    args_test: Callable[[dict[str, Any]], bool] = field(default=lambda _: True, repr=False)

    @property
    def has_conditions(self) -> bool:
        return bool(
            self.step_kind
            or self.agent_id
            or self.agent_ids
            or self.target
            or self.targets
            or self.predicates
        )

    @property
    def literal_targets(self) -> frozenset[str] | None:
        """The only targets this rule can match, when its target conditions are plain strings
        (used to index rules by target); None when a glob or no target condition is involved."""
        if self.target is not None:
            return None if self.target.literal is None else frozenset((self.target.literal,))
        if self.targets and all(g.literal is not None for g in self.targets):
            return frozenset(g.literal for g in self.targets if g.literal is not None)
        return None

    @property
    def target_prefixes(self) -> tuple[str, ...] | None:
        """Literal prefixes one of which every target this rule matches starts with (to index
        glob rules by prefix); None when some matching target may start with anything."""
        globs = (self.target,) if self.target is not None else self.targets
        if not globs or any(not g.prefix for g in globs):
            return None
        return tuple(dict.fromkeys(g.prefix for g in globs))

    def args_match(self, args: dict[str, Any]) -> bool:
        """The `arguments` predicates against args already known to be decodable (a dict)."""
        return self.args_test(args)

    def first_failure(self, inp: PolicyInput, args_ok: bool) -> tuple[str, str] | None:
        """``(condition, detail)`` for the first condition ``inp`` fails, or None if it matches.

        Slower than ``head``/``args_match`` and meant for explanations; tests pin that the two agree.
        """
        if self.step_kind and inp.kind != self.step_kind:
            return "step_kind", f'step kind "{inp.kind}" is not "{self.step_kind}"'
        if self.agent_id and inp.agent_id != self.agent_id:
            return "agent_id", f'agent "{inp.agent_id}" is not "{self.agent_id}"'
        if self.agent_ids and inp.agent_id not in self.agent_ids:
            return "agent_ids", f'agent "{inp.agent_id}" is not in agent_ids'
        if self.target is not None and not self.target.match(inp.target):
            return "target", f'target "{inp.target}" does not match "{self.target.pattern}"'
        if self.targets and not any(g.match(inp.target) for g in self.targets):
            return "targets", f'target "{inp.target}" matches none of targets'
        if not self.predicates:
            return None
        if not args_ok:
            return "arguments", "args is not a JSON object (every rule with arguments fails)"
        args: dict[str, Any] = inp.args
        for predicate in self.predicates:
            where = f"arguments.{predicate.key}"
            if predicate.extended:
                failed = predicate.failure_in(args)
                if failed is None:
                    continue
                if failed == "exists":
                    return where, f'args has no key "{predicate.key}"'
                shown = format_value(args[predicate.key]) if predicate.key in args else ""
                return f"{where}.{failed}", f"value {_clip(shown)!r} ({_json_type(args.get(predicate.key))}) fails {failed}"
            if predicate.key not in args:
                return where, f'args has no key "{predicate.key}"'
            text = format_value(args[predicate.key])
            failed = predicate.first_failure(text)
            if failed is not None:
                return f"{where}.{failed}", f"value {_clip(text)!r} fails {failed}"
        return None


def build_rule(
    *,
    id: str,
    index: int,
    line: int,
    decision: Decision,
    step_kind: str = "",
    agent_id: str = "",
    agent_ids: tuple[str, ...] = (),
    target: Glob | None = None,
    targets: tuple[Glob, ...] = (),
    predicates: tuple[Predicate, ...] = (),
) -> Rule:
    """Build a Rule with its ``head``, ``rest`` and ``args_test`` checks composed once from the
    conditions that are set."""
    checks: list[_Check] = []
    if step_kind:
        checks.append(_attr_equals("kind", step_kind))
    if agent_id:
        checks.append(_attr_equals("agent_id", agent_id))
    if agent_ids:
        members = frozenset(agent_ids)
        checks.append(lambda inp: inp.agent_id in members)
    rest = _all(checks) if checks else None
    if target is not None:
        match = target.match
        checks.append(lambda inp: match(inp.target))
    if targets:
        checks.append(_any_target(targets))
    return Rule(
        id=id,
        index=index,
        line=line,
        decision=decision,
        step_kind=step_kind,
        agent_id=agent_id,
        agent_ids=agent_ids,
        target=target,
        targets=targets,
        predicates=predicates,
        head=_all(checks),
        rest=rest,
        args_test=_args_test(predicates),
    )


def _args_test(predicates: tuple[Predicate, ...]) -> Callable[[dict[str, Any]], bool]:
    tests = tuple(_predicate_test(p) for p in predicates)
    if not tests:
        return lambda _: True
    if len(tests) == 1:
        return tests[0]

    def check(args: dict[str, Any]) -> bool:
        for test in tests:  # noqa: SIM110 - a loop, not all() over a generator: this is per decision
            if not test(args):
                return False
        return True

    return check


def _predicate_test(p: Predicate) -> Callable[[dict[str, Any]], bool]:
    """One predicate as a closure over only the constraints it sets."""
    if p.extended:  # Regent's typed constraints (exists/absent, type, gt…, not)
        failure_in = p.failure_in
        return lambda args: failure_in(args) is None
    key = p.key
    text_ok = p.text_test()

    def holds(args: dict[str, Any]) -> bool:
        if key not in args:
            return False
        value = args[key]
        return text_ok(value if type(value) is str else format_value(value))

    return holds


def _attr_equals(name: str, value: str) -> _Check:
    get = operator.attrgetter(name)
    equals = partial(operator.eq, value)
    return lambda inp: equals(get(inp))


def _any_target(globs: tuple[Glob, ...]) -> _Check:
    literals = frozenset(g.literal for g in globs if g.literal is not None)
    matchers = tuple(g.match for g in globs if g.literal is None)
    if not matchers:
        return lambda inp: inp.target in literals

    def check(inp: PolicyInput) -> bool:
        target = inp.target
        if target in literals:
            return True
        return any(m(target) for m in matchers)

    return check


def _all(checks: list[_Check]) -> _Check:
    if not checks:
        return lambda _: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda inp: first(inp) and second(inp)
    frozen = tuple(checks)

    def check(inp: PolicyInput) -> bool:
        return all(c(inp) for c in frozen)

    return check


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return "number"


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
