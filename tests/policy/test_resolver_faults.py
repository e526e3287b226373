"""The resolver fails closed on a stored bundle that raises while evaluating or no longer compiles,
for an agent's active revision and for a fork's own bundle alike (SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime

import pytest

from kernel.domain import Agent, Decision, PolicyInput, Verdict
from kernel.policy.resolver import BundleResolver, CompiledBundle
from kernel.store import SqlStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CONTENT = "rules: []\n"
DIGEST = hashlib.sha256(CONTENT.encode("utf-8")).hexdigest()


class Raising:
    revision = "r1"

    def evaluate(self, inp: PolicyInput) -> Decision:
        raise RuntimeError("the engine fell over")

    def denied_always(self, agent_id: str, kind: str, target: str) -> bool:
        raise RuntimeError("the engine fell over")


def _raising(content: str, revision: str) -> CompiledBundle:
    return Raising()


def _refusing(content: str, revision: str) -> CompiledBundle:
    raise ValueError("no longer compiles")


def _stored(store: SqlStore) -> int:
    with store.transaction() as tx:
        tx.upsert_agent(Agent(id="a", webhook_url="http://127.0.0.1:9/", secret="s", registered_at=NOW))
        tx.add_policy_revision("a", "yaml", "r1", CONTENT, NOW)
        return tx.insert_fork_bundle("a", "yaml", "r1", CONTENT, NOW)


def _inp() -> PolicyInput:
    return PolicyInput(agent_id="a", kind="tool", target="t", args={})


@pytest.mark.parametrize("fork", [False, True], ids=["active", "fork"])
def test_a_bundle_that_raises_while_evaluating_is_a_logged_eval_error_deny(
        store: SqlStore, fork: bool, caplog: pytest.LogCaptureFixture) -> None:
    bundle_id = _stored(store)
    resolver = BundleResolver(store, compilers={"yaml": _raising})
    with caplog.at_level(logging.ERROR, logger="kernel.policy"):
        d = resolver.decide(_inp(), bundle_id=bundle_id if fork else None)
    assert (d.verdict, d.rule_id, d.reason) == (Verdict.DENY, "eval-error", "policy evaluation failed")
    assert (d.policy_revision, d.policy_hash) == ("r1", DIGEST)
    where = f"(fork bundle {bundle_id})" if fork else "(agent a, revision r1)"
    assert [r.getMessage() for r in caplog.records] == [f"policy evaluation failed {where}"]


@pytest.mark.parametrize("fork", [False, True], ids=["active", "fork"])
def test_a_stored_bundle_that_no_longer_compiles_is_a_bundle_error_deny(store: SqlStore, fork: bool) -> None:
    bundle_id = _stored(store)
    resolver = BundleResolver(store, compilers={"yaml": _refusing})
    d = resolver.decide(_inp(), bundle_id=bundle_id if fork else None)
    assert (d.verdict, d.rule_id) == (Verdict.DENY, "bundle-error")
    assert (d.policy_revision, d.policy_hash) == ("r1", DIGEST)


def test_a_bundle_that_raises_while_asked_what_it_always_denies_hides_nothing(
        store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    _stored(store)
    resolver = BundleResolver(store, compilers={"yaml": _raising})
    with caplog.at_level(logging.ERROR, logger="kernel.policy"):
        assert resolver.denied_always("a", "tool_call", ["fs_read_file"]) == frozenset()
    assert [r.getMessage() for r in caplog.records] == ["denied_always: policy lookup failed for agent a"]
