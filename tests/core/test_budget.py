"""Token usage and budgets (rebuno-v0 §7.6, §2.1 step 14.2): usage parsed from recorded llm_call
results, the execution meter, and the budget rule that denies (or asks) once spend reaches it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernel.core import steps
from kernel.core.kernel import Kernel
from kernel.core.usage import parse_usage
from kernel.domain import (
    BudgetSpec,
    Decision,
    ExecutionStatus,
    Lease,
    PolicyInput,
    StepStatus,
    Verdict,
)
from kernel.identity import args_hash, canonical_json
from tests.conftest import Running


def req(target: str = "openai.chat", args: Any = None, kind: str = "llm_call") -> steps.StepRequest:
    text = canonical_json(json.dumps(args)) if args is not None else "null"
    return steps.StepRequest(kind=kind, target=target, args=json.loads(text), args_text=text,
                             args_hash=args_hash(text))


class FixedPolicy:
    def __init__(self, decision: Decision):
        self.decision = decision
        self.inputs: list[PolicyInput] = []

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: PolicyInput, tx: Any = None, bundle_id: Any = None) -> Decision:
        self.inputs.append(inp)
        return self.decision


def sse(*events: tuple[str | None, Any]) -> str:
    lines = []
    for name, data in events:
        if name:
            lines.append(f"event: {name}")
        lines.append(f"data: {data if isinstance(data, str) else json.dumps(data)}")
        lines.append("")
    return "\n".join(lines)


OPENAI_CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
              "prompt_tokens_details": {"cached_tokens": 0}},
}
OPENAI_STREAM = sse(
    (None, {"id": "c1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}], "usage": None}),
    (None, {"id": "c1", "object": "chat.completion.chunk", "choices": [{"delta": {}, "finish_reason": "stop"}],
            "usage": None}),
    (None, {"id": "c1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}}),
    (None, "[DONE]"),
)
ANTHROPIC_MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4",
    "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 25, "output_tokens": 11, "cache_read_input_tokens": 900,
              "cache_creation_input_tokens": 0},
}
ANTHROPIC_STREAM = sse(
    ("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "usage": {"input_tokens": 472, "cache_read_input_tokens": 2000, "output_tokens": 2}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("ping", {"type": "ping"}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 89}}),
    ("message_stop", {"type": "message_stop"}),
)


@pytest.mark.parametrize(
    ("result", "usage"),
    [
        (OPENAI_CHAT, (12, 7)),
        ({"status": 200, "body": OPENAI_STREAM}, (31, 9)),
        (ANTHROPIC_MESSAGE, (25, 11)),
        ({"body": ANTHROPIC_STREAM}, (472, 89)),
        ({"status": 200, "headers": {"x": "1"}, "body": json.dumps(OPENAI_CHAT)}, (12, 7)),
        ({"body": "data: not json\ndata: [DONE]\n" + OPENAI_STREAM}, (31, 9)),
        ({"usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 3, "totalTokenCount": 11}}, (8, 3)),
        ({"model": "llama3", "prompt_eval_count": 26, "eval_count": 290}, (26, 290)),
        ({"answer": "no usage here", "total_tokens": 50}, None),
        ({"body": "plain text, neither JSON nor events"}, None),
        ({"usage": {"input_tokens": True, "output_tokens": "12"}}, None),
    ],
    ids=[
        "openai-chat", "openai-sse-final-usage-chunk", "anthropic-message", "anthropic-sse",
        "body-wrapped-json", "sse-junk-skipped", "gemini", "ollama", "no-usage", "body-not-parseable",
        "non-numeric-ignored",
    ],
)
def test_parse_usage_reads_the_provider_formats(result: Any, usage: tuple[int, int] | None) -> None:
    assert parse_usage(result) == usage


def _llm_step(k: Kernel, eid: str, did: str, att: int, result: Any, n: int = 0) -> steps.StepAnswer:
    a = steps.submit_step(k, Lease("shell", eid, did, att), req(args={"n": n}))
    if a.decision == "proceed":
        steps.record_outcome(k, Lease("shell", eid, did, att), a.step_id, result=result)
    return a


def test_step_succeeded_carries_usage_and_the_step_stores_it(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    a = _llm_step(kernel, eid, did, att, {"body": ANTHROPIC_STREAM})
    with kernel.store.read() as tx:
        last = tx.list_events(eid, 0, 100)[-1]
        s = tx.get_step(eid, a.step_id)
    assert last.type == "step.succeeded"
    assert last.payload["usage"] == {"input_tokens": 472, "output_tokens": 89}
    assert (s.usage_input, s.usage_output) == (472, 89)


@pytest.mark.parametrize("kind", ["tool_call", "local"])
def test_usage_is_never_parsed_for_tool_or_local_steps(kernel: Kernel, running: Running, kind: str) -> None:
    eid, did, att = running.start()
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req(kind=kind))
    steps.record_outcome(kernel, Lease("shell", eid, did, att), a.step_id, result=OPENAI_CHAT)
    with kernel.store.read() as tx:
        assert "usage" not in tx.list_events(eid, 0, 100)[-1].payload
        assert tx.token_usage(eid) == (0, 0)


def test_usage_is_not_parsed_on_fail_or_on_a_duplicate_complete(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    failed = steps.submit_step(kernel, Lease("shell", eid, did, att), req(args={"n": 1}))
    steps.record_outcome(kernel, Lease("shell", eid, did, att), failed.step_id, error=OPENAI_CHAT, failed=True)
    done = _llm_step(kernel, eid, did, att, OPENAI_CHAT, n=2)
    again = steps.record_outcome(kernel, Lease("shell", eid, did, att), done.step_id, result=ANTHROPIC_MESSAGE)
    assert again.decision == "replay"
    with kernel.store.read() as tx:
        assert tx.token_usage(eid) == (12, 7)


def test_the_execution_meter_sums_usage_and_policy_sees_it(kernel: Kernel, running: Running) -> None:
    policy = FixedPolicy(Decision(Verdict.ALLOW, "open"))
    kernel.policy = policy
    eid, did, att = running.start()
    _llm_step(kernel, eid, did, att, OPENAI_CHAT, n=1)
    _llm_step(kernel, eid, did, att, ANTHROPIC_MESSAGE, n=2)
    with kernel.store.read() as tx:
        assert tx.token_usage(eid) == (12 + 25, 7 + 11)
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(args={"n": 3}))
    assert policy.inputs[-1].usage == {"input_tokens": 37, "output_tokens": 18}


def budget(max_tokens: int, on_exceed: str = "deny", verdict: Verdict = Verdict.ALLOW) -> FixedPolicy:
    return FixedPolicy(Decision(verdict, "llm-budget", budget=BudgetSpec(max_tokens=max_tokens, on_exceed=on_exceed)))


def test_the_call_that_crosses_the_budget_runs_and_the_next_is_denied(kernel: Kernel, running: Running) -> None:
    kernel.policy = budget(50)  # each OpenAI call spends 12 + 7 = 19
    eid, did, att = running.start()
    answers = [_llm_step(kernel, eid, did, att, OPENAI_CHAT, n=i) for i in range(4)]
    # spend before each call: 0, 19, 38 (< 50: this one crosses to 57), 57 → denied
    assert [a.decision for a in answers] == ["proceed", "proceed", "proceed", "denied"]
    denied = answers[-1]
    assert (denied.reason, denied.rule_id) == ("execution_token_budget_exceeded", "llm-budget")
    with kernel.store.read() as tx:
        s = tx.get_step(eid, denied.step_id)
        last = tx.list_events(eid, 0, 100)[-1]
    assert s.status == StepStatus.DENIED
    assert s.error == {"reason": "execution_token_budget_exceeded", "rule_id": "llm-budget"}
    assert last.type == "step.denied" and last.payload["error"]["reason"] == "execution_token_budget_exceeded"


def test_spend_equal_to_the_budget_is_already_over(kernel: Kernel, running: Running) -> None:
    kernel.policy = budget(19)
    eid, did, att = running.start()
    answers = [_llm_step(kernel, eid, did, att, OPENAI_CHAT, n=i) for i in range(2)]
    assert [a.decision for a in answers] == ["proceed", "denied"]


def test_budget_with_require_approval_blocks_for_a_human(kernel: Kernel, running: Running) -> None:
    kernel.policy = budget(10, on_exceed="require_approval")
    eid, did, att = running.start()
    _llm_step(kernel, eid, did, att, OPENAI_CHAT, n=0)
    blocked = _llm_step(kernel, eid, did, att, OPENAI_CHAT, n=1)
    assert blocked.decision == "blocked" and blocked.approval_id and blocked.step_id
    with kernel.store.read() as tx:
        assert tx.get_execution(eid).status == ExecutionStatus.BLOCKED
        assert tx.get_step(eid, blocked.step_id).status == StepStatus.AWAITING_APPROVAL
        awaiting = [e for e in tx.list_events(eid, 0, 100) if e.type == "step.awaiting_approval"]
    assert awaiting[-1].payload["rule_id"] == "llm-budget"
    assert awaiting[-1].payload["reason"] == "execution_token_budget_exceeded"


@pytest.mark.parametrize(
    ("verdict", "decision", "reason"),
    [(Verdict.DENY, "denied", "policy_denied"), (Verdict.REQUIRE_APPROVAL, "blocked", None)],
    ids=["deny-stays-deny", "approval-stays-approval"],
)
def test_budget_only_applies_to_allow_decisions(
    kernel: Kernel, running: Running, verdict: Verdict, decision: str, reason: str | None
) -> None:
    eid, did, att = running.start()
    _llm_step(kernel, eid, did, att, OPENAI_CHAT, n=0)
    kernel.policy = budget(1, verdict=verdict)
    a = steps.submit_step(kernel, Lease("shell", eid, did, att), req(args={"n": 1}))
    assert (a.decision, a.reason) == (decision, reason)


def test_zero_budget_never_limits(kernel: Kernel, running: Running) -> None:
    kernel.policy = budget(0)
    eid, did, att = running.start()
    answers = [_llm_step(kernel, eid, did, att, OPENAI_CHAT, n=i) for i in range(3)]
    assert [a.decision for a in answers] == ["proceed"] * 3


@pytest.mark.parametrize(
    "result",
    [
        {"usage": {"prompt_tokens": float("inf"), "completion_tokens": 4}},  # what `1e400` decodes to
        {"body": '{"usage": {"prompt_tokens": NaN, "completion_tokens": 4}}'},
        {"body": 'data: {"usage": {"prompt_tokens": Infinity, "completion_tokens": 4}}\n'},
    ],
    ids=["overflowing-number", "nan-in-body", "infinity-in-stream"],
)
def test_non_finite_token_counts_are_ignored(result: Any) -> None:
    assert parse_usage(result) == (0, 4)


def test_an_absurd_token_count_is_capped_so_the_meter_cannot_overflow(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    huge = {"usage": {"prompt_tokens": 10**30, "completion_tokens": 10**30}}
    for n in range(2):
        _llm_step(kernel, eid, did, att, huge, n=n)
    with kernel.store.read() as tx:
        spent_in, spent_out = tx.token_usage(eid)
    assert 0 < spent_in < 2**63 and 0 < spent_out < 2**63


def test_a_complete_whose_stream_says_infinity_is_still_recorded(kernel: Kernel, running: Running) -> None:
    eid, did, att = running.start()
    body = 'data: {"usage": {"prompt_tokens": 1e400, "completion_tokens": 4}}\n\ndata: [DONE]\n'
    a = _llm_step(kernel, eid, did, att, {"body": body})
    with kernel.store.read() as tx:
        s = tx.get_step(eid, a.step_id)
    assert s.status == StepStatus.SUCCEEDED and (s.usage_input, s.usage_output) == (0, 4)


def test_a_session_budget_counts_the_tokens_of_every_execution_of_the_session(kernel: Kernel, running: Running) -> None:
    from kernel.core import executions
    from kernel.core.dispatch import claim_due
    from kernel.core.executions import Lineage

    spec = BudgetSpec(max_tokens=30, scope="session")
    kernel.policy = FixedPolicy(Decision(Verdict.ALLOW, "session-budget", budget=spec))
    first, second = (executions.create_execution(kernel, "shell", i, lineage=Lineage(session="chat"))[0].id
                     for i in range(2))
    other = executions.create_execution(kernel, "shell", 0, lineage=Lineage(session="elsewhere"))[0].id
    leases = {c.execution_id: c for c in claim_due(kernel, 10)}
    c1 = leases[first]
    # The first turn spends 19 + 19 = 38: over the session's 30 once its second call has run.
    assert [_llm_step(kernel, first, c1.dispatch_id, c1.attempt, OPENAI_CHAT, n=i).decision for i in range(2)] == [
        "proceed", "proceed"]
    executions.finish_execution(kernel, Lease("shell", first, c1.dispatch_id, c1.attempt), output="turn 1")
    c2 = next(c for c in claim_due(kernel, 10) if c.execution_id == second)
    # The second turn has spent nothing of its own, but the session has: its first call is denied.
    denied = _llm_step(kernel, second, c2.dispatch_id, c2.attempt, OPENAI_CHAT)
    assert (denied.decision, denied.reason, denied.rule_id) == (
        "denied", "execution_token_budget_exceeded", "session-budget")
    # Another session's execution spends from its own session's budget.
    co = leases[other]
    assert _llm_step(kernel, other, co.dispatch_id, co.attempt, OPENAI_CHAT).decision == "proceed"


def test_a_shadow_with_a_session_budget_counts_the_session_not_the_execution(kernel: Kernel, running: Running) -> None:
    """The shadow applies its own budget as the step path would: a session-scoped one against the
    session's executions' tokens (read when judged), not the observed execution's alone."""
    from datetime import UTC, datetime

    from kernel.core import executions
    from kernel.core.dispatch import claim_due
    from kernel.core.executions import Lineage
    from kernel.core.ports import ShadowObservation
    from kernel.core.shadow import judge
    from kernel.domain.decision import ShadowRef

    kernel.policy = FixedPolicy(Decision(Verdict.ALLOW, "active"))
    first = executions.create_execution(kernel, "shell", 0, lineage=Lineage(session="chat"))[0].id
    c = next(c for c in claim_due(kernel, 10) if c.execution_id == first)
    for i in range(2):  # 38 tokens spent in the session "chat"
        assert _llm_step(kernel, first, c.dispatch_id, c.attempt, OPENAI_CHAT, n=i).decision == "proceed"

    class Candidate:
        def __init__(self, scope: str):
            self.scope = scope

        def evaluate(self, ref: ShadowRef, inp: PolicyInput) -> Decision:
            return Decision(Verdict.ALLOW, "candidate", budget=BudgetSpec(max_tokens=30, scope=self.scope))

    ref = ShadowRef(1, "shell", "yaml", "candidate")

    def judged(scope: str, session: str | None) -> tuple[str, str]:
        # A later turn of the session that has spent nothing of its own yet.
        inp = PolicyInput(agent_id="shell", kind="llm_call", target="openai.chat", args=None, session=session,
                          usage={"input_tokens": 0, "output_tokens": 0})
        obs = ShadowObservation("e2", "s2", datetime.now(UTC), inp, Decision(Verdict.ALLOW, "active"), "allow")
        j = judge(kernel, Candidate(scope), ref, obs)
        assert j.decision is not None
        return j.outcome, j.decision.reason

    assert judged("session", "chat") == ("deny", "execution_token_budget_exceeded")
    assert judged("session", "elsewhere") == ("allow", "")  # another session has its own tokens
    assert judged("execution", "chat") == ("allow", "")  # an execution budget counts this execution only


def test_a_yaml_rule_names_a_session_budget_and_a_session_rate_limit() -> None:
    from kernel.domain import RateLimitSpec
    from kernel.policy.yaml import compile_yaml_bundle

    bundle = compile_yaml_bundle(
        "rules:\n  - id: r\n    then: {decision: allow, budget: {max_tokens: 50, scope: session},"
        " rate_limit: {max_calls: 3, window: 1m, per_what: session}}\n", revision="r1")
    d = bundle.evaluate(PolicyInput(agent_id="shell", kind="llm_call", target="m", args=None, session="chat"))
    assert d.budget == BudgetSpec(50, "deny", "session")
    assert d.rate_limit == RateLimitSpec(3, 60.0, "session", 0.0, "allow")
