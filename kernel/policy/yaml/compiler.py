"""YAML bundle text → YamlBundle, rejecting every load error of rebuno-v0.md §3.1 up front.

Messages read ``invalid policy bundle: line N: rule "<id>": <detail>``; ``details`` on the
ValidationError carries ``line`` and ``rule_id`` for the API's error envelope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from yaml.nodes import MappingNode, Node, ScalarNode

from kernel.domain.decision import (
    ApprovalConfig,
    BudgetSpec,
    Decision,
    PolicyKind,
    RateLimitSpec,
    Verdict,
)
from kernel.domain.judge import DEFAULT_THRESHOLD, JudgeSpec
from kernel.errors import ValidationError
from kernel.policy.yaml.engine import YamlBundle
from kernel.policy.yaml.glob import Glob, GlobError, compile_glob
from kernel.policy.yaml.loader import (
    FLOAT,
    INT,
    BundleReader,
    bundle_error,
    line_of,
    parse_document,
)
from kernel.policy.yaml.predicate import (
    COMPARISONS,
    JSON_TYPES,
    Predicate,
    comparison,
    type_check,
)
from kernel.policy.yaml.regex import RegexError, compile_regex
from kernel.policy.yaml.rule import Rule, build_rule

__all__ = ["MAX_BUNDLE_BYTES", "MAX_RULES", "MAX_YAML_NODES", "compile_yaml_bundle"]

MAX_BUNDLE_BYTES = 1 << 20  # 1 MiB of UTF-8; parsing that much already takes seconds
MAX_RULES = 10_000
MAX_YAML_NODES = 1_000_000  # after alias expansion: `*big` repeated cannot multiply the work

_TOP_KEYS = frozenset({"default_action", "rules"})
_RULE_KEYS = frozenset({"id", "when", "then"})
_WHEN_KEYS = frozenset({"target", "targets", "agent_id", "agent_ids", "step_kind", "arguments"})
_THEN_KEYS = frozenset({"decision", "reason", "approval_config", "rate_limit", "budget", "judge"})
_PREDICATE_KEYS = frozenset(
    {"equals", "contains", "one_of", "regex"}  # Rebuno's, on the %v text
    | {"gt", "gte", "lt", "lte", "type", "exists", "absent", "not"}  # Regent's, on the JSON value
)
_MAX_NOT_DEPTH = 4
_APPROVAL_KEYS = frozenset({"approvers", "timeout", "message"})
_RATE_LIMIT_KEYS = frozenset({"max_calls", "window", "per_what", "max_wait", "on_limiter_error"})
_BUDGET_KEYS = frozenset({"max_tokens", "on_exceed", "scope"})
_JUDGE_KEYS = frozenset({"instructions", "threshold", "fallback"})

_DECISIONS = ("allow", "deny", "require_approval", "judge")
_FALLBACKS = ("allow", "deny", "require_approval")


class _When(TypedDict, total=False):
    step_kind: str
    agent_id: str
    agent_ids: tuple[str, ...]
    target: Glob
    targets: tuple[Glob, ...]
    predicates: tuple[Predicate, ...]



def compile_yaml_bundle(text: str, *, revision: str) -> YamlBundle:
    """Compile a YAML bundle; raises ValidationError naming the YAML line (and rule) at fault.

    Only the first YAML document is read. Empty, whitespace-only or comment-only text compiles to
    an empty bundle (no rules, default deny); whether a stored ``""`` means "no policy" instead is
    the resolver's call (rebuno-v0.md §3.1 [Q]).
    """
    if (
        len(text) > MAX_BUNDLE_BYTES
        or len(text.encode("utf-8", "surrogatepass")) > MAX_BUNDLE_BYTES
    ):
        raise ValidationError(
            f"invalid policy bundle: bundle is larger than {MAX_BUNDLE_BYTES} bytes (1 MiB)"
        )
    root = parse_document(text)
    if root is None:
        return YamlBundle((), Verdict.DENY, revision)
    reader = BundleReader(MAX_YAML_NODES)
    default_action = ""
    rules: tuple[Rule, ...] = ()
    for key, _, value in reader.mapping(root, _TOP_KEYS, "", name="bundle"):
        if key == "default_action":
            default_action = reader.word(value, "default_action", ("allow", "deny"))
        else:
            rules = _compile_rules(reader, value, revision)
    verdict = Verdict.ALLOW if default_action == "allow" else Verdict.DENY
    return YamlBundle(rules, verdict, revision)


def _compile_rules(reader: BundleReader, node: Node, revision: str) -> tuple[Rule, ...]:
    items = reader.sequence(node, "rules")
    seen: dict[str, int] = {}
    rules: list[Rule] = []
    if len(items) > MAX_RULES:
        raise bundle_error(line_of(items[MAX_RULES]), f"too many rules (the limit is {MAX_RULES})")
    for index, item in enumerate(items):
        rules.append(_compile_rule(reader, item, index, seen, revision))
    reader.scope, reader.scope_details = "", {}
    return tuple(rules)


def _compile_rule(
    reader: BundleReader, node: Node, index: int, seen: dict[str, int], revision: str
) -> Rule:
    reader.scope, reader.scope_details = f"rule #{index + 1}: ", {"rule_index": index + 1}
    rule_id = _peek_id(reader, node)
    if rule_id:
        reader.scope, reader.scope_details = f'rule "{rule_id}": ', {"rule_id": rule_id}
    if reader.is_null(node):
        reader.fail(node, "missing id")
    when: _When = {}
    decision: Decision | None = None
    then_key: Node | None = None
    for key, key_node, value in reader.mapping(node, _RULE_KEYS, "", name="rule"):
        if key == "id":
            if rule_id in seen:
                reader.fail(value, f'duplicate rule id "{rule_id}" (first at line {seen[rule_id]})')
            if rule_id:
                seen[rule_id] = line_of(value)
        elif key == "when":
            when = _compile_when(reader, value)
        else:
            then_key = key_node
            decision = _compile_then(reader, value, rule_id, revision)
    if not rule_id:
        reader.fail(node, "missing id")
    if decision is None:
        reader.fail(then_key or node, "missing then.decision")
    return build_rule(id=rule_id, index=index, line=line_of(node), decision=decision, **when)


def _peek_id(reader: BundleReader, node: Node) -> str:
    # The id names the rule in every message, including errors in keys written before it.
    if isinstance(node, MappingNode):
        for key_node, value in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == "id":
                return reader.text(value, "id")
    return ""


def _compile_when(reader: BundleReader, node: Node) -> _When:
    when: _When = {}
    if reader.is_null(node):
        return when
    for key, _, value in reader.mapping(node, _WHEN_KEYS, "when"):
        where = f"when.{key}"
        if key == "target":
            pattern = reader.text(value, where)
            if pattern:  # "" means "not set", as Rebuno's `!= ""` checks do
                when["target"] = _glob(reader, value, pattern, where)
        elif key == "targets":
            items = reader.sequence(value, where)
            when["targets"] = tuple(
                _glob(reader, item, reader.text(item, f"{where}[{i}]"), f"{where}[{i}]")
                for i, item in enumerate(items)
            )
        elif key == "agent_id":
            when["agent_id"] = reader.text(value, where)
        elif key == "step_kind":
            when["step_kind"] = reader.text(value, where)
        elif key == "agent_ids":
            when["agent_ids"] = tuple(reader.texts(value, where))
        else:
            when["predicates"] = _compile_arguments(reader, value)
    return when


def _glob(reader: BundleReader, node: Node, pattern: str, where: str) -> Glob:
    try:
        return compile_glob(pattern)
    except GlobError as exc:
        reader.fail(node, f'{where}: malformed glob "{pattern}": {exc}')


def _compile_arguments(reader: BundleReader, node: Node) -> tuple[Predicate, ...]:
    if reader.is_null(node):
        return ()
    predicates: list[Predicate] = []
    for key, key_node, value in reader.mapping(node, None, "when.arguments"):
        predicates.append(_compile_predicate(reader, key, key_node, value, f"when.arguments.{key}"))
    return tuple(predicates)


def _compile_predicate(
    reader: BundleReader, key: str, key_node: Node, value: Node, where: str, depth: int = 0
) -> Predicate:
    fields: dict[str, str] = {}
    one_of: tuple[str, ...] = ()
    regex_node: Node = value
    checks: list[tuple[str, Callable[[Any], bool]]] = []
    presence = ""
    negated: Predicate | None = None
    if not reader.is_null(value):
        for name, name_node, constraint in reader.mapping(value, _PREDICATE_KEYS, where):
            here = f"{where}.{name}"
            if name == "regex":
                regex_node = constraint
            if name == "one_of":
                one_of = tuple(reader.texts(constraint, here))
            elif name in COMPARISONS:
                bound, text = reader.number(constraint, here)
                checks.append((name, comparison(name, bound, text)))
            elif name == "type":
                # `type: null` is YAML's null: read the scalar's text, whatever its tag.
                word = reader.text(constraint, here) or getattr(constraint, "value", "")
                if word in ("~", "Null", "NULL"):
                    word = "null"
                if word not in JSON_TYPES:
                    reader.fail(constraint, f"{here} must be one of {', '.join(JSON_TYPES)}")
                checks.insert(0, ("type", type_check(word)))
            elif name in ("exists", "absent"):
                flag = reader.boolean(constraint, here)
                wanted = name if flag else ("absent" if name == "exists" else "exists")
                if presence and presence != wanted:
                    reader.fail(name_node, f"{where}: exists and absent contradict each other")
                presence = wanted
            elif name == "not":
                if depth >= _MAX_NOT_DEPTH:
                    reader.fail(name_node, f"{here}: `not` nested more than {_MAX_NOT_DEPTH} deep")
                negated = _compile_predicate(reader, key, name_node, constraint, here, depth + 1)
            else:
                fields[name] = reader.text(constraint, here)
    equals, contains, regex = (
        fields.get("equals", ""),
        fields.get("contains", ""),
        fields.get("regex", ""),
    )
    text_checked = bool(equals or contains or one_of or regex)
    if not (text_checked or checks or presence or negated):
        reader.fail(
            key_node,
            f'argument "{key}" has no constraint (an empty predicate matches any value)',
        )
    if presence == "absent" and (text_checked or checks or negated):
        reader.fail(key_node, f"{where}: absent cannot be combined with constraints on the value")
    search = None
    if regex:
        try:
            search = compile_regex(regex)
        except RegexError as exc:
            reader.fail(regex_node, f'{where}.regex: invalid regex "{regex}": {exc}')
    return Predicate(
        key=key,
        line=line_of(key_node),
        equals=equals,
        contains=contains,
        one_of=one_of,
        regex=regex,
        one_of_set=frozenset(one_of),
        search=search,
        checks=tuple(checks),
        presence=presence,
        negated=negated,
        extended=bool(checks or presence or negated),
        text_checked=text_checked,
    )


def _compile_then(reader: BundleReader, node: Node, rule_id: str, revision: str) -> Decision | None:
    if reader.is_null(node):
        return None
    word = ""
    reason = ""
    approval: ApprovalConfig | None = None
    rate_limit: RateLimitSpec | None = None
    budget: BudgetSpec | None = None
    judge: JudgeSpec | None = None
    judge_node: Node | None = None
    for key, key_node, value in reader.mapping(node, _THEN_KEYS, "then"):
        where = f"then.{key}"
        if key == "decision":
            word = reader.word(value, where, _DECISIONS)
        elif key == "reason":
            reason = reader.text(value, where)
        elif reader.is_null(value):
            continue
        elif key == "approval_config":
            approval = _compile_approval(reader, value)
        elif key == "rate_limit":
            rate_limit = _compile_rate_limit(reader, value)
        elif key == "judge":
            judge, judge_node = _compile_judge(reader, value), key_node
        else:
            budget = _compile_budget(reader, value)
    if not word:
        return None
    if word == "judge":
        judge = judge or JudgeSpec()
        verdict = Verdict(judge.fallback)  # until the judge answers (kernel.domain.judge)
    elif judge is not None:
        reader.fail(judge_node, f'then.judge is only allowed with decision "judge", not "{word}"')
    else:
        verdict = Verdict(word)
    return Decision(
        verdict,
        rule_id,
        reason,
        approval=approval,
        rate_limit=rate_limit,
        budget=budget,
        policy_kind=PolicyKind.YAML,
        policy_revision=revision,
        judge=judge,
    )


def _compile_judge(reader: BundleReader, node: Node) -> JudgeSpec:
    instructions, threshold, fallback = "", DEFAULT_THRESHOLD, ""
    for key, _, value in reader.mapping(node, _JUDGE_KEYS, "then.judge"):
        where = f"then.judge.{key}"
        if key == "instructions":
            instructions = reader.text(value, where)
        elif key == "fallback":
            fallback = reader.word(value, where, _FALLBACKS)
        elif not reader.is_null(value):
            threshold = _probability(reader, value, where)
    return JudgeSpec(instructions=instructions, threshold=threshold or DEFAULT_THRESHOLD,
                     fallback=fallback or "require_approval")


def _probability(reader: BundleReader, node: Node, where: str) -> float:
    if not isinstance(node, ScalarNode) or node.tag not in (INT, FLOAT):
        reader.fail(node, f"{where} must be a number between 0 and 1")
    try:
        value = float(node.value.replace("_", ""))
    except ValueError:
        reader.fail(node, f'{where} must be a number between 0 and 1, got "{node.value}"')
    if not 0.0 <= value <= 1.0:
        reader.fail(node, f"{where} must be between 0 and 1, got {node.value}")
    return value


def _compile_approval(reader: BundleReader, node: Node) -> ApprovalConfig:
    approvers: tuple[str, ...] = ()
    timeout, message = 0.0, ""
    for key, _, value in reader.mapping(node, _APPROVAL_KEYS, "then.approval_config"):
        where = f"then.approval_config.{key}"
        if key == "approvers":
            approvers = tuple(reader.texts(value, where))
        elif key == "timeout":
            timeout = reader.duration(value, where)
        else:
            message = reader.text(value, where)
    return ApprovalConfig(approvers=approvers, timeout_seconds=timeout, message=message)


def _compile_rate_limit(reader: BundleReader, node: Node) -> RateLimitSpec:
    max_calls, window, max_wait = 0, 0.0, 0.0
    per_what, on_limiter_error = "", ""
    for key, _, value in reader.mapping(node, _RATE_LIMIT_KEYS, "then.rate_limit"):
        where = f"then.rate_limit.{key}"
        if key == "max_calls":
            max_calls = reader.integer(value, where)
        elif key == "window":
            window = reader.duration(value, where)
        elif key == "max_wait":
            max_wait = reader.duration(value, where)
        elif key == "per_what":
            per_what = reader.word(value, where, ("execution", "session", "agent", "global"))
        else:
            on_limiter_error = reader.word(value, where, ("allow", "deny"))
    return RateLimitSpec(
        max_calls=max_calls,
        window_seconds=window,
        per_what=per_what or "execution",
        max_wait_seconds=max_wait,
        on_limiter_error=on_limiter_error or "allow",
    )


def _compile_budget(reader: BundleReader, node: Node) -> BudgetSpec:
    max_tokens, on_exceed, scope = 0, "", ""
    for key, _, value in reader.mapping(node, _BUDGET_KEYS, "then.budget"):
        if key == "max_tokens":
            max_tokens = reader.integer(value, "then.budget.max_tokens")
        elif key == "scope":
            scope = reader.word(value, "then.budget.scope", ("execution", "session"))
        else:
            on_exceed = reader.word(value, "then.budget.on_exceed", ("deny", "require_approval"))
    return BudgetSpec(max_tokens=max_tokens, on_exceed=on_exceed or "deny", scope=scope or "execution")
