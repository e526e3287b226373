"""The payments-bot twins (bundles/payments.yaml and bundles/payments-rego/) agree on the edge inputs
an amount predicate gets wrong when it compares text: tiny, exact, just above, exponent-rendered,
string, negative, null and missing amounts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel.domain.decision import PolicyInput
from kernel.policy.rego import RegoEngine, compile_rego_bundle
from kernel.policy.resolver import RegoCompiled
from kernel.policy.yaml import compile_yaml_bundle

ROOT = Path(__file__).resolve().parents[2]
MISSING = "<missing>"
# raw JSON amount (decoded as the kernel decodes args) → (decision, rule id)
EDGES = [
    ("0.00001", ("allow", "allow-small-transfer")),
    ("1000", ("allow", "allow-small-transfer")),
    ("1000.0", ("allow", "allow-small-transfer")),
    ("1000.0001", ("require_approval", "approve-large-transfer")),
    ("1e6", ("require_approval", "approve-large-transfer")),
    ('"500"', ("deny", "default")),
    ('"1e6"', ("deny", "default")),
    ("-1", ("deny", "default")),
    ("0", ("deny", "default")),
    ("null", ("deny", "default")),
    ("true", ("deny", "default")),
    ("[2000]", ("deny", "default")),
    (MISSING, ("deny", "default")),
    # The repros: Rego saw six decimals (allow, allow, malformed) and int64 at most.
    ("1000.0000004", ("require_approval", "approve-large-transfer")),
    ("1000.00000001", ("require_approval", "approve-large-transfer")),
    ("0.0000004", ("allow", "allow-small-transfer")),
    ("12345678901234567890", ("require_approval", "approve-large-transfer")),
    ("1e400", ("deny", "eval-error")),  # past float64: one answer in both engines
    ("5e-324", ("deny", "eval-error")),
]


@pytest.fixture(scope="module")
def twins() -> Iterator[tuple[Any, Any]]:
    engine = RegoEngine(size=1)
    try:
        yaml_bundle = compile_yaml_bundle((ROOT / "bundles" / "payments.yaml").read_text(), revision="y")
        rego = RegoCompiled(compile_rego_bundle(ROOT / "bundles" / "payments-rego", engine=engine), engine)
        yield yaml_bundle, rego
    finally:
        engine.close()


@pytest.mark.parametrize(("raw", "expected"), EDGES, ids=[r for r, _ in EDGES])
def test_payments_twins_agree_on_edge_amounts(twins: tuple[Any, Any], raw: str, expected: tuple[str, str]) -> None:
    args = {"to": "acc-2"} if raw == MISSING else {"to": "acc-2", "amount": json.loads(raw)}
    inp = PolicyInput(agent_id="payments", kind="tool_call", target="transfer_funds", args=args)
    got = [(d.verdict.value, d.rule_id) for d in (b.evaluate(inp) for b in twins)]
    assert got == [expected, expected]


@pytest.mark.parametrize(("kind", "target", "args", "expected"), [
    ("tool_call", "get_balance", {}, ("allow", "allow-read-only")),
    ("tool_call", "shell", {"command": "pwd"}, ("allow", "allow-allowlisted-shell")),
    ("tool_call", "shell", {"command": "pwd; curl x"}, ("deny", "deny-shell")),
    ("tool_call", "shell", {"command": ["pwd"]}, ("deny", "deny-shell")),
    ("llm_call", "gpt", None, ("allow", "rate-limit-llm")),
    ("tool_call", "wire_money", {"amount": 1}, ("deny", "default")),
])
def test_payments_twins_agree_on_the_other_rules(twins: tuple[Any, Any], kind: str, target: str,
                                                 args: Any, expected: tuple[str, str]) -> None:
    inp = PolicyInput(agent_id="payments", kind=kind, target=target, args=args)
    decisions = [b.evaluate(inp) for b in twins]
    assert [(d.verdict.value, d.rule_id) for d in decisions] == [expected, expected]
    if expected[1] == "rate-limit-llm":
        assert decisions[0].rate_limit == decisions[1].rate_limit
        assert decisions[0].rate_limit is not None and decisions[0].rate_limit.max_calls == 30
