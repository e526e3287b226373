"""Shadow disagreements and faults reach the decision log (after the shadow runner's write
commits), masked like every entry; agreements are only counted."""

from __future__ import annotations

import json
from pathlib import Path

from kernel.core import shadow
from kernel.core.kernel import Kernel
from kernel.core.policies import Actor, store_policy
from kernel.core.steps import StepRequest, submit_step
from kernel.decisionlog import DecisionLog, FileSink, parse_mask_rules
from kernel.domain import Lease
from kernel.identity import args_hash, canonical_json
from kernel.policy.resolver import BundleResolver, LazyRegoEngine
from kernel.policy.shadow_eval import ShadowBundles
from kernel.shadow_runner import ShadowRunner
from tests.conftest import Running

ACTIVE = """
default_action: deny
rules:
  - id: allow-transfers
    when: {target: transfer_funds}
    then: {decision: allow}
"""
CANDIDATE = """
default_action: deny
rules:
  - id: deny-large
    when: {target: transfer_funds, arguments: {amount: {type: number, gt: 1000}}}
    then: {decision: deny, reason: over the limit}
  - id: allow-transfers
    when: {target: transfer_funds}
    then: {decision: allow}
"""


def _req(amount: int) -> StepRequest:
    text = canonical_json(json.dumps({"amount": amount, "password": "hunter2"}))
    return StepRequest("tool_call", "transfer_funds", json.loads(text), text, args_hash(text))


def test_disagreements_are_logged_and_agreements_are_not(kernel: Kernel, running: Running, tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    dl = DecisionLog([FileSink(str(path))], masks=parse_mask_rules("/args/password"))
    kernel.decision_log = dl
    kernel.policy = BundleResolver(kernel.store)
    rego = LazyRegoEngine()
    runner = ShadowRunner(kernel, ShadowBundles(kernel.store, rego), flush_interval=0.05)
    runner.start()
    kernel.shadow = runner
    try:
        store_policy(kernel, running.agent_id, "yaml", ACTIVE)
        shadow.store_shadow(kernel, running.agent_id, "yaml", CANDIDATE, Actor("secops", "key"))
        runner.reload()
        eid, did, att = running.start()
        answers = [submit_step(kernel, Lease(running.agent_id, eid, did, att), _req(a)) for a in (500, 5000, 7000)]
        assert [a.decision for a in answers] == ["proceed"] * 3  # the shadow never decides
        assert runner.drain(30)
    finally:
        runner.close()
        rego.close()
        dl.close()
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    shadows = [e for e in entries if e["path"] == "regent/shadow"]
    assert len([e for e in entries if e["path"] == "regent/step"]) == 3
    assert [e["event"] for e in shadows] == ["shadow.disagreed", "shadow.disagreed"]
    assert {e["step_id"] for e in shadows} == {answers[1].step_id, answers[2].step_id}
    for e in shadows:
        assert e["result"]["rule_id"] == "deny-large" and e["result"]["reason"] == "over the limit"
        assert e["result"]["active"]["rule_id"] == "allow-transfers"
        assert e["input"]["args"].keys() == {"amount"}  # masked
        assert f"{running.agent_id}#shadow" in e["bundles"] and running.agent_id in e["bundles"]
    assert "hunter2" not in path.read_text()
