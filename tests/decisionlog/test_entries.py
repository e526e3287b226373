"""What the core hands the decision log: one OPA-shaped entry per decision, only after the
transaction committed, for step decisions, eval errors, and approvals resolved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel.core import approvals, executions, steps
from kernel.core.approvals import Principal
from kernel.core.audit import DecisionQuery, list_decisions
from kernel.core.dispatch import claim_due, reap_expired_leases
from kernel.core.kernel import Kernel
from kernel.core.policies import store_policy
from kernel.decisionlog import DecisionLog, FileSink, parse_mask_rules
from kernel.domain import Lease
from kernel.errors import LeaseSuperseded
from kernel.identity import args_hash, canonical_json
from kernel.policy.resolver import BundleResolver, yaml_revision
from tests.conftest import Running

BUNDLE = """
default_action: deny
rules:
  - id: allow-read
    when: {target: read}
    then: {decision: allow}
  - id: ask-transfer
    when: {target: transfer}
    then: {decision: require_approval}
"""


def req(target: str, args: Any = None) -> steps.StepRequest:
    text = canonical_json(json.dumps(args))
    return steps.StepRequest(kind="tool_call", target=target, args=json.loads(text), args_text=text,
                             args_hash=args_hash(text))


@pytest.fixture
def logged(kernel: Kernel, running: Running, tmp_path: Path) -> Iterator[tuple[Kernel, Path]]:
    path = tmp_path / "decisions.jsonl"
    dl = DecisionLog([FileSink(str(path))], masks=parse_mask_rules("/args/password"))
    kernel.decision_log = dl
    kernel.policy = BundleResolver(kernel.store)
    store_policy(kernel, running.agent_id, "yaml", BUNDLE)
    yield kernel, path
    dl.close()


def entries(k: Kernel, path: Path) -> list[dict[str, Any]]:
    k.decision_log.close()  # type: ignore[attr-defined]  # writes what is buffered
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_step_decisions_become_opa_shaped_entries(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged
    eid, did, att = running.start({"customer": "c1"})
    allowed = steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("read", {"password": "pw1", "n": 1}))
    denied = steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("rm", {"n": 2}))
    got = entries(k, path)
    assert [e["event"] for e in got] == ["step.allowed", "step.denied"]
    first = got[0]
    assert set(first) >= {"decision_id", "path", "input", "result", "bundles", "timestamp", "execution_id",
                          "step_id", "rule_id", "agent_id", "requested_by"}
    assert first["path"] == "regent/step"
    assert first["execution_id"] == eid and first["step_id"] == allowed.step_id
    assert first["agent_id"] == first["requested_by"] == running.agent_id
    assert first["rule_id"] == "allow-read"
    assert first["result"] == {"decision": "allow", "rule_id": "allow-read"}
    bundle = first["bundles"][running.agent_id]
    assert (bundle["revision"], bundle["kind"]) == (yaml_revision(BUNDLE), "yaml")
    assert len(bundle["policy_hash"]) == 64  # the stored revision's content hash (docs/audit.md)
    assert first["input"]["args"] == {"n": 1}  # masked
    assert first["erased"] == ["/input/args/password"]
    assert first["input"]["execution"]["input"] == {"customer": "c1"}
    assert first["timestamp"] == k.clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert got[1]["result"]["decision"] == "deny" and got[1]["rule_id"] == "default"
    assert got[1]["step_id"] == denied.step_id
    assert got[0]["decision_id"] != got[1]["decision_id"]
    # The same decisions as the durable decisions table, under the same ids (no second record).
    page = list_decisions(k, DecisionQuery(execution_id=eid))
    assert sorted(r.id for r in page.decisions) == sorted(e["decision_id"] for e in got)


def test_an_approval_entry_has_its_decision_record_id(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged
    eid, did, att = running.start()
    blocked = steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("transfer", {"amount": 5}))
    assert blocked.approval_id
    approvals.decide_approval(k, blocked.approval_id, grant=False, principal=Principal(name="ops-key"),
                              decided_by="alice", rationale="no")
    ids = {r.id for r in list_decisions(k, DecisionQuery(execution_id=eid)).decisions}
    assert {e["decision_id"] for e in entries(k, path)} == ids and len(ids) == 2


def test_a_replayed_step_is_not_a_new_decision(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged
    eid, did, att = running.start()
    first = steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("rm", {"n": 1}))
    k.clock.advance(k.dispatch_lease_timeout + 1)  # type: ignore[attr-defined]
    reap_expired_leases(k)
    [claim] = [c for c in claim_due(k, 10) if c.execution_id == eid]
    again = steps.submit_step(k, Lease(running.agent_id, eid, claim.dispatch_id, claim.attempt), req("rm", {"n": 1}))
    assert (first.decision, again.decision, again.step_id) == ("denied", "denied", first.step_id)
    assert [e["event"] for e in entries(k, path)] == ["step.denied"]


def test_a_rolled_back_decision_leaves_no_entry(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged
    eid, did, att = running.start()
    with pytest.raises(LeaseSuperseded):
        steps.submit_step(k, Lease(running.agent_id, eid, did, att + 1), req("read", {"n": 1}))
    assert not path.exists() or entries(k, path) == []


def test_an_approval_resolved_is_an_entry_with_who_decided(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged
    eid, did, att = running.start()
    blocked = steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("transfer", {"amount": 5}))
    assert blocked.approval_id
    approvals.decide_approval(k, blocked.approval_id, grant=True, principal=Principal(name="ops-key"),
                              decided_by="alice", rationale="ok")
    got = entries(k, path)
    assert [e["event"] for e in got] == ["step.awaiting_approval", "approval.granted"]
    granted = got[1]
    assert granted["path"] == "regent/approval"
    assert granted["step_id"] == blocked.step_id and granted["execution_id"] == eid
    assert granted["requested_by"] == "ops-key"
    assert granted["result"] == {"decision": "granted", "decided_by": "ops-key", "rationale": "ok"}


def test_an_expired_approval_is_an_entry(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged
    eid, did, att = running.start()
    steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("transfer", {"amount": 5}))
    k.clock.advance(k.approval_timeout + 1)  # type: ignore[attr-defined]
    assert approvals.expire_approvals(k) == 1
    got = entries(k, path)
    assert got[-1]["event"] == "approval.expired" and got[-1]["result"]["decision"] == "expired"


def test_an_unusable_bundle_is_logged_as_an_eval_error(logged: tuple[Kernel, Path], running: Running) -> None:
    k, path = logged

    class Broken:
        def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
            return frozenset()

        def decide(self, inp: Any, tx: Any = None, bundle_id: Any = None) -> Any:
            from kernel.domain import Decision

            return Decision.bundle_error("policy_bundle_invalid")

    k.policy = Broken()  # type: ignore[assignment]
    eid, did, att = running.start()
    steps.submit_step(k, Lease(running.agent_id, eid, did, att), req("read", {"n": 1}))
    (entry,) = entries(k, path)
    assert entry["rule_id"] == "bundle-error"
    assert entry["error"] == {"code": "bundle-error", "message": "policy_bundle_invalid"}


def test_a_shadow_disagreement_entry_names_both_decisions_and_revisions(
        logged: tuple[Kernel, Path], running: Running) -> None:
    from kernel.core import decision_log as dlog
    from kernel.domain import Decision, PolicyInput, Verdict

    k, path = logged
    inp = PolicyInput(agent_id=running.agent_id, kind="tool_call", target="transfer_funds",
                      args={"amount": 5000, "password": "pw"}, now="2026-12-01T12:00:00.000000Z")
    active = Decision(Verdict.ALLOW, "allow-transfers", policy_revision="r1")
    shadow = Decision(Verdict.DENY, "deny-large", "over 1000", policy_revision="r2")
    with dlog.collect(k):
        dlog.note_shadow(k, agent_id=running.agent_id, execution_id="e1", step_id="s1", inp=inp, active=active,
                         active_outcome="allow", shadow=shadow, shadow_outcome="deny", shadow_revision="r2",
                         now=k.clock.now())
    (entry,) = entries(k, path)
    assert entry["path"] == "regent/shadow" and entry["event"] == "shadow.disagreed"
    assert entry["result"]["decision"] == "deny" and entry["result"]["active"]["rule_id"] == "allow-transfers"
    assert entry["bundles"][f"{running.agent_id}#shadow"]["revision"] == "r2"
    assert entry["input"]["args"] == {"amount": 5000}  # masked like every entry


def test_a_field_masked_anywhere_leaves_no_trace_in_the_entry(kernel: Kernel, running: Running,
                                                            tmp_path: Path) -> None:
    """`/args/iban` alone leaves the IBAN in `input.execution.input`; `/**/iban` takes it out of both
    (docs/policy-rollout.md, "Masking")."""
    path = tmp_path / "decisions.jsonl"
    dl = DecisionLog([FileSink(str(path))], masks=parse_mask_rules("/**/iban"))
    kernel.decision_log = dl
    kernel.policy = BundleResolver(kernel.store)
    store_policy(kernel, running.agent_id, "yaml", BUNDLE)
    try:
        eid, did, att = running.start({"payment": {"iban": "DE89370400440532013000", "amount": 5}})
        steps.submit_step(kernel, Lease(running.agent_id, eid, did, att), req("read", {"iban": "DE89370400440532013000"}))
        (entry,) = entries(kernel, path)
    finally:
        dl.close()
    assert "DE89370400440532013000" not in json.dumps(entry)
    assert entry["input"]["execution"]["input"] == {"payment": {"amount": 5}}
    assert entry["erased"] == ["/input/args/iban", "/input/execution/input/payment/iban"]
    # The kernel's own record keeps the value: masking is for what leaves it.
    assert executions.get_execution(kernel, eid).input["payment"]["iban"] == "DE89370400440532013000"
