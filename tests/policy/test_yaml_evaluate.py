"""Evaluating YAML bundles (rebuno-v0.md §3.2-§3.5): first match, fall-through, when/then fields."""

from __future__ import annotations

import itertools
import textwrap
import time
from typing import Any

import pytest

from kernel.domain.decision import (
    ApprovalConfig,
    BudgetSpec,
    Decision,
    PolicyInput,
    PolicyKind,
    RateLimitSpec,
    Verdict,
)
from kernel.policy.yaml import YamlBundle, compile_yaml_bundle


def _bundle(text: str, revision: str = "rev-1") -> YamlBundle:
    return compile_yaml_bundle(textwrap.dedent(text), revision=revision)


def _step(
    target: str = "shell_exec", args: Any = None, kind: str = "tool_call", agent: str = "shell"
) -> PolicyInput:
    return PolicyInput(agent_id=agent, kind=kind, target=target, args=args)


def _one_rule(when: str) -> YamlBundle:
    return _bundle(f"rules:\n  - id: hit\n    when: {when}\n    then: {{decision: allow}}\n")


# (id, when, step, matches)
WHEN_CASES = [
    ("no-when", "~", _step(), True),
    ("empty-when", "{}", _step(), True),
    ("target-equal", "{target: shell_exec}", _step("shell_exec"), True),
    ("target-differs", "{target: shell_exec}", _step("shell"), False),
    ("target-case-sensitive", "{target: shell_exec}", _step("Shell_exec"), False),
    ("target-empty-is-unset", '{target: ""}', _step("anything"), True),
    ("target-glob-crosses-slash", "{target: 'mcp/*delete'}", _step("mcp/nested/fs_delete"), True),
    ("target-glob-anchored", "{target: 'mcp/*'}", _step("x/mcp/a"), False),
    ("targets-any", "{targets: [a, 'b*']}", _step("bee"), True),
    ("targets-none", "{targets: [a, 'b*']}", _step("cee"), False),
    ("targets-empty-unchecked", "{targets: []}", _step("cee"), True),
    ("target-and-targets-both", "{target: 'b*', targets: [bee, bar]}", _step("bar"), True),
    ("target-and-targets-one-fails", "{target: 'b*', targets: [bee]}", _step("bar"), False),
    ("agent-id-equal", "{agent_id: shell}", _step(agent="shell"), True),
    ("agent-id-differs", "{agent_id: shell}", _step(agent="shell2"), False),
    ("agent-id-no-glob", "{agent_id: 'sh*'}", _step(agent="shell"), False),
    ("agent-ids-member", "{agent_ids: [a, shell]}", _step(agent="shell"), True),
    ("agent-ids-not-member", "{agent_ids: [a, b]}", _step(agent="shell"), False),
    ("agent-ids-empty-unchecked", "{agent_ids: []}", _step(agent="shell"), True),
    ("step-kind-equal", "{step_kind: llm_call}", _step(kind="llm_call"), True),
    ("step-kind-differs", "{step_kind: llm_call}", _step(kind="tool_call"), False),
    ("step-kind-local", "{step_kind: local}", _step(kind="local"), True),
    (
        "all-conditions-and",
        "{target: shell_exec, agent_id: shell, step_kind: tool_call}",
        _step(),
        True,
    ),
    (
        "all-conditions-one-fails",
        "{target: shell_exec, agent_id: other, step_kind: tool_call}",
        _step(),
        False,
    ),
    ("equals", "{arguments: {command: {equals: ls}}}", _step(args={"command": "ls"}), True),
    (
        "equals-not-substring",
        "{arguments: {command: {equals: ls}}}",
        _step(args={"command": "ls -la"}),
        False,
    ),
    (
        "contains",
        "{arguments: {command: {contains: rm}}}",
        _step(args={"command": "sudo rm x"}),
        True,
    ),
    (
        "contains-missing",
        "{arguments: {command: {contains: rm}}}",
        _step(args={"command": "ls"}),
        False,
    ),
    ("one-of", "{arguments: {mode: {one_of: [r, rw]}}}", _step(args={"mode": "rw"}), True),
    ("one-of-missing", "{arguments: {mode: {one_of: [r, rw]}}}", _step(args={"mode": "w"}), False),
    ("one-of-empty-string", '{arguments: {mode: {one_of: [""]}}}', _step(args={"mode": ""}), True),
    (
        "regex-unanchored",
        "{arguments: {command: {regex: rm}}}",
        _step(args={"command": "farm"}),
        True,
    ),
    (
        "regex-anchored",
        "{arguments: {command: {regex: '^rm'}}}",
        _step(args={"command": "farm"}),
        False,
    ),
    (
        "regex-on-number",
        "{arguments: {n: {regex: '^1e\\+0[0-9]$'}}}",
        _step(args={"n": 1000000}),
        True,
    ),
    (
        "constraints-all-must-pass",
        "{arguments: {c: {contains: rm, regex: '-rf'}}}",
        _step(args={"c": "rm -r"}),
        False,
    ),
    (
        "contains-with-empty-equals",
        '{arguments: {c: {contains: rm, equals: ""}}}',
        _step(args={"c": "rm"}),
        True,
    ),
    (
        "all-keys-must-pass",
        "{arguments: {a: {equals: x}, b: {equals: y}}}",
        _step(args={"a": "x", "b": "z"}),
        False,
    ),
    ("key-absent", "{arguments: {command: {regex: '.*'}}}", _step(args={"cmd": "ls"}), False),
    (
        "key-null-is-present",
        "{arguments: {command: {equals: '<nil>'}}}",
        _step(args={"command": None}),
        True,
    ),
    ("key-is-literal-not-path", "{arguments: {a.b: {equals: x}}}", _step(args={"a.b": "x"}), True),
    ("key-no-nested-path", "{arguments: {a.b: {equals: x}}}", _step(args={"a": {"b": "x"}}), False),
    ("args-none", "{arguments: {c: {regex: '.*'}}}", _step(args=None), False),
    ("args-list", "{arguments: {c: {regex: '.*'}}}", _step(args=[{"c": "x"}]), False),
    ("args-scalar", "{arguments: {c: {regex: '.*'}}}", _step(args="c"), False),
    (
        "args-huge-number",
        "{arguments: {c: {regex: '.*'}}}",
        _step(args={"c": "x", "n": 10**400}),
        False,
    ),
    ("arguments-empty-unchecked", "{arguments: {}}", _step(args=None), True),
    ("equals-5-matches-number", "{arguments: {n: {equals: 5}}}", _step(args={"n": 5}), True),
    ("equals-5-matches-float", "{arguments: {n: {equals: 5}}}", _step(args={"n": 5.0}), True),
    ("equals-1.0-is-text", "{arguments: {n: {equals: 1.0}}}", _step(args={"n": 1.0}), False),
    (
        "equals-1.0-matches-string",
        "{arguments: {n: {equals: 1.0}}}",
        _step(args={"n": "1.0"}),
        True,
    ),
    ("equals-go-float-form", "{arguments: {n: {equals: 1e+06}}}", _step(args={"n": 1000000}), True),
    ("equals-true-is-text", "{arguments: {f: {equals: true}}}", _step(args={"f": True}), True),
    ("equals-yes-is-text", "{arguments: {f: {equals: yes}}}", _step(args={"f": True}), False),
    ("equals-hex-is-text", "{arguments: {n: {equals: 0x10}}}", _step(args={"n": 16}), False),
    ("equals-array", "{arguments: {l: {equals: '[a 1]'}}}", _step(args={"l": ["a", 1]}), True),
    (
        "equals-object",
        "{arguments: {o: {equals: 'map[a:1 b:x]'}}}",
        _step(args={"o": {"b": "x", "a": 1}}),
        True,
    ),
]


@pytest.mark.parametrize(
    ("when", "step", "matches"), [c[1:] for c in WHEN_CASES], ids=[c[0] for c in WHEN_CASES]
)
def test_when_condition(when: str, step: PolicyInput, matches: bool) -> None:
    decision = _one_rule(when).evaluate(step)
    assert (decision.rule_id == "hit") is matches
    [trace] = _one_rule(when).explain(step)
    assert trace.matched is matches


THEN_CASES = [
    ("allow", "{decision: allow}", Decision(Verdict.ALLOW, "r")),
    ("deny-without-reason-leaves-it-empty", "{decision: deny}", Decision(Verdict.DENY, "r")),
    ("deny-with-reason", "{decision: deny, reason: no rm}", Decision(Verdict.DENY, "r", "no rm")),
    ("reason-number-is-text", "{decision: deny, reason: 42}", Decision(Verdict.DENY, "r", "42")),
    (
        "require-approval",
        "{decision: require_approval, approval_config: {approvers: [alice, bob], timeout: 1h30m, message: 'ok?'}}",
        Decision(
            Verdict.REQUIRE_APPROVAL, "r", approval=ApprovalConfig(("alice", "bob"), 5400.0, "ok?")
        ),
    ),
    (
        "approval-defaults",
        "{decision: require_approval, approval_config: {}}",
        Decision(Verdict.REQUIRE_APPROVAL, "r", approval=ApprovalConfig()),
    ),
    (
        "rate-limit",
        "{decision: allow, rate_limit: {max_calls: 5, window: 1m, per_what: agent, max_wait: 300ms, on_limiter_error: deny}}",
        Decision(Verdict.ALLOW, "r", rate_limit=RateLimitSpec(5, 60.0, "agent", 0.3, "deny")),
    ),
    (
        "rate-limit-defaults",
        "{decision: allow, rate_limit: {max_calls: 5, window: 1.5h}}",
        Decision(
            Verdict.ALLOW, "r", rate_limit=RateLimitSpec(5, 5400.0, "execution", 0.0, "allow")
        ),
    ),
    (
        "budget",
        "{decision: allow, budget: {max_tokens: 1000, on_exceed: require_approval}}",
        Decision(Verdict.ALLOW, "r", budget=BudgetSpec(1000, "require_approval")),
    ),
    (
        "budget-defaults",
        "{decision: allow, budget: {max_tokens: 0}}",
        Decision(Verdict.ALLOW, "r", budget=BudgetSpec(0, "deny")),
    ),
    (
        "budget-with-approval-for-on-exceed",
        "{decision: allow, budget: {max_tokens: 9, on_exceed: require_approval}, approval_config: {approvers: [ops]}}",
        Decision(
            Verdict.ALLOW,
            "r",
            approval=ApprovalConfig(("ops",)),
            budget=BudgetSpec(9, "require_approval"),
        ),
    ),
]


@pytest.mark.parametrize(
    ("then", "expected"), [c[1:] for c in THEN_CASES], ids=[c[0] for c in THEN_CASES]
)
def test_then_becomes_decision(then: str, expected: Decision) -> None:
    decision = _bundle(f"rules:\n  - id: r\n    then: {then}\n", revision="abc123").evaluate(
        _step()
    )
    assert decision == Decision(
        expected.verdict,
        expected.rule_id,
        expected.reason,
        approval=expected.approval,
        rate_limit=expected.rate_limit,
        budget=expected.budget,
        policy_kind=PolicyKind.YAML,
        policy_revision="abc123",
    )


FALL_THROUGH = [
    (
        "tool-call-default-deny",
        "",
        _step(),
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    (
        "explicit-default-deny",
        "default_action: deny\n",
        _step(),
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    (
        "default-allow",
        "default_action: allow\n",
        _step(),
        Verdict.ALLOW,
        "default",
        "default allow",
    ),
    (
        "empty-default-action",
        'default_action: ""\n',
        _step(),
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    (
        "llm-call-default",
        "",
        _step(kind="llm_call"),
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    (
        "unknown-kind-default",
        "",
        _step(kind="teleport"),
        Verdict.DENY,
        "default",
        "no explicit allow rule matched",
    ),
    ("local-under-deny", "", _step(kind="local"), Verdict.ALLOW, "local", "local step"),
    (
        "local-under-allow",
        "default_action: allow\n",
        _step(kind="local"),
        Verdict.ALLOW,
        "local",
        "local step",
    ),
]


@pytest.mark.parametrize(
    ("header", "step", "verdict", "rule_id", "reason"),
    [c[1:] for c in FALL_THROUGH],
    ids=[c[0] for c in FALL_THROUGH],
)
def test_unmatched_step_falls_through(
    header: str, step: PolicyInput, verdict: Verdict, rule_id: str, reason: str
) -> None:
    text = (
        header
        + "rules:\n  - id: other\n    when: {target: not_this}\n    then: {decision: allow}\n"
    )
    decision = _bundle(text, revision="rev-9").evaluate(step)
    assert (decision.verdict, decision.rule_id, decision.reason) == (verdict, rule_id, reason)
    assert (decision.policy_kind, decision.policy_revision) == (PolicyKind.YAML, "rev-9")


def test_local_step_matching_a_rule_gets_its_decision() -> None:
    bundle = _bundle(
        "rules:\n  - id: no-charge\n    when: {target: charge_card}\n    then: {decision: deny}\n"
    )
    decision = bundle.evaluate(_step("charge_card", kind="local"))
    assert (decision.verdict, decision.rule_id) == (Verdict.DENY, "no-charge")


@pytest.mark.parametrize(
    ("text", "kind", "verdict"),
    [
        ("", "tool_call", Verdict.DENY),
        (" ", "local", Verdict.ALLOW),
        ("# c", "local", Verdict.ALLOW),
    ],
)
def test_empty_bundle_denies_everything_but_local_steps(
    text: str, kind: str, verdict: Verdict
) -> None:
    assert compile_yaml_bundle(text, revision="r").evaluate(_step(kind=kind)).verdict is verdict


ORDERED = """\
rules:
  - id: deny-rm
    when: {target: shell_exec, arguments: {command: {regex: 'rm\\s'}}}
    then: {decision: deny}
  - id: glob-first
    when: {target: 'mcp/*'}
    then: {decision: require_approval}
  - id: literal-after-glob
    when: {target: mcp/read}
    then: {decision: allow}
  - id: shell
    when: {target: shell_exec}
    then: {decision: allow}
  - id: shell-again
    when: {targets: [shell_exec, other]}
    then: {decision: deny}
  - id: catch-all
    when: {step_kind: llm_call}
    then: {decision: deny}
"""

ORDER_CASES = [
    ("arguments-rule-first", _step("shell_exec", {"command": "rm x"}), "deny-rm"),
    ("falls-to-next-literal", _step("shell_exec", {"command": "ls"}), "shell"),
    ("earlier-glob-beats-later-literal", _step("mcp/read"), "glob-first"),
    ("earlier-literal-beats-later-glob", _step("shell_exec", kind="llm_call"), "shell"),
    ("targets-list-literal", _step("other"), "shell-again"),
    ("unindexed-rule", _step("model", kind="llm_call"), "catch-all"),
    ("nothing", _step("model"), "default"),
]


@pytest.mark.parametrize(
    ("step", "rule_id"), [c[1:] for c in ORDER_CASES], ids=[c[0] for c in ORDER_CASES]
)
def test_first_matching_rule_in_file_order_wins(step: PolicyInput, rule_id: str) -> None:
    assert _bundle(ORDERED).evaluate(step).rule_id == rule_id


def test_explain_agrees_with_evaluate_on_every_input() -> None:
    bundle = _bundle(ORDERED)
    targets = ["shell_exec", "mcp/read", "mcp/x", "other", "model", ""]
    kinds = ["tool_call", "llm_call", "local"]
    argses: list[Any] = [None, {"command": "rm x"}, {"command": "ls"}, ["rm x"]]
    for target, kind, args in itertools.product(targets, kinds, argses):
        step = _step(target, args, kind)
        traces = bundle.explain(step)
        selected = [t.rule_id for t in traces if t.selected]
        decision = bundle.evaluate(step)
        assert selected == (
            [decision.rule_id] if decision.rule_id not in ("default", "local") else []
        )
        assert [t.rule_id for t in traces] == list(bundle.rule_ids)


EXPLAIN_CASES = [
    ("step_kind", "{step_kind: llm_call, target: x}", _step("y"), "step_kind"),
    ("agent_id", "{agent_id: a, target: x}", _step("y", agent="b"), "agent_id"),
    ("agent_ids", "{agent_ids: [a]}", _step(agent="b"), "agent_ids"),
    ("target", "{target: 'x*'}", _step("y"), "target"),
    ("targets", "{targets: ['x*']}", _step("y"), "targets"),
    ("args-not-object", "{arguments: {c: {equals: x}}}", _step(args=None), "arguments"),
    ("key-absent", "{arguments: {c: {equals: x}}}", _step(args={}), "arguments.c"),
    (
        "equals",
        "{arguments: {c: {equals: x, contains: y}}}",
        _step(args={"c": "y"}),
        "arguments.c.equals",
    ),
    ("contains", "{arguments: {c: {contains: y}}}", _step(args={"c": "x"}), "arguments.c.contains"),
    ("one_of", "{arguments: {c: {one_of: [y]}}}", _step(args={"c": "x"}), "arguments.c.one_of"),
    ("regex", "{arguments: {c: {regex: '^y'}}}", _step(args={"c": "x"}), "arguments.c.regex"),
    (
        "second-key",
        "{arguments: {a: {equals: x}, b: {equals: y}}}",
        _step(args={"a": "x", "b": "z"}),
        "arguments.b.equals",
    ),
]


@pytest.mark.parametrize(
    ("when", "step", "failed"), [c[1:] for c in EXPLAIN_CASES], ids=[c[0] for c in EXPLAIN_CASES]
)
def test_explain_names_first_failed_condition(when: str, step: PolicyInput, failed: str) -> None:
    [trace] = _one_rule(when).explain(step)
    assert (trace.rule_id, trace.line, trace.matched, trace.selected, trace.failed) == (
        "hit",
        2,
        False,
        False,
        failed,
    )
    assert trace.detail


def test_explain_marks_only_first_match_selected() -> None:
    bundle = _bundle(
        "rules:\n  - {id: a, then: {decision: allow}}\n  - {id: b, then: {decision: deny}}\n"
    )
    traces = bundle.explain(_step())
    assert [(t.rule_id, t.matched, t.selected) for t in traces] == [
        ("a", True, True),
        ("b", True, False),
    ]


@pytest.mark.parametrize(
    "args",
    [
        {"c": float("nan")},
        {"c": 10**400},
        {"c": [[[[["x"]]]]]},
        {"c": "\ud800"},
        5,
        "x",
        [1],
        None,
        {"c": {"d": None}},
    ],
    ids=[
        "nan",
        "huge-int",
        "nested",
        "lone-surrogate",
        "int",
        "str",
        "list",
        "none",
        "nested-null",
    ],
)
def test_evaluate_never_raises_on_odd_args(args: Any) -> None:
    bundle = _one_rule("{arguments: {c: {regex: 'x', contains: x}}}")
    assert bundle.evaluate(_step(args=args)).verdict in (Verdict.ALLOW, Verdict.DENY)


def test_catastrophic_regex_against_100kb_argument_decides_fast() -> None:
    # `(a+)+$` backtracks exponentially in Python's re; RE2 is linear. Acceptance: < 10 ms.
    bundle = _one_rule("{arguments: {payload: {regex: '(a+)+$'}}}")
    step = _step(args={"payload": "a" * 100_000 + "!"})
    assert bundle.evaluate(step).rule_id == "default"
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        bundle.evaluate(step)
        best = min(best, time.perf_counter() - started)
    assert best < 0.010, f"took {best * 1000:.2f} ms"


def test_rule_ids_in_file_order() -> None:
    assert _bundle(ORDERED).rule_ids == (
        "deny-rm",
        "glob-first",
        "literal-after-glob",
        "shell",
        "shell-again",
        "catch-all",
    )


def test_indexed_evaluation_agrees_with_a_scan_in_file_order() -> None:
    # The literal-target and glob-prefix indexes must pick exactly the first match in file order:
    # explain() scans every rule, so it is the oracle. Bundles drawn from a fixed seed.
    import random

    rng = random.Random(20261204)
    globs = ["tool_1", "tool_1*", "tool_*", "tool_1?", "to*_1", "*_1", "*", "t[a-z]ol_*", "tool_\\*x",
             "mcp/*", "mcp/fs_*", "m?p/*", "x", ""]
    targets = ["tool_1", "tool_12", "tool_2", "to_1", "tool_*x", "mcp/fs_read", "mcp/x", "map/x", "x", "tol_1", "t"]
    for _ in range(200):
        lines = ["default_action: deny", "rules:"]
        for i in range(rng.randint(1, 8)):
            if rng.random() < 0.3:
                picks = rng.sample(globs[:-1], rng.randint(1, 3))
                when = "{targets: [" + ", ".join(f"'{g}'" for g in picks) + "]}"
            else:
                g = rng.choice(globs)
                when = f"{{target: '{g}'}}" if g else "{step_kind: tool_call}"
            lines.append(f"  - id: r{i}\n    when: {when}\n    then: {{decision: allow}}")
        bundle = _bundle("\n".join(lines) + "\n")
        for target in targets:
            step = _step(target)
            selected = [t.rule_id for t in bundle.explain(step) if t.selected]
            assert [bundle.evaluate(step).rule_id] == (selected or ["default"]), (lines, target)


def test_compiled_checks_agree_with_explain_on_random_rules() -> None:
    # evaluate() runs each rule's composed checks (`rest` for rules found through the target
    # index, `args_test` with only the constraints set); explain() runs `first_failure`, which
    # reads every condition field by field. Random rules mixing heads and predicates, fixed seed.
    import random

    rng = random.Random(20261205)
    heads = ["target: shell", "targets: [shell, transfer_funds]", "target: 'sh*'", "step_kind: tool_call",
             "agent_id: a1", "agent_ids: [a1, a2]"]
    predicates = ["{regex: '^ls'}", "{regex: ls}", "{equals: ls}", "{contains: s}", "{one_of: [ls, pwd]}",
                  "{equals: ls, regex: '^l'}", "{contains: l, one_of: [ls, al]}", "{type: number, gt: 1000}",
                  "{type: string, one_of: [ls]}", "{exists: true}", "{absent: true}", "{not: {regex: '^ls'}}",
                  "{lte: 1000, gt: 0}", "{regex: '^1'}"]
    argses: list[Any] = [{"command": "ls"}, {"command": "pwd"}, {"command": ["ls"]}, {"amount": 1000},
                         {"amount": 1000.5}, {"amount": "500", "command": "als"}, {}, None, {"command": None},
                         {"amount": 10**400}]
    steps = [_step(t, a, k, ag) for t in ("shell", "transfer_funds", "shx") for a in argses
             for k in ("tool_call", "llm_call") for ag in ("a1", "a3")]
    for _ in range(120):
        lines = ["default_action: deny", "rules:"]
        for i in range(rng.randint(1, 6)):
            when = list({h.split(":")[0].rstrip("s"): h for h in rng.sample(heads, rng.randint(0, 2))}.values())
            if rng.random() < 0.7:
                preds = {key: rng.choice(predicates) for key in rng.sample(["command", "amount"], rng.randint(1, 2))}
                when.append("arguments: {" + ", ".join(f"{k}: {v}" for k, v in preds.items()) + "}")
            lines.append(f"  - id: r{i}\n    when: {{{', '.join(when)}}}\n    then: {{decision: allow}}")
        bundle = _bundle("\n".join(lines) + "\n")
        for step in steps:
            selected = [t.rule_id for t in bundle.explain(step) if t.selected]
            assert [bundle.evaluate(step).rule_id] == (selected or ["default"]), (lines, step)
