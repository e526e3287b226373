"""The shadow runner on both dialects: a hung shadow engine never holds up a step's answer, a full
queue drops and counts instead of blocking, and what was judged is recorded once released."""

from __future__ import annotations

import threading
import time

from kernel.core import shadow
from kernel.core.kernel import Kernel
from kernel.core.policies import Actor
from kernel.core.steps import StepRequest, submit_step
from kernel.domain import Decision, Lease, PolicyInput, Verdict
from kernel.domain.decision import ShadowRef
from kernel.identity import args_hash, canonical_json
from kernel.policy.resolver import BundleResolver
from kernel.shadow_runner import ShadowRunner
from tests.conftest import Running

ACTIVE = "default_action: allow\n"
CANDIDATE = "default_action: deny\n"


class HungEngine:
    """A shadow engine stuck until released (what a wedged worker looks like from the runner)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def evaluate(self, ref: ShadowRef, inp: PolicyInput) -> Decision:
        self.calls += 1
        self.release.wait(30)
        return Decision(Verdict.DENY, "default", "no explicit allow rule matched")


def _req(i: int) -> StepRequest:
    text = canonical_json(f'{{"i":{i}}}')
    return StepRequest("tool_call", "transfer_funds", {"i": i}, text, args_hash(text))


def test_hung_shadow_neither_delays_answers_nor_blocks_and_a_full_queue_is_counted(
    kernel: Kernel, running: Running,
) -> None:
    kernel.policy = BundleResolver(kernel.store)
    engine = HungEngine()
    runner = ShadowRunner(kernel, engine, queue_size=3, flush_interval=0.05)
    runner.start()
    kernel.shadow = runner
    try:
        from kernel.core.policies import store_policy

        store_policy(kernel, "shell", "yaml", ACTIVE)
        shadow.store_shadow(kernel, "shell", "yaml", CANDIDATE, Actor("secops", "key"))
        eid, did, att = running.start()
        t0 = time.monotonic()
        answers = [submit_step(kernel, Lease("shell", eid, did, att), _req(0))]
        wait_until = time.monotonic() + 20
        while engine.calls == 0 and time.monotonic() < wait_until:  # the runner is now stuck on step 0
            time.sleep(0.01)
        assert engine.calls == 1
        answers += [submit_step(kernel, Lease("shell", eid, did, att), _req(i)) for i in range(1, 10)]
        elapsed = time.monotonic() - t0
        assert [a.decision for a in answers] == ["proceed"] * 10
        assert elapsed < 10  # a hung shadow would have cost 30 s per step on the answer's path
        # One in the engine's hands, three queued, the other six dropped and counted.
        assert runner.dropped == 6
        engine.release.set()
        assert runner.drain(30)
        rep = shadow.shadow_report(kernel, "shell")
        assert rep["totals"] == {"evaluated": 4, "agreed": 0, "disagreed": 4, "errors": 0, "dropped": 6, "skipped": 0}
        assert rep["disagreements"] == {"allow→deny": 4}
        assert rep["shadow"].created_by == "secops"
    finally:
        engine.release.set()
        runner.close()


class CrashingEngine:
    """Every evaluation is a worker crash, as the Rego engine reports one."""

    def __init__(self) -> None:
        self.calls = 0

    def evaluate(self, ref: ShadowRef, inp: PolicyInput) -> Decision:
        self.calls += 1
        return Decision(Verdict.DENY, "eval-error", "rego worker crashed evaluating (killed by SIGSEGV)")


def test_three_faults_in_a_row_pause_the_shadow_and_the_steps_meanwhile_are_skipped(
    kernel: Kernel, running: Running,
) -> None:
    kernel.policy = BundleResolver(kernel.store)
    engine = CrashingEngine()
    runner = ShadowRunner(kernel, engine, flush_interval=0.05)
    runner.start()
    kernel.shadow = runner
    try:
        from kernel.core.policies import store_policy

        store_policy(kernel, "shell", "yaml", ACTIVE)
        shadow.store_shadow(kernel, "shell", "yaml", CANDIDATE, Actor(None, "bootstrap"))
        eid, did, att = running.start()
        answers = [submit_step(kernel, Lease("shell", eid, did, att), _req(i)) for i in range(6)]
        assert [a.decision for a in answers] == ["proceed"] * 6  # the active decisions stand
        assert runner.drain(30)
        rep = shadow.shadow_report(kernel, "shell")
        assert rep["totals"] == {"evaluated": 3, "agreed": 0, "disagreed": 0, "errors": 3, "dropped": 0, "skipped": 3}
        assert rep["errors"] == {"crash": 3} and engine.calls == 3  # paused: no fourth worker spent
        assert "SIGSEGV" in (rep["shadow"].last_error or "")
    finally:
        runner.close()


def test_a_rego_shadow_is_compiled_and_its_workers_started_before_its_first_step(
    kernel: Kernel, running: Running,
) -> None:
    """The runner prepares a new shadow on its own thread, so the shadow pool's start-up (a
    process and regopy's import) is not paid while the first shadowed steps are being answered."""
    import json

    from kernel.core.policies import store_policy
    from kernel.policy.resolver import LazyRegoEngine
    from kernel.policy.shadow_eval import ShadowBundles

    kernel.policy = BundleResolver(kernel.store)
    rego = LazyRegoEngine(size=1, acquire_timeout=0.05)
    bundles = ShadowBundles(kernel.store, rego)
    store_policy(kernel, "shell", "yaml", ACTIVE)
    candidate = {"modules": {"policy.rego": 'package shell\nimport rego.v1\n\n'
                                            'decision := {"decision": "deny", "rule_id": "no"}\n'},
                 "data": {}, "manifest": {"revision": "candidate", "roots": ["shell"], "metadata": {
                     "regent": {"entrypoint": "shell/decision", "default_action": "deny"}}}}
    shadow.store_shadow(kernel, "shell", "rego", json.dumps(candidate), Actor("secops", "key"))
    runner = ShadowRunner(kernel, bundles, flush_interval=0.05, refresh_interval=0.05)
    runner.start()
    kernel.shadow = runner
    try:
        [ref] = list(runner._refs.values())
        deadline = time.monotonic() + 30
        while ref.id not in bundles._cache and time.monotonic() < deadline:  # the pool starts first
            time.sleep(0.01)
        assert rego._engine is not None  # started with no step submitted
        assert ref.id in bundles._cache and not isinstance(bundles._cache[ref.id], Exception)
        eid, did, att = running.start()
        assert submit_step(kernel, Lease("shell", eid, did, att), _req(0)).decision == "proceed"
        assert runner.drain(30)
        rep = shadow.shadow_report(kernel, "shell")
        assert rep["totals"]["evaluated"] == 1 and rep["totals"]["errors"] == 0, rep
        assert rep["disagreements"] == {"allow→deny": 1}
    finally:
        runner.close()


def test_disagreement_rows_past_their_retention_are_deleted_and_the_tallies_kept(
    kernel: Kernel, running: Running,
) -> None:
    from kernel.core import sweeps

    kernel.policy = BundleResolver(kernel.store)
    runner = ShadowRunner(kernel, _Deny(), flush_interval=0.05)
    runner.start()
    kernel.shadow = runner
    try:
        from kernel.core.policies import store_policy

        store_policy(kernel, "shell", "yaml", ACTIVE)
        shadow.store_shadow(kernel, "shell", "yaml", CANDIDATE, Actor("secops", "key"))
        runner.reload()
        eid, did, att = running.start()
        for i in range(3):
            submit_step(kernel, Lease("shell", eid, did, att), _req(i))
        assert runner.drain(30)
        kernel.clock.advance(kernel.shadow_retention - 10)  # type: ignore[attr-defined]
        for i in range(3, 5):
            submit_step(kernel, Lease("shell", eid, did, att), _req(i))
        assert runner.drain(30)
        kernel.clock.advance(20)  # type: ignore[attr-defined]
        assert len(shadow.shadow_report(kernel, "shell")["samples"]) == 5
        result = sweeps.cleanup_sweep(kernel, "k")
        assert result is not None and result.disagreements_deleted == 3
        rep = shadow.shadow_report(kernel, "shell")
        assert len(rep["samples"]) == 2 and rep["top_targets"] == [("transfer_funds", 2)]
        assert rep["totals"]["disagreed"] == 5 and rep["disagreements"] == {"allow→deny": 5}
        kernel.shadow_retention = 0  # for ever
        kernel.clock.advance(10 * 365 * 86400)  # type: ignore[attr-defined]
        assert shadow.delete_expired_disagreements(kernel) == 0
        assert len(shadow.shadow_report(kernel, "shell")["samples"]) == 2
    finally:
        runner.close()


class _Deny:
    def evaluate(self, ref: ShadowRef, inp: PolicyInput) -> Decision:
        return Decision(Verdict.DENY, "deny-all", "the candidate denies")


def test_shadow_workers_that_did_not_start_are_tried_again_not_cached_as_a_bundle_error(
    kernel: Kernel, running: Running,
) -> None:
    import json

    from kernel.core.policies import store_policy
    from kernel.policy.resolver import LazyRegoEngine
    from kernel.policy.shadow_eval import ShadowBundles

    class FlakyStart:
        """The first start fails (as a worker that missed its start timeout), the next succeeds."""

        def __init__(self) -> None:
            self.real = LazyRegoEngine(size=1)
            self.calls = 0

        def get(self) -> object:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("rego worker did not start (timeout)")
            return self.real.get()

        def close(self) -> None:
            self.real.close()

    kernel.policy = BundleResolver(kernel.store)
    rego = FlakyStart()
    bundles = ShadowBundles(kernel.store, rego)  # type: ignore[arg-type]
    store_policy(kernel, "shell", "yaml", ACTIVE)
    candidate = {"modules": {"policy.rego": 'package shell\nimport rego.v1\n\n'
                                            'decision := {"decision": "deny", "rule_id": "no"}\n'},
                 "data": {}, "manifest": {"revision": "candidate", "roots": ["shell"], "metadata": {
                     "regent": {"entrypoint": "shell/decision", "default_action": "deny"}}}}
    shadow.store_shadow(kernel, "shell", "rego", json.dumps(candidate), Actor("secops", "key"))
    [ref] = shadow.shadowing_refs(kernel)
    inp = PolicyInput(agent_id="shell", kind="tool_call", target="transfer_funds", args={},
                      idempotency="safe_to_retry", execution={}, usage={}, now="2026-12-01T00:00:00Z")
    try:
        first = bundles.evaluate(ref, inp)
        assert first.rule_id == "bundle-error" and "did not start" in (first.reason or "")
        second = bundles.evaluate(ref, inp)
        assert (second.verdict, second.rule_id) == (Verdict.DENY, "no")
    finally:
        bundles.close()
