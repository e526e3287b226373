"""A worker that answers "bundle missing" again right after reloading the bundle: every caller of
the engine's worker call fails closed (eval-error, a counted fault, a replaced worker), none raises.

The worker is real: one started with test hooks drops a bundle whose data.json maps the test fault
key to "forget" as soon as it has loaded it, so it answers OP_MISSING to the request and to the
retry after the reload.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernel.domain.decision import Decision, PolicyKind, Verdict
from kernel.policy.rego import RegoEngine
from kernel.policy.rego.document import input_document
from kernel.policy.rego.protocol import TEST_FAULT_KEY
from kernel.policy.rego.trace import ProbeError, explain_rego, traced_evaluate_many

from .conftest import bundle_of, step

ALLOW = 'decision := {"decision": "allow", "rule_id": "ok"}\n'
FORGOTTEN = bundle_of(ALLOW, data={TEST_FAULT_KEY: "forget"}, revision="forgotten-1")
KEPT = bundle_of(ALLOW, revision="kept-1")
REASON = "answered 'bundle missing' twice"


@pytest.fixture(scope="module")
def forgetful() -> Iterator[RegoEngine]:
    with RegoEngine(size=2, timeout=1.0, test_hooks=True) as e:
        assert e.evaluate(KEPT, step()).rule_id == "ok"
        yield e


def _assert_fails_closed(d: Decision) -> None:
    assert (d.verdict, d.rule_id, d.policy_kind, d.policy_revision) == (
        Verdict.DENY, "eval-error", PolicyKind.REGO, "forgotten-1")
    assert REASON in d.reason


def test_a_bundle_missing_twice_denies_eval_error_counted_as_a_worker_fault(forgetful: RegoEngine) -> None:
    before, pids = forgetful.stats(), set(forgetful.worker_pids())
    d = forgetful.evaluate(FORGOTTEN, step())
    _assert_fails_closed(d)
    assert d.reason == ("rego worker broke the protocol evaluating and was killed (it answered 'bundle missing' "
                        "twice, the second time right after loading the bundle)")
    after = forgetful.stats()
    assert after["crashes"] - before["crashes"] == 1
    assert after["eval_errors"] - before["eval_errors"] == 1
    assert after["bundle_loads"] - before["bundle_loads"] == 2  # loaded, missing, reloaded, missing
    # the worker that broke the protocol is replaced, and the engine keeps answering
    assert forgetful.wait_ready(timeout=10)
    assert set(forgetful.worker_pids()) != pids
    assert forgetful.evaluate(KEPT, step()).verdict is Verdict.ALLOW


def test_explain_of_a_bundle_missing_twice_denies(forgetful: RegoEngine) -> None:
    decision, printed = forgetful.explain(FORGOTTEN, step())
    _assert_fails_closed(decision)
    assert printed == ""
    doc = explain_rego(forgetful, FORGOTTEN, step())
    assert doc["decision"]["rule_id"] == "eval-error" and REASON in doc["decision"]["reason"]


def test_a_batch_of_a_bundle_missing_twice_denies_each_input(forgetful: RegoEngine) -> None:
    got = forgetful.evaluate_many(FORGOTTEN, [step(), step(command="ls")])
    assert len(got) == 2
    for d in got:
        _assert_fails_closed(d)
    traced = traced_evaluate_many(forgetful, FORGOTTEN, [input_document(step())])
    _assert_fails_closed(traced[0].decision)
    assert forgetful.evaluate_many(KEPT, [step()])[0].rule_id == "ok"


def test_a_probe_of_a_bundle_missing_twice_raises_probe_error(forgetful: RegoEngine) -> None:
    with pytest.raises(ProbeError, match=REASON):
        forgetful.probe(FORGOTTEN, input_document(step()), [FORGOTTEN.entrypoint])


def test_workers_without_test_hooks_keep_the_bundle() -> None:
    with RegoEngine(size=1, timeout=1.0) as plain:
        d = plain.evaluate(FORGOTTEN, step())
        assert (d.verdict, d.rule_id) == (Verdict.ALLOW, "ok")
        assert plain.stats()["crashes"] == 0
