"""Loading YAML bundles (rebuno-v0.md §3.1, regent.md §2): every load error names its line."""

from __future__ import annotations

import textwrap

import pytest

from kernel.domain.decision import Verdict
from kernel.errors import ValidationError
from kernel.policy.yaml import MAX_BUNDLE_BYTES, MAX_RULES, compile_yaml_bundle


def _compile(text: str):
    return compile_yaml_bundle(textwrap.dedent(text), revision="rev-1")


def _rule(then: str = "{decision: allow}", when: str = "", rule_id: str = "r") -> str:
    lines = ["rules:", f"  - id: {rule_id}"]
    if when:
        lines.append(f"    when: {when}")
    lines.append(f"    then: {then}")
    return "\n".join(lines) + "\n"


# (id, bundle text, the exact error message). Line numbers are 1-based source lines.
LOAD_ERRORS = [
    (
        "unknown-then-key",
        """\
        default_action: deny
        rules:
          - id: allow-ls
            then: {decision: allow}
          - id: rm-rf
            then:
              decison: deny
        """,
        'line 7: rule "rm-rf": unknown key "decison" in then',
    ),
    ("unknown-top-key", "default:\n  decision: deny\n", 'line 1: unknown key "default"'),
    (
        "legacy-priority",
        "rules:\n  - id: r\n    priority: 1\n    then: {decision: allow}\n",
        'line 3: rule "r": unknown key "priority"',
    ),
    (
        "unknown-when-key",
        _rule(when="{tool_id: x}"),
        'line 3: rule "r": unknown key "tool_id" in when',
    ),
    (
        "legacy-step-count",
        _rule(when="{step_count: 3}"),
        'line 3: rule "r": unknown key "step_count" in when',
    ),
    (
        "unknown-predicate-key",
        _rule(when="{arguments: {command: {pattern: rm}}}"),
        'line 3: rule "r": unknown key "pattern" in when.arguments.command',
    ),
    (
        "legacy-list-arguments",
        _rule(when="{arguments: [{field: command, pattern: rm}]}"),
        'line 3: rule "r": when.arguments must be a mapping, got sequence',
    ),
    (
        "unknown-approval-key",
        _rule(then="{decision: require_approval, approval_config: {timeout_ms: 5}}"),
        'line 3: rule "r": unknown key "timeout_ms" in then.approval_config',
    ),
    (
        "unknown-rate-limit-key",
        _rule(then="{decision: allow, rate_limit: {calls: 5}}"),
        'line 3: rule "r": unknown key "calls" in then.rate_limit',
    ),
    (
        "unknown-budget-key",
        _rule(then="{decision: allow, budget: {tokens: 5}}"),
        'line 3: rule "r": unknown key "tokens" in then.budget',
    ),
    (
        "rule-id-in-then",
        _rule(then="{decision: allow, rule_id: other}"),
        'line 3: rule "r": unknown key "rule_id" in then',
    ),
    (
        "duplicate-top-key",
        "default_action: deny\nrules: []\ndefault_action: allow\n",
        'line 3: duplicate key "default_action" (first at line 1)',
    ),
    (
        "duplicate-when-key",
        "rules:\n  - id: r\n    when:\n      target: a\n      target: b\n    then: {decision: allow}\n",
        'line 5: rule "r": duplicate key "target" in when (first at line 4)',
    ),
    (
        "duplicate-argument-key",
        _rule(when="{arguments: {c: {equals: a}, c: {equals: b}}}"),
        'line 3: rule "r": duplicate key "c" in when.arguments (first at line 3)',
    ),
    (
        "max-calls-string",
        _rule(then='{decision: allow, rate_limit: {max_calls: "5", window: 1m}}'),
        'line 3: rule "r": then.rate_limit.max_calls must be an integer, got string "5"',
    ),
    (
        "max-calls-float",
        _rule(then="{decision: allow, rate_limit: {max_calls: 5.0}}"),
        'line 3: rule "r": then.rate_limit.max_calls must be an integer, got float "5.0"',
    ),
    (
        "max-calls-bool",
        _rule(then="{decision: allow, rate_limit: {max_calls: true}}"),
        'line 3: rule "r": then.rate_limit.max_calls must be an integer, got boolean "true"',
    ),
    (
        "max-calls-out-of-range",
        _rule(then="{decision: allow, rate_limit: {max_calls: 9223372036854775808}}"),
        'line 3: rule "r": then.rate_limit.max_calls is out of range for a 64-bit integer',
    ),
    (
        "max-tokens-string",
        _rule(then="{decision: allow, budget: {max_tokens: lots}}"),
        'line 3: rule "r": then.budget.max_tokens must be an integer, got string "lots"',
    ),
    (
        "decision-bool",
        _rule(then="{decision: true}"),
        'line 3: rule "r": then.decision must be a string, got boolean "true"',
    ),
    (
        "decision-wrong-case",
        _rule(then="{decision: Allow}"),
        'line 3: rule "r": then.decision must be one of allow, deny, require_approval, judge; got "Allow"',
    ),
    (
        "decision-unknown",
        _rule(then="{decision: require-approval}"),
        'line 3: rule "r": then.decision must be one of allow, deny, require_approval, judge; got "require-approval"',
    ),
    ("decision-missing", _rule(then="{reason: x}"), 'line 3: rule "r": missing then.decision'),
    ("decision-empty", _rule(then='{decision: ""}'), 'line 3: rule "r": missing then.decision'),
    ("decision-null", _rule(then="{decision: ~}"), 'line 3: rule "r": missing then.decision'),
    ("then-null", _rule(then="~"), 'line 3: rule "r": missing then.decision'),
    (
        "then-missing",
        "rules:\n  - id: r\n    when: {target: x}\n",
        'line 2: rule "r": missing then.decision',
    ),
    (
        "judge-block-without-judge-decision",
        _rule(then="{decision: allow, judge: {threshold: 0.5}}"),
        'line 3: rule "r": then.judge is only allowed with decision "judge", not "allow"',
    ),
    (
        "judge-threshold-above-one",
        _rule(then="{decision: judge, judge: {threshold: 1.5}}"),
        'line 3: rule "r": then.judge.threshold must be between 0 and 1, got 1.5',
    ),
    (
        "judge-threshold-negative",
        _rule(then="{decision: judge, judge: {threshold: -0.1}}"),
        'line 3: rule "r": then.judge.threshold must be between 0 and 1, got -0.1',
    ),
    (
        "judge-threshold-string",
        _rule(then='{decision: judge, judge: {threshold: "0.5"}}'),
        'line 3: rule "r": then.judge.threshold must be a number between 0 and 1',
    ),
    (
        "judge-fallback-unknown",
        _rule(then="{decision: judge, judge: {fallback: judge}}"),
        'line 3: rule "r": then.judge.fallback must be one of allow, deny, require_approval; got "judge"',
    ),
    (
        "judge-unknown-key",
        _rule(then="{decision: judge, judge: {model: gpt}}"),
        'line 3: rule "r": unknown key "model" in then.judge',
    ),
    (
        "timeout-integer",
        _rule(then="{decision: require_approval, approval_config: {timeout: 300}}"),
        'line 3: rule "r": then.approval_config.timeout must be a duration string such as "30s" or "5m", got integer "300"',
    ),
    (
        "timeout-zero-integer",
        _rule(then="{decision: require_approval, approval_config: {timeout: 0}}"),
        'line 3: rule "r": then.approval_config.timeout must be a duration string such as "30s" or "5m", got integer "0"',
    ),
    (
        "window-float",
        _rule(then="{decision: allow, rate_limit: {max_calls: 1, window: 1.5}}"),
        'line 3: rule "r": then.rate_limit.window must be a duration string such as "30s" or "5m", got float "1.5"',
    ),
    (
        "window-missing-unit",
        _rule(then='{decision: allow, rate_limit: {max_calls: 1, window: "300"}}'),
        'line 3: rule "r": then.rate_limit.window: missing unit in duration "300"',
    ),
    (
        "max-wait-bad-unit",
        _rule(then="{decision: allow, rate_limit: {max_wait: 5x}}"),
        'line 3: rule "r": then.rate_limit.max_wait: unknown unit "x" in duration "5x"',
    ),
    (
        "timeout-negative",
        _rule(then="{decision: require_approval, approval_config: {timeout: -5m}}"),
        'line 3: rule "r": then.approval_config.timeout: negative duration "-5m" is not allowed',
    ),
    (
        "default-action-require-approval",
        "default_action: require_approval\n",
        'line 1: default_action must be one of allow, deny; got "require_approval"',
    ),
    (
        "default-action-capitalised",
        "default_action: Allow\n",
        'line 1: default_action must be one of allow, deny; got "Allow"',
    ),
    (
        "default-action-bool",
        "default_action: true\n",
        'line 1: default_action must be a string, got boolean "true"',
    ),
    ("missing-id", "rules:\n  - then: {decision: allow}\n", "line 2: rule #1: missing id"),
    (
        "empty-id",
        "rules:\n  - id: ''\n    then: {decision: allow}\n",
        "line 2: rule #1: missing id",
    ),
    (
        "null-rule",
        "rules:\n  - {id: a, then: {decision: allow}}\n  - ~\n",
        "line 3: rule #2: missing id",
    ),
    (
        "missing-id-reports-earlier-error-first",
        "rules:\n  - when: {target: x, nope: 1}\n    then: {decision: allow}\n",
        'line 2: rule #1: unknown key "nope" in when',
    ),
    (
        "duplicate-id",
        "rules:\n  - id: a\n    then: {decision: allow}\n  - id: a\n    then: {decision: deny}\n",
        'line 4: rule "a": duplicate rule id "a" (first at line 2)',
    ),
    (
        "per-what",
        _rule(then="{decision: allow, rate_limit: {max_calls: 1, window: 1m, per_what: user}}"),
        'line 3: rule "r": then.rate_limit.per_what must be one of execution, session, agent, global; got "user"',
    ),
    (
        "on-limiter-error",
        _rule(then="{decision: allow, rate_limit: {on_limiter_error: retry}}"),
        'line 3: rule "r": then.rate_limit.on_limiter_error must be one of allow, deny; got "retry"',
    ),
    (
        "on-exceed",
        _rule(then="{decision: allow, budget: {max_tokens: 5, on_exceed: allow}}"),
        'line 3: rule "r": then.budget.on_exceed must be one of deny, require_approval; got "allow"',
    ),
    (
        "empty-predicate-mapping",
        _rule(when="{arguments: {command: {}}}"),
        'line 3: rule "r": argument "command" has no constraint (an empty predicate matches any value)',
    ),
    (
        "empty-predicate-equals",
        _rule(when='{arguments: {command: {equals: ""}}}'),
        'line 3: rule "r": argument "command" has no constraint (an empty predicate matches any value)',
    ),
    (
        "empty-predicate-one-of",
        _rule(when="{arguments: {command: {one_of: []}}}"),
        'line 3: rule "r": argument "command" has no constraint (an empty predicate matches any value)',
    ),
    (
        "empty-predicate-nulls",
        _rule(when="{arguments: {command: {equals: ~, regex: ~, one_of: ~}}}"),
        'line 3: rule "r": argument "command" has no constraint (an empty predicate matches any value)',
    ),
    (
        "empty-predicate-null",
        _rule(when="{arguments: {command: ~}}"),
        'line 3: rule "r": argument "command" has no constraint (an empty predicate matches any value)',
    ),
    (
        "predicate-scalar",
        _rule(when="{arguments: {command: rm}}"),
        'line 3: rule "r": when.arguments.command must be a mapping, got string "rm"',
    ),
    (
        "one-of-scalar",
        _rule(when="{arguments: {command: {one_of: ls}}}"),
        'line 3: rule "r": when.arguments.command.one_of must be a list, got string "ls"',
    ),
    (
        "glob-target",
        _rule(when='{target: "x[a"}'),
        'line 3: rule "r": when.target: malformed glob "x[a": unterminated character class',
    ),
    (
        "glob-targets",
        "rules:\n  - id: r\n    when:\n      targets:\n        - ok_*\n        - '[]x]'\n    then: {decision: allow}\n",
        'line 6: rule "r": when.targets[1]: malformed glob "[]x]": empty character class ("]" right after "[" or "[^")',
    ),
    (
        "glob-trailing-backslash",
        _rule(when="{target: 'x\\'}"),
        'line 3: rule "r": when.target: malformed glob "x\\": trailing "\\" at the end of the pattern',
    ),
    (
        "regex-invalid",
        "rules:\n  - id: r\n    when:\n      arguments:\n        command:\n          contains: rm\n          regex: '(rm'\n    then: {decision: deny}\n",
        'line 7: rule "r": when.arguments.command.regex: invalid regex "(rm": missing ): (rm',
    ),
    (
        "regex-lookahead",
        _rule(when="{arguments: {command: {regex: 'rm(?= -rf)'}}}"),
        'line 3: rule "r": when.arguments.command.regex: invalid regex "rm(?= -rf)": invalid perl operator: (?=',
    ),
    (
        "regex-backreference",
        _rule(when="{arguments: {command: {regex: '(a)\\1'}}}"),
        'line 3: rule "r": when.arguments.command.regex: invalid regex "(a)\\1": invalid escape sequence: \\1',
    ),
    ("rules-not-list", "rules: {id: r}\n", "line 1: rules must be a list, got mapping"),
    (
        "rule-not-mapping",
        "rules:\n  - allow\n",
        'line 2: rule #1: rule must be a mapping, got string "allow"',
    ),
    (
        "when-not-mapping",
        _rule(when="[x]"),
        'line 3: rule "r": when must be a mapping, got sequence',
    ),
    (
        "targets-scalar",
        _rule(when="{targets: x}"),
        'line 3: rule "r": when.targets must be a list, got string "x"',
    ),
    (
        "approvers-scalar",
        _rule(then="{decision: require_approval, approval_config: {approvers: ops}}"),
        'line 3: rule "r": then.approval_config.approvers must be a list, got string "ops"',
    ),
    (
        "target-mapping",
        _rule(when="{target: {glob: x}}"),
        'line 3: rule "r": when.target must be a string, got mapping',
    ),
    (
        "custom-tag",
        _rule(then="{decision: allow, reason: !secret x}"),
        'line 3: rule "r": then.reason: unsupported YAML tag !secret',
    ),
    ("bundle-list", "- id: r\n", "line 1: bundle must be a mapping, got sequence"),
    ("bundle-scalar", "allow\n", 'line 1: bundle must be a mapping, got string "allow"'),
    ("yaml-syntax", "rules:\n  - id: a\n   then: x\n", "line 3: YAML:"),
    ("yaml-bad-indent-value", "a: b: c\n", "line 1: YAML: mapping values are not allowed here"),
    ("yaml-undefined-alias", "rules: *missing\n", "line 1: YAML: found undefined alias 'missing'"),
    (
        "yaml-tab",
        "rules:\n\t- id: a\n",
        "line 2: YAML: found character '\\t' that cannot start any token (while scanning for the next token)",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [e[1:] for e in LOAD_ERRORS], ids=[e[0] for e in LOAD_ERRORS]
)
def test_load_error_names_line_and_rule(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _compile(text)
    assert caught.value.code == "validation_error"
    if message.endswith(":"):
        assert caught.value.message.startswith(f"invalid policy bundle: {message}")
    else:
        assert caught.value.message == f"invalid policy bundle: {message}"


def test_load_error_details_carry_line_and_rule_id() -> None:
    with pytest.raises(ValidationError) as caught:
        _compile(_rule(then="{decision: maybe}", rule_id="ask-model"))
    assert caught.value.details == {"line": 3, "rule_id": "ask-model"}


def test_bundle_over_size_limit_is_rejected() -> None:
    text = "# " + "x" * MAX_BUNDLE_BYTES + "\n"
    with pytest.raises(ValidationError, match="larger than 1048576 bytes"):
        compile_yaml_bundle(text, revision="r")


def test_bundle_size_limit_counts_utf8_bytes() -> None:
    text = (
        "# " + "é" * (MAX_BUNDLE_BYTES // 2) + "\n"
    )  # fewer characters than the limit, more bytes
    with pytest.raises(ValidationError, match="larger than"):
        compile_yaml_bundle(text, revision="r")


def test_bundle_with_too_many_rules_is_rejected() -> None:
    rules = "".join(f"- {{id: r{i}, then: {{decision: allow}}}}\n" for i in range(MAX_RULES + 1))
    with pytest.raises(
        ValidationError, match=rf"line {MAX_RULES + 2}: too many rules \(the limit is {MAX_RULES}\)"
    ):
        compile_yaml_bundle("rules:\n" + rules, revision="r")


def test_alias_amplification_is_capped() -> None:
    # 300 aliases of one 5000-item list: small text, 1.5 million nodes to walk.
    one_of = "[" + ", ".join(f"v{i}" for i in range(5000)) + "]"
    first = f"- {{id: r, when: {{arguments: {{k: {{one_of: &big {one_of}}}}}}}, then: {{decision: allow}}}}\n"
    aliases = "".join(
        f"- {{id: r{i}, when: {{arguments: {{k: {{one_of: *big}}}}}}, then: {{decision: allow}}}}\n"
        for i in range(300)
    )
    text = "rules:\n" + first + aliases
    with pytest.raises(ValidationError, match="too many YAML nodes"):
        compile_yaml_bundle(text, revision="r")


@pytest.mark.parametrize(
    "text",
    ["", " ", "\n\n", "# only a comment\n", "---\n", "~\n", "---\n...\n"],
    ids=["empty", "space", "newlines", "comment", "empty-document", "null", "explicit-end"],
)
def test_empty_text_compiles_to_empty_default_deny_bundle(text: str) -> None:
    bundle = compile_yaml_bundle(text, revision="r")
    assert bundle.rules == ()
    assert bundle.default_action is Verdict.DENY


def test_only_first_yaml_document_is_read() -> None:
    bundle = _compile("default_action: allow\n---\nrules: [ this is not : valid\n")
    assert bundle.default_action is Verdict.ALLOW
    assert bundle.rules == ()


ACCEPTED = [
    (
        "contains-with-empty-equals",
        _rule(when='{arguments: {command: {contains: rm, equals: ""}}}'),
    ),
    ("one-of-empty-string", _rule(when='{arguments: {command: {one_of: [""]}}}')),
    (
        "empty-enums-mean-default",
        _rule(then='{decision: allow, rate_limit: {per_what: "", on_limiter_error: ""}}'),
    ),
    (
        "zero-duration-string",
        _rule(then='{decision: require_approval, approval_config: {timeout: "0"}}'),
    ),
    (
        "negative-zero-duration",
        _rule(then="{decision: require_approval, approval_config: {timeout: -0s}}"),
    ),
    ("max-calls-without-window", _rule(then="{decision: allow, rate_limit: {max_calls: 5}}")),
    (
        "negative-max-calls",
        _rule(then="{decision: allow, rate_limit: {max_calls: -1, window: 1m}}"),
    ),
    ("rate-limit-on-deny", _rule(then="{decision: deny, rate_limit: {max_calls: 1, window: 1m}}")),
    ("budget-on-deny", _rule(then="{decision: deny, budget: {max_tokens: 10}}")),
    ("unknown-step-kind", _rule(when="{step_kind: teleport}")),
    ("numeric-id", _rule(rule_id="42")),
    (
        "null-sections",
        _rule(when="~", then="{decision: allow, approval_config: ~, rate_limit: ~, budget: ~}"),
    ),
    ("empty-lists", _rule(when="{targets: [], agent_ids: []}")),
    ("rules-null", "rules: ~\n"),
    ("reversed-class-range", _rule(when="{target: 'x[z-a]'}")),
    (
        "anchors-and-aliases",
        "rules:\n  - id: a\n    then: &ask {decision: require_approval, approval_config: {approvers: [ops]}}\n"
        "  - id: b\n    then: *ask\n",
    ),
]


@pytest.mark.parametrize("text", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_bundle_accepted_silently(text: str) -> None:
    _compile(text)


@pytest.mark.parametrize("text", ["\x85\x8b\xd3Q\x14K'", "rules: \x14", "\x00"], ids=["fuzzed", "in-value", "nul"])
def test_control_characters_are_a_load_error_not_a_crash(text: str) -> None:
    # Found by the reliability fuzzer: PyYAML's reader refuses these when the loader is built.
    with pytest.raises(ValidationError, match="unacceptable character"):
        compile_yaml_bundle(text, revision="r")
