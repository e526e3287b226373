"""The judge's parts without a kernel: the domain resolution, the template subset, provider files,
the circuit breaker, and judge rules in both bundle languages and in policy test cases."""

from __future__ import annotations

import asyncio
import json

import pytest

from kernel.domain import Decision, JudgeAnswer, JudgeSpec, PolicyInput, Verdict, resolve_judge
from kernel.errors import ConfigError, ValidationError
from kernel.judge.http_judge import Breaker
from kernel.judge.provider import parse_provider
from kernel.judge.template import Template, TemplateError
from kernel.policy.cases import parse_cases, run_cases
from kernel.policy.rego.decision import decision_from_output
from kernel.policy.yaml import compile_yaml_bundle
from tests.judge.conftest import PROVIDER, JudgeServer, make_judge

JUDGE_RULE = Decision(Verdict.REQUIRE_APPROVAL, "ask", judge=JudgeSpec())


@pytest.mark.parametrize(
    ("answer", "verdict", "reason"),
    [
        (JudgeAnswer.not_configured(), Verdict.DENY, "judge not configured"),
        (JudgeAnswer.unavailable("timeout after 5s"), Verdict.REQUIRE_APPROVAL, "judge unavailable: timeout after 5s"),
        (JudgeAnswer(probabilities={"deny": 0.91, "allow": 0.09}), Verdict.DENY, "judge: deny 0.91"),
        (JudgeAnswer(probabilities={"allow": 0.4}), Verdict.REQUIRE_APPROVAL, "judge: allow 0.40 below threshold 0.60"),
        (JudgeAnswer(probabilities={"maybe": 1.0}), Verdict.REQUIRE_APPROVAL, "judge: deny 0.00 below threshold 0.60"),
    ],
    ids=["not-configured", "unavailable", "deny", "below-threshold", "unknown-outcomes-only"],
)
def test_resolve_judge_follows_the_upstream_rules(answer: JudgeAnswer, verdict: Verdict, reason: str) -> None:
    d = resolve_judge(JUDGE_RULE, answer)
    assert (d.verdict, d.reason, d.rule_id, d.judge) == (verdict, reason, "ask", None)
    assert d.judge_record is not None and d.judge_record["outcome"] == verdict.value


def test_template_renders_fields_json_and_conditions() -> None:
    t = Template('{"a": {{json .X}}, "b": "{{.Y.Z}}"{{if .W}}, "w": 1{{else}}, "w": 0{{end}}}')
    assert json.loads(t.render({"X": [1, "é"], "Y": {"Z": "z"}, "W": ""}, 1000)) == {"a": [1, "é"], "b": "z", "w": 0}
    assert json.loads(t.render({"X": None, "Y": {}, "W": "yes"}, 1000))["w"] == 1


def test_template_trim_markers_remove_whitespace() -> None:
    assert Template("a  {{- .X -}}  b").render({"X": "x"}, 100) == "axb"


@pytest.mark.parametrize(
    "source",
    ['{{template "x"}}', "{{.X | printf}}", "{{range .X}}{{end}}", "{{if .X}}", "{{end}}", "{{call .F}}",
     "{{ }}", "{{.X}", "{{json .X .Y}}"],
    ids=["template", "pipe", "range", "unclosed-if", "stray-end", "call", "empty", "unbalanced", "json-two-args"],
)
def test_template_outside_the_subset_is_refused_at_load(source: str) -> None:
    with pytest.raises(TemplateError):
        Template(source)


def test_template_output_is_bounded() -> None:
    with pytest.raises(TemplateError, match="too large"):
        Template("{{json .X}}").render({"X": "x" * 2000}, 1000)


def test_provider_file_in_the_upstream_format_loads() -> None:
    p = parse_provider(PROVIDER.read_text(), {"JUDGE_URL": "http://127.0.0.1:1", "JUDGE_TEST_KEY": "k"})
    assert p.url == "http://127.0.0.1:1/judge" and p.headers == {"Authorization": "Bearer k"}
    assert p.probabilities == ("answers", "decision", "probabilities")
    assert "Bearer k" not in repr(p)  # header values are secrets


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("url: http://x\nbody: '{}'\n", "probabilities is required"),
        ("url: http://x\nbody: '{}'\nprobabilities: p\nmodel: m\n", "unknown key 'model'"),
        ("url: ftp://x\nbody: '{}'\nprobabilities: p\n", "http:// or https://"),
        ("url: http://x\nbody: '{{range .X}}'\nprobabilities: p\n", "body: unsupported"),
        ("url: http://x\nbody: '{}'\nprobabilities: p\ntimeout: 5\n", "timeout"),
        ("url: [\n", "not valid YAML"),
    ],
    ids=["missing-key", "unknown-key", "scheme", "template", "timeout-not-duration", "yaml"],
)
def test_bad_provider_file_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_provider(text, {}, source="judge.yaml")


def test_breaker_opens_after_failures_and_lets_one_trial_through() -> None:
    now = [0.0]
    b = Breaker(failures=2, reset_seconds=10, clock=lambda: now[0])
    b.failure()
    assert b.allow()
    b.failure()
    assert not b.allow() and b.open
    now[0] = 10.0
    assert b.allow() and not b.allow()  # one trial call, the rest still fail fast
    b.failure()  # the trial failed: open again for another period
    now[0] = 15.0
    assert not b.allow()
    now[0] = 20.0
    assert b.allow()
    b.success()
    assert b.allow() and not b.open


def test_open_circuit_answers_without_calling(judge_server: JudgeServer) -> None:
    judge_server.set(mode="error")
    judge = make_judge(judge_server.url, breaker_failures=2, breaker_reset_seconds=60)
    inp = PolicyInput(agent_id="a", kind="tool_call", target="t", args={})

    async def run() -> list[JudgeAnswer]:
        try:
            return [await judge.ask(JudgeSpec(), inp) for _ in range(4)]
        finally:
            await judge.aclose()

    answers = asyncio.run(run())
    assert [a.error for a in answers] == ["judge returned 500"] * 2 + ["circuit open after repeated failures"] * 2
    assert len(judge_server.received()) == 2


def test_concurrency_limit_queues_calls_within_the_timeout(judge_server: JudgeServer) -> None:
    judge_server.set(delay=1.0)
    judge = make_judge(judge_server.url, concurrency=1, timeout_seconds=1.7)
    inp = PolicyInput(agent_id="a", kind="tool_call", target="t", args={})

    async def run() -> list[JudgeAnswer]:
        try:
            return list(await asyncio.gather(*(judge.ask(JudgeSpec(), inp) for _ in range(2))))
        finally:
            await judge.aclose()

    first, second = asyncio.run(run())
    # One call at a time: the second waits for the first, then runs past its own timeout.
    assert first.probabilities == {"allow": 0.9}
    assert second.error == "timeout after 1.7s"


def test_yaml_judge_rule_defaults() -> None:
    b = compile_yaml_bundle("rules:\n  - id: j\n    then: {decision: judge}\n", revision="r")
    d = b.evaluate(PolicyInput(agent_id="a", kind="tool_call", target="t", args={}))
    assert d.judge == JudgeSpec(instructions="", threshold=0.6, fallback="require_approval")
    assert (d.rule_id, d.verdict) == ("j", Verdict.REQUIRE_APPROVAL)


def test_rego_judge_member_is_asked_only_when_nothing_stricter_decides() -> None:
    def decide(value: object) -> Decision:
        return decision_from_output(value, kind="tool_call", default_action=Verdict.DENY, revision="r")

    judge = {"decision": "judge", "rule_id": "j", "judge": {"threshold": 0.8, "fallback": "deny"}}
    alone = decide([judge, {"decision": "allow", "rule_id": "a"}])
    assert alone.judge == JudgeSpec(threshold=0.8, fallback="deny") and alone.rule_id == "j"
    assert decide([judge, {"decision": "require_approval", "rule_id": "r"}]).rule_id == "r"
    assert decide([judge, {"decision": "deny", "rule_id": "d"}]).judge is None


def test_policy_cases_mock_the_judge() -> None:
    b = compile_yaml_bundle("rules:\n  - id: j\n    then: {decision: judge, judge: {fallback: allow}}\n", revision="r")
    cases = parse_cases(
        "cases:\n"
        "  - {target: t, expect: deny, context: {judge: {allow: 0.2, deny: 0.7}}}\n"
        "  - {target: t, expect: allow, context: {judge: {allow: 0.5}}}\n"  # below threshold: the fallback
        "  - {target: t, expect: deny, expect_reason: judge not configured}\n"
    )
    report = run_cases(b, cases)
    assert [r.passed for r in report.results] == [True, True, True], [r.failure for r in report.results]
    assert report.results[0].reason == "judge: deny 0.70"


@pytest.mark.parametrize(
    "mock", ["{allow: 2}", "{maybe: 0.5}", "[0.5]", "{allow: yes}"], ids=["range", "outcome", "list", "bool"]
)
def test_bad_judge_mock_in_a_case_is_a_load_error(mock: str) -> None:
    with pytest.raises(ValidationError, match=r"case 1: context\.judge"):
        parse_cases(f"cases:\n  - {{target: t, context: {{judge: {mock}}}}}\n")


def test_template_json_keeps_numbers_exact_and_refuses_non_finite_ones() -> None:
    t = Template("{{json .X}}")
    args = {"amount": 1000.0000004, "big": 12345678901234567890, "tiny": 4e-7}
    assert json.loads(t.render({"X": args}, 1000)) == args
    with pytest.raises(TemplateError, match="not finite"):  # "Infinity" would not be JSON
        t.render({"X": {"amount": float("inf")}}, 1000)
