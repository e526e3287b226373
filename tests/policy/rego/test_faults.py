"""Fault injection: 43 worker faults in one run, each a denied step, each followed by a normal one.

Segfaults and aborts come from the worker's test hook (an input key honoured only by workers
started with `test_hooks=True`); timeouts from a real Rego comprehension that runs for seconds in
rego-cpp; compiler aborts from the real rego-cpp crash pattern (`with input as {...}`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from kernel.domain.decision import PolicyKind, Verdict
from kernel.policy.rego import RegoEngine
from kernel.policy.rego.protocol import TEST_FAULT_KEY

from .conftest import bundle_of, step

# The pool's timeout applies to every evaluation, the normal ones included: at 100 ms a plain
# `ls` step timed out too on a machine at load 10+ (2 cores), and the test failed for nothing. The
# slow rule runs ~12 s, so 1 s still times it out whatever the load; the margin is what fault
# handling may add on top (a killed worker's replacement is started outside the evaluation).
TIMEOUT = 1.0
MARGIN = 2.0
SLOW_RUNS = 8
POLICY = bundle_of(
    'decision := {"decision": "allow", "rule_id": "ok"} if not input.args.slow\n'
    'decision := {"decision": "allow", "rule_id": "slow"} if {\n'
    "    input.args.slow\n"
    # ~12 s in rego-cpp 1.5.2, and no way to bound it from inside: only the kill stops it.
    "    count([x | some x in numbers.range(1, 3000000); x % 7 == 0]) > 0\n"
    "}\n",
    revision="fault-1",
)
OK = step(command="ls")


@pytest.fixture(scope="module")
def faulty() -> Iterator[RegoEngine]:
    with RegoEngine(size=2, timeout=TIMEOUT, test_hooks=True) as e:
        assert e.evaluate(POLICY, OK).rule_id == "ok"
        yield e


def _fault_then_recover(engine: RegoEngine, inp, expected_reason: str) -> float:
    t0 = time.monotonic()
    d = engine.evaluate(POLICY, inp)
    elapsed = time.monotonic() - t0
    assert (d.verdict, d.rule_id, d.policy_kind, d.policy_revision) == (
        Verdict.DENY,
        "eval-error",
        PolicyKind.REGO,
        "fault-1",
    )
    assert expected_reason in d.reason
    after = engine.evaluate(POLICY, OK)
    assert (after.verdict, after.rule_id) == (Verdict.ALLOW, "ok")
    return elapsed


@pytest.mark.parametrize(
    ("fault", "count", "reason"),
    [
        ("segv", 15, "rego worker crashed evaluating (killed by SIGSEGV)"),
        ("abort", 15, "rego worker crashed evaluating (killed by SIGABRT)"),
        ("exit", 5, "rego worker crashed evaluating (exited with status 3)"),
    ],
)
def test_crashing_worker_denies_eval_error_and_is_replaced(
    fault: str, count: int, reason: str, faulty: RegoEngine
) -> None:
    before = faulty.stats()
    worst = max(
        _fault_then_recover(faulty, step(**{TEST_FAULT_KEY: fault}), reason) for _ in range(count)
    )
    assert worst <= TIMEOUT + MARGIN, f"slowest {fault} took {worst:.3f}s"
    after = faulty.stats()
    assert after["crashes"] - before["crashes"] == count
    assert after["eval_errors"] - before["eval_errors"] == count


def test_policy_past_the_timeout_denies_eval_error(faulty: RegoEngine) -> None:
    before = faulty.stats()
    timings = [
        _fault_then_recover(faulty, step(slow=True), f"timed out after {TIMEOUT * 1000:g} ms")
        for _ in range(SLOW_RUNS)
    ]
    assert min(timings) >= TIMEOUT
    assert max(timings) <= TIMEOUT + MARGIN, f"slowest timeout took {max(timings):.3f}s"
    assert faulty.stats()["timeouts"] - before["timeouts"] == SLOW_RUNS


def test_real_rego_cpp_crash_denies_bundle_error(
    faulty: RegoEngine, caplog: pytest.LogCaptureFixture
) -> None:
    # rego-cpp 1.5.2 aborts compiling `with input as <object>` when the rule calls a builtin on
    # input (regopy-notes hazard 1); each bundle differs so each one really crashes a worker.
    before = faulty.stats()
    with caplog.at_level(logging.WARNING, logger="kernel.policy.rego"):
        for i in range(5):
            crasher = bundle_of(
                f"# variant {i}\n"
                'd if startswith(input.c, "ls")\n'
                'decision := {"decision": "allow", "rule_id": "a"} if { d with input as {"c": "ls"} }\n',
                revision=f"crasher-{i}",
            )
            d = faulty.evaluate(crasher, OK)
            assert (d.verdict, d.rule_id, d.policy_revision) == (
                Verdict.DENY,
                "bundle-error",
                f"crasher-{i}",
            )
            assert "SIGABRT" in d.reason
            assert faulty.evaluate(POLICY, OK).rule_id == "ok"
    assert faulty.stats()["crashes"] - before["crashes"] == 5
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert all(f"crasher-{i}" in logged for i in range(5))


def test_faults_are_logged_with_the_revision(
    faulty: RegoEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kernel.policy.rego"):
        faulty.evaluate(POLICY, step(**{TEST_FAULT_KEY: "segv"}))
    assert any("SIGSEGV" in r.getMessage() and "fault-1" in r.getMessage() for r in caplog.records)


def test_pool_is_whole_again_after_the_faults(faulty: RegoEngine) -> None:
    assert faulty.wait_ready(timeout=10)
    assert faulty.stats()["workers"] == 2
    assert faulty.stats()["workers_replaced"] >= 35 + SLOW_RUNS


def test_threads_sharing_a_faulting_pool_all_get_answers() -> None:
    # A pool of its own, with room for a loaded machine: with the module's 1 s timeout and the
    # default 5 s wait for a worker, an `ok` step was denied eval-error once in a full suite at
    # `-n 3` on 2 cores (load 6+), while both workers were slow runs being killed and replaced.
    # 3 s still times the ~12 s rule out; what is tested is that every thread gets its own answer.
    faulty = RegoEngine(size=2, timeout=3.0, acquire_timeout=30.0, test_hooks=True)
    kinds = ["ok", "ok", "ok", "segv", "ok", "slow", "ok", "abort"]
    wrong: list[tuple[str, str, str]] = []

    def run(t: int) -> None:
        for i in range(16):
            kind = kinds[(t + i) % len(kinds)]
            if kind == "ok":
                inp = OK
            elif kind == "slow":
                inp = step(slow=True)
            else:
                inp = step(**{TEST_FAULT_KEY: kind})
            d = faulty.evaluate(POLICY, inp)
            if d.rule_id != ("ok" if kind == "ok" else "eval-error"):
                wrong.append((kind, d.rule_id, d.reason or ""))

    with faulty:
        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert not any(th.is_alive() for th in threads)
        assert wrong == []
        assert faulty.wait_ready(timeout=10)


def test_workers_without_test_hooks_ignore_the_fault_key() -> None:
    with RegoEngine(size=1, timeout=TIMEOUT) as plain:
        d = plain.evaluate(POLICY, step(**{TEST_FAULT_KEY: "segv"}))
        assert (d.verdict, d.rule_id) == (Verdict.ALLOW, "ok")
        assert plain.stats()["crashes"] == 0


def test_a_nice_pool_runs_its_workers_and_their_replacements_at_the_lower_priority() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    want = min(19, base + 5)
    engine = RegoEngine(size=1, timeout=TIMEOUT, test_hooks=True, nice=5)
    try:
        assert engine.evaluate(POLICY, OK).rule_id == "ok"
        pids = {w.pid for w in engine._pool._live}
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [want]
        _fault_then_recover(engine, step(**{TEST_FAULT_KEY: "exit"}), "exited with status 3")
        replaced = {w.pid for w in engine._pool._live}
        assert replaced and not replaced & pids
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in replaced] == [want]
        assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the kernel's own priority is untouched
    finally:
        engine.close()


def test_a_batch_with_a_crashing_input_denies_only_that_one(faulty: RegoEngine) -> None:
    """evaluate_many (the policy test runner's batches): the worker dies on the third input, the
    batch is evaluated again one by one, and the others get the decisions `evaluate` gives."""
    inputs = [OK, step(command="pwd"), step(**{TEST_FAULT_KEY: "segv"}), OK, step(**{TEST_FAULT_KEY: "exit"})]
    before = faulty.stats()
    got = faulty.evaluate_many(POLICY, inputs)
    assert [d.rule_id for d in got] == ["ok", "ok", "eval-error", "ok", "eval-error"]
    assert "killed by SIGSEGV" in got[2].reason and "exited with status 3" in got[4].reason
    after = faulty.stats()
    assert after["evaluations"] - before["evaluations"] == 5
    # Counted once each: the batch's own fault is not, the inputs at fault are when they fault again.
    assert after["crashes"] - before["crashes"] == 2
    assert faulty.evaluate_many(POLICY, [OK] * 300) == [faulty.evaluate(POLICY, OK)] * 300
