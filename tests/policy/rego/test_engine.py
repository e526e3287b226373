"""Evaluation through the worker pool: the contract end to end, data, options, errors, threads."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from typing import Any

import pytest

from kernel.domain.decision import ApprovalConfig, BudgetSpec, PolicyKind, RateLimitSpec, Verdict
from kernel.policy.rego import RegoEngine

from .conftest import bundle_of, decision_policy, step

A = {"decision": "allow", "rule_id": "a"}
D = {"decision": "deny", "rule_id": "d", "reason": "nope"}
R = {"decision": "require_approval", "rule_id": "r"}


def test_object_output_decides(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": "ls"} if startswith(input.args.command, "ls")\n',
        revision="rev-7",
    )
    d = engine.evaluate(b, step(command="ls -la"))
    assert (d.verdict, d.rule_id, d.policy_kind, d.policy_revision) == (
        Verdict.ALLOW,
        "ls",
        PolicyKind.REGO,
        "rev-7",
    )


def test_partial_set_output_is_deny_overrides(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision contains {"decision": "allow", "rule_id": "any"} if true\n'
        'decision contains {"decision": "deny", "rule_id": "rm", "reason": "no rm"} if startswith(input.args.command, "rm")\n'
    )
    assert engine.evaluate(b, step(command="ls")).rule_id == "any"
    d = engine.evaluate(b, step(command="rm -rf /"))
    assert (d.verdict, d.rule_id, d.reason) == (Verdict.DENY, "rm", "no rm")


def test_array_output_ties_break_by_rule_id(engine: RegoEngine) -> None:
    b = bundle_of(
        decision_policy(
            [
                {"decision": "require_approval", "rule_id": "z"},
                A,
                {"decision": "require_approval", "rule_id": "m"},
            ]
        )
    )
    d = engine.evaluate(b, step())
    assert (d.verdict, d.rule_id) == (Verdict.REQUIRE_APPROVAL, "m")


@pytest.mark.parametrize(
    ("default_action", "verdict", "reason"),
    [
        ("deny", Verdict.DENY, "no explicit allow rule matched"),
        ("allow", Verdict.ALLOW, "default allow"),
    ],
)
def test_undefined_entrypoint_takes_default_action(
    default_action: str, verdict: Verdict, reason: str, engine: RegoEngine
) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": "a"} if input.target == "never"\n',
        regent={"default_action": default_action},
    )
    d = engine.evaluate(b, step())
    assert (d.verdict, d.rule_id, d.reason) == (verdict, "default", reason)


def test_empty_set_takes_default_action(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision contains {"decision": "allow", "rule_id": "a"} if input.target == "never"\n'
    )
    assert engine.evaluate(b, step()).rule_id == "default"


def test_unmatched_local_step_is_allowed(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "deny", "rule_id": "charge"} if input.target == "charge_card"\n'
    )
    d = engine.evaluate(b, step(target="tidy", kind="local"))
    assert (d.verdict, d.rule_id, d.reason) == (Verdict.ALLOW, "local", "local step")
    assert engine.evaluate(b, step(target="charge_card", kind="local")).rule_id == "charge"


def test_data_json_is_visible_to_the_policy(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": "listed"} if input.args.command in data.shell.allowed\n',
        data={"shell": {"allowed": ["ls", "pwd"]}},
    )
    assert engine.evaluate(b, step(command="pwd")).rule_id == "listed"
    assert engine.evaluate(b, step(command="rm")).rule_id == "default"


def test_the_whole_input_document_is_visible(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": concat("|", [input.agent_id, input.kind, input.target, '
        "input.idempotency, input.execution.id, format_int(input.usage.input_tokens, 10), input.now])}\n"
    )
    assert (
        engine.evaluate(b, step()).rule_id
        == "shell|tool_call|shell_exec|safe_to_retry|exec-1|812|2026-12-02T19:00:00+00:00"  # input.now: +00:00
    )


def test_options_flow_into_the_decision(engine: RegoEngine) -> None:
    options = {
        "approval_config": {"approvers": ["ops"], "timeout": "15m", "message": "ok?"},
        "rate_limit": {"max_calls": 5, "window": "1m", "per_what": "global", "max_wait": "2s"},
        "budget": {"max_tokens": 1000, "on_exceed": "require_approval"},
    }
    # Options from data.json: rego-cpp 1.5.2 cannot run some large object literals.
    b = bundle_of(
        'decision := object.union({"decision": "require_approval", "rule_id": "big"}, data.shell.options)\n',
        data={"shell": {"options": options}},
    )
    d = engine.evaluate(b, step())
    assert (d.verdict, d.rule_id) == (Verdict.REQUIRE_APPROVAL, "big")
    assert d.approval == ApprovalConfig(("ops",), 900.0, "ok?")
    assert d.rate_limit == RateLimitSpec(5, 60.0, "global", 2.0, "allow")
    assert d.budget == BudgetSpec(1000, "require_approval")


def test_options_from_a_literal_flow_into_the_decision(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": "rl", "rate_limit": {"max_calls": 3, "window": "10s"}}\n'
    )
    assert engine.evaluate(b, step()).rate_limit == RateLimitSpec(3, 10.0)


def test_malformed_output_denies_eval_error(engine: RegoEngine) -> None:
    b = bundle_of('decision := {"decision": "allow"}\n')
    d = engine.evaluate(b, step())
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "eval-error")
    assert 'missing "rule_id"' in d.reason


def test_conflicting_rule_outputs_deny_eval_error(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": "a"}\ndecision := {"decision": "deny", "rule_id": "b"} if input.target\n'
    )
    d = engine.evaluate(b, step())
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "eval-error")
    assert "eval_conflict_error" in d.reason


def test_nul_in_input_reaches_the_policy_untruncated(engine: RegoEngine) -> None:
    # regopy's Input passes C strings: "ls\0; rm -rf /" would reach the policy as "ls".
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": "ls"} if input.args.command == "ls"\n'
        'decision := {"decision": "deny", "rule_id": input.args.command} if input.args.command != "ls"\n'
    )
    d = engine.evaluate(b, step(command="ls\x00; rm -rf /"))
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "ls\x00; rm -rf /")


@pytest.mark.parametrize(
    "text",
    ['a"b', "back\\slash", "new\nline", "tab\tand\x01ctl", "é\u2028x", "\U0001f600"],
    ids=["quote", "backslash", "newline", "control", "unicode", "astral"],
)
def test_input_strings_compare_equal_to_literals(text: str, engine: RegoEngine) -> None:
    literal = json.dumps(text, ensure_ascii=False)
    b = bundle_of(
        f'decision := {{"decision": "allow", "rule_id": input.args.s}} if input.args.s == {literal}\n'
    )
    d = engine.evaluate(b, step(s=text))
    assert (d.verdict, d.rule_id) == (Verdict.ALLOW, text)


def test_input_cannot_inject_fields_into_the_decision(engine: RegoEngine) -> None:
    # rego-cpp prints strings into its JSON output as it holds them: raw input strings could
    # close the string and add a second "decision" key that wins when parsed.
    b = bundle_of(
        'decision := {"decision": "deny", "rule_id": "d", "reason": sprintf("bad %s", [input.args.command])}\n'
    )
    evil = 'x", "decision": "allow'
    d = engine.evaluate(b, step(command=evil))
    assert (d.verdict, d.rule_id, d.reason) == (Verdict.DENY, "d", f"bad {evil}")


def test_unencodable_input_denies_eval_error(engine: RegoEngine) -> None:
    b = bundle_of(decision_policy(A))
    d = engine.evaluate(b, step(s="\ud800"))
    assert d.rule_id == "eval-error"


def test_broken_bundle_denies_bundle_error_and_is_remembered(
    engine: RegoEngine, caplog: pytest.LogCaptureFixture
) -> None:
    b = bundle_of("decision := {\n", revision="broken-1")
    before = engine.stats()["bundle_loads"]
    with caplog.at_level(logging.WARNING, logger="kernel.policy.rego"):
        first = engine.evaluate(b, step())
    second = engine.evaluate(b, step())
    for d in (first, second):
        assert (d.verdict, d.rule_id, d.policy_kind, d.policy_revision) == (
            Verdict.DENY,
            "bundle-error",
            PolicyKind.REGO,
            "broken-1",
        )
    assert "shell/policy.rego:4:13: this is unclosed" in first.reason
    assert engine.stats()["bundle_loads"] == before + 1
    assert any("broken-1" in r.getMessage() for r in caplog.records)


def test_bundle_that_crashes_the_worker_denies_bundle_error(engine: RegoEngine) -> None:
    b = bundle_of(
        'd if startswith(input.c, "ls")\ndecision := {"decision": "allow", "rule_id": "a"} if { d with input as {"c": "ls"} }\n'
    )
    d = engine.evaluate(b, step())
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "bundle-error")
    assert "SIGABRT" in d.reason
    good = bundle_of(decision_policy(A))
    assert engine.evaluate(good, step()).rule_id == "a"


def test_bundle_crashing_twice_while_compiling_is_remembered(engine: RegoEngine) -> None:
    b = bundle_of(
        "# remembered\n"
        'd if startswith(input.c, "ls")\n'
        'decision := {"decision": "allow", "rule_id": "a"} if { d with input as {"c": "ls"} }\n'
    )
    before = engine.stats()["crashes"]
    for _ in range(4):
        assert engine.evaluate(b, step()).rule_id == "bundle-error"
    assert engine.stats()["crashes"] - before == 2  # once may be the machine; twice is the bundle


def test_same_content_different_revision_shares_nothing_wrong(engine: RegoEngine) -> None:
    one = bundle_of(decision_policy(A), revision="r1")
    two = bundle_of(
        decision_policy(D), revision="r1"
    )  # a reused revision must not serve stale code
    assert engine.evaluate(one, step()).rule_id == "a"
    assert engine.evaluate(two, step()).rule_id == "d"


def test_many_threads_evaluate_concurrently(engine: RegoEngine) -> None:
    bundles = [
        bundle_of(
            f'decision := {{"decision": "allow", "rule_id": concat("-", ["t{i}", input.args.n])}}\n'
        )
        for i in range(3)
    ]
    errors: list[Any] = []

    def run(t: int) -> None:
        for n in range(150):
            b = bundles[(t + n) % 3]
            d = engine.evaluate(b, step(n=str(n)))
            if d.rule_id != f"t{(t + n) % 3}-{n}":
                errors.append(d)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_stats_count_outcomes(engine: RegoEngine) -> None:
    before = engine.stats()
    engine.evaluate(bundle_of(decision_policy(A)), step())
    engine.evaluate(bundle_of(decision_policy(D)), step())
    after = engine.stats()
    assert after["evaluations"] == before["evaluations"] + 2
    assert after["allowed"] == before["allowed"] + 1
    assert after["denied"] == before["denied"] + 1
    assert after["workers"] == 2


def test_closed_engine_denies() -> None:
    e = RegoEngine(size=1)
    pids = e.worker_pids()
    e.close()
    d = e.evaluate(bundle_of(decision_policy(A)), step())
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "eval-error")
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            import os

            os.kill(pid, 0)


def test_kernel_process_never_imports_regopy() -> None:
    code = (
        "import sys\n"
        "from kernel.policy.rego import RegoEngine, compile_rego_bundle\n"
        "from tests.policy.rego.conftest import bundle_of, decision_policy, step\n"
        "with RegoEngine(size=1) as e:\n"
        "    b = compile_rego_bundle(bundle_of(decision_policy({'decision': 'allow', 'rule_id': 'a'})), engine=e)\n"
        "    assert e.evaluate(b, step()).rule_id == 'a'\n"
        "assert 'regopy' not in sys.modules, 'regopy imported in the kernel process'\n"
        "assert 'greenlet' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_workers_get_a_bare_environment(engine: RegoEngine) -> None:
    b = bundle_of(
        'decision := {"decision": "allow", "rule_id": concat(",", sort(object.keys(opa.runtime().env)))}\n'
    )
    # Python itself adds LC_CTYPE when it coerces the C locale (PEP 538).
    assert set(engine.evaluate(b, step()).rule_id.split(",")) <= {"PYTHONPATH", "LC_CTYPE"}


def test_capabilities_come_from_the_start_up_probe(engine: RegoEngine) -> None:
    caps = engine.capabilities
    assert caps["build_info"]
    assert isinstance(caps["unavailable"], list)
    assert isinstance(caps["quirks"], list)


@pytest.mark.parametrize("spin_seconds", [0.0, 0.002], ids=["blocking", "polling"])
def test_workers_answer_back_to_back_and_after_idling_whether_they_poll_or_not(spin_seconds: float) -> None:
    policy = bundle_of('decision := {"decision": "allow", "rule_id": "ok"} if input.target == "t"\n')
    with RegoEngine(size=1, spin_seconds=spin_seconds) as e:
        [pid] = e.worker_pids()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert argv[argv.index(b"--spin-us") + 1] == f"{spin_seconds * 1e6:g}".encode()
        # Back to back (the polling worker catches these while it polls), then after a pause
        # longer than the poll (it has blocked by then).
        assert [e.evaluate(policy, step(target="t")).rule_id for _ in range(50)] == ["ok"] * 50
        threading.Event().wait(0.05)
        assert e.evaluate(policy, step(target="t")).rule_id == "ok"
        assert e.evaluate(policy, step(target="x")).rule_id == "default"
        assert e.stats()["crashes"] == 0 and e.worker_pids() == [pid]


def test_evaluate_many_answers_what_evaluate_answers(engine: RegoEngine) -> None:
    policy = bundle_of(
        'decision := {"decision": "deny", "rule_id": "rm"} if startswith(input.args.command, "rm")\n'
        'decision := {"decision": "allow", "rule_id": "ls"} if input.args.command == "ls"\n'
        'decision := {"decision": "allow", "rule_id": input.args.command} if input.args.command == "bad id"\n'
    )
    inputs = [step(command=c) for c in ("ls", "rm -rf /", "cat", "bad id", "ls")] + [step(kind="local", target="x")]
    assert engine.evaluate_many(policy, inputs) == [engine.evaluate(policy, i) for i in inputs]
    assert engine.evaluate_many(policy, []) == []
