"""The shadowed-rule lint: only rules an earlier rule certainly pre-empts are reported."""

from __future__ import annotations

import pytest

from kernel.policy.yaml import compile_yaml_bundle


def _pair(first: str, second: str) -> list[tuple[str, str]]:
    text = (
        "rules:\n"
        f"  - id: first\n    when: {first}\n    then: {{decision: allow}}\n"
        f"  - id: second\n    when: {second}\n    then: {{decision: deny}}\n"
    )
    return compile_yaml_bundle(text, revision="r").shadowed_rules()


# (id, earlier when, later when, shadowed?)
PAIRS = [
    ("no-when-shadows-all", "~", "{target: x, arguments: {c: {equals: y}}}", True),
    ("empty-lists-are-no-conditions", "{targets: [], agent_ids: []}", "{target: x}", True),
    ("identical-literal", "{target: x}", "{target: x}", True),
    ("identical-glob", "{target: 'x*'}", "{target: 'x*'}", True),
    ("glob-covers-literal", "{target: 'mcp/*'}", "{target: mcp/read}", True),
    ("glob-covers-literal-targets", "{target: 'mcp/*'}", "{targets: [mcp/a, mcp/b]}", True),
    ("glob-misses-one-literal", "{target: 'mcp/*'}", "{targets: [mcp/a, b]}", False),
    ("literal-not-cover-glob", "{target: mcp/read}", "{target: 'mcp/*'}", False),
    ("different-globs-unknown", "{target: 'a*'}", "{target: 'ab*'}", False),
    ("universal-glob", "{target: '*'}", "{target: 'ab?'}", True),
    ("universal-in-targets", "{targets: [x, '**']}", "{step_kind: llm_call}", True),
    ("targets-superset", "{targets: [a, b]}", "{target: a}", True),
    ("targets-not-superset", "{targets: [a, b]}", "{targets: [a, c]}", False),
    ("targets-same-globs", "{targets: ['a*', 'b*']}", "{targets: ['b*']}", True),
    ("target-condition-missing-later", "{target: x}", "{step_kind: tool_call}", False),
    ("step-kind-wider", "{target: x}", "{target: x, step_kind: local}", True),
    ("step-kind-differs", "{step_kind: tool_call}", "{step_kind: llm_call}", False),
    ("step-kind-narrower", "{step_kind: tool_call}", "{target: x}", False),
    ("agent-ids-superset", "{agent_ids: [a, b]}", "{agent_ids: [b]}", True),
    ("agent-id-in-agent-ids", "{agent_ids: [a, b]}", "{agent_id: a}", True),
    ("agent-ids-not-subset", "{agent_id: a}", "{agent_ids: [a, b]}", False),
    ("agent-unconstrained-later", "{agent_id: a}", "{target: x}", False),
    ("arguments-only-earlier", "{arguments: {c: {contains: rm}}}", "{target: x}", False),
    ("arguments-only-later", "{target: x}", "{target: x, arguments: {c: {contains: rm}}}", True),
    (
        "contains-covers-equals",
        "{arguments: {c: {contains: rm}}}",
        "{arguments: {c: {equals: rm -rf}}}",
        True,
    ),
    (
        "contains-misses-equals",
        "{arguments: {c: {contains: rm}}}",
        "{arguments: {c: {equals: ls}}}",
        False,
    ),
    (
        "regex-covers-one-of",
        "{arguments: {c: {regex: '^rm'}}}",
        "{arguments: {c: {one_of: [rm, rmdir]}}}",
        True,
    ),
    (
        "regex-misses-one-of",
        "{arguments: {c: {regex: '^rm'}}}",
        "{arguments: {c: {one_of: [rm, ls]}}}",
        False,
    ),
    (
        "one-of-filtered-by-later-constraints",
        "{arguments: {c: {regex: '^rm'}}}",
        "{arguments: {c: {one_of: [rm, ls], contains: r}}}",
        True,
    ),
    (
        "shorter-contains-covers-longer",
        "{arguments: {c: {contains: rm}}}",
        "{arguments: {c: {contains: rm -rf}}}",
        True,
    ),
    (
        "longer-contains-not-cover-shorter",
        "{arguments: {c: {contains: rm -rf}}}",
        "{arguments: {c: {contains: rm}}}",
        False,
    ),
    (
        "same-regex",
        "{arguments: {c: {regex: x+}}}",
        "{arguments: {c: {regex: x+, contains: y}}}",
        True,
    ),
    (
        "different-regex-unknown",
        "{arguments: {c: {regex: '^rm'}}}",
        "{arguments: {c: {regex: '^rm -rf'}}}",
        False,
    ),
    (
        "equals-not-implied-by-contains",
        "{arguments: {c: {equals: rm}}}",
        "{arguments: {c: {contains: rm}}}",
        False,
    ),
    ("other-key", "{arguments: {c: {contains: rm}}}", "{arguments: {d: {contains: rm}}}", False),
    (
        "extra-key-later",
        "{arguments: {c: {contains: rm}}}",
        "{arguments: {c: {contains: rm}, d: {equals: x}}}",
        True,
    ),
]


@pytest.mark.parametrize(
    ("first", "second", "shadowed"), [p[1:] for p in PAIRS], ids=[p[0] for p in PAIRS]
)
def test_shadowed_only_when_certain(first: str, second: str, shadowed: bool) -> None:
    assert _pair(first, second) == ([("second", "first")] if shadowed else [])


def test_shadowed_names_the_earliest_covering_rule() -> None:
    text = (
        "rules:\n"
        "  - {id: a, when: {target: 'x*'}, then: {decision: allow}}\n"
        "  - {id: b, when: {target: x1}, then: {decision: deny}}\n"
        "  - {id: c, then: {decision: deny}}\n"
        "  - {id: d, when: {target: x1}, then: {decision: allow}}\n"
        "  - {id: e, when: {target: y}, then: {decision: allow}}\n"
    )
    assert compile_yaml_bundle(text, revision="r").shadowed_rules() == [
        ("b", "a"),
        ("d", "a"),
        ("e", "c"),
    ]


def test_distinct_literal_rules_are_not_shadowed() -> None:
    text = "rules:\n" + "".join(
        f"  - {{id: r{i}, when: {{target: t{i}}}, then: {{decision: allow}}}}\n" for i in range(100)
    )
    assert compile_yaml_bundle(text, revision="r").shadowed_rules() == []
