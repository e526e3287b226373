"""The audit fields of issue 19 on a stored YAML bundle, on SQLite and PostgreSQL: `policy_hash`
(SHA-256 of the bundle text) on step.allowed / step.denied / step.awaiting_approval, `reason` on
the allowed and awaiting-approval events, `rule_id` in every denied answer."""

from __future__ import annotations

import hashlib

from kernel.core import approvals, policies, steps
from kernel.core.approvals import Principal
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.identity import args_hash
from tests.conftest import Running

BUNDLE = """default_action: deny
rules:
  - id: reads
    when: {target: read}
    then: {decision: allow, reason: reading is fine}
  - id: payments
    when: {target: pay}
    then: {decision: require_approval, reason: money moves}
  - id: no-rm
    when: {target: rm}
    then: {decision: deny, reason: never delete}
"""



def _req(target: str) -> steps.StepRequest:
    return steps.StepRequest(kind="tool_call", target=target, args={}, args_text="{}", args_hash=args_hash("{}"))


def test_decision_events_carry_the_policy_hash_and_reason_and_denials_the_rule(
        governed: Kernel, running: Running) -> None:
    k = governed
    policies.store_policy(k, "shell", "yaml", BUNDLE)
    eid, did, att = running.start()
    answers = {t: steps.submit_step(k, Lease("shell", eid, did, att), _req(t)) for t in ("read", "rm", "other", "pay")}
    assert {t: a.decision for t, a in answers.items()} == {
        "read": "proceed", "rm": "denied", "other": "denied", "pay": "blocked"}
    assert [answers[t].to_json()["rule_id"] for t in ("rm", "other")] == ["no-rm", "default"]
    with k.store.read() as tx:
        decided = {e.payload["target"]: (e.type, e.payload) for e in tx.list_events(eid, 0, 100)
                   if e.type in ("step.allowed", "step.denied", "step.awaiting_approval")}
    digest = hashlib.sha256(BUNDLE.encode()).hexdigest()
    assert {t: typ for t, (typ, _) in decided.items()} == {
        "read": "step.allowed", "rm": "step.denied", "other": "step.denied", "pay": "step.awaiting_approval"}
    assert {p["policy_hash"] for _, p in decided.values()} == {digest}
    assert (decided["read"][1]["reason"], decided["pay"][1]["reason"]) == ("reading is fine", "money moves")
    assert decided["rm"][1]["rule_id"] == "no-rm"


def test_approval_events_name_the_rule_and_bundle_that_asked(governed: Kernel, running: Running) -> None:
    k = governed
    policies.store_policy(k, "shell", "yaml", BUNDLE)
    eid, did, att = running.start()
    asked = steps.submit_step(k, Lease("shell", eid, did, att), _req("pay"))
    assert asked.decision == "blocked" and asked.approval_id
    approvals.decide_approval(k, asked.approval_id, grant=False, principal=Principal(admin=True),
                              decided_by="ops", rationale="not today")
    with k.store.read() as tx:
        events = [(e.type, e.payload) for e in tx.list_events(eid, 0, 100) if e.type.startswith("approval.")]
    digest = hashlib.sha256(BUNDLE.encode()).hexdigest()
    assert [typ for typ, _ in events] == ["approval.requested", "approval.denied"]
    assert {(p["rule_id"], p["policy_hash"]) for _, p in events} == {("payments", digest)}
