"""Large execution inputs are decoded once for the step path, within a bound, and stay correct."""

from __future__ import annotations

import json
from typing import Any

from kernel.core import steps
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.identity import args_hash, canonical_json
from kernel.store.codec import DecodedInputs
from tests.conftest import Running


def test_small_inputs_are_decoded_every_time_and_not_kept() -> None:
    cache = DecodedInputs(min_chars=100)
    a, b = cache.decode("e1", '{"a": 1}'), cache.decode("e1", '{"a": 1}')
    assert a == b == {"a": 1} and a is not b
    assert len(cache) == 0 and cache.decode("e2", None) is None


def test_a_large_input_is_decoded_once_and_the_total_is_bounded() -> None:
    text = json.dumps({"doc": "x" * 200})
    cache = DecodedInputs(min_chars=100, max_chars=3 * len(text))
    first = cache.decode("e1", text)
    assert cache.decode("e1", text) is first and first == {"doc": "x" * 200}
    for i in range(2, 6):  # four more: only the three most recently used fit
        cache.decode(f"e{i}", text)
    assert len(cache) == 3
    assert cache.decode("e1", text) is not first  # evicted, decoded again
    huge = json.dumps({"doc": "y" * 1000})  # larger than the whole budget: decoded, never kept
    assert cache.decode("big", huge) == {"doc": "y" * 1000} and len(cache) == 3


class _Recorder:
    """A resolver that records the policy input it is asked about and allows everything."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        return frozenset()

    def decide(self, inp: Any, tx: Any = None, bundle_id: Any = None) -> Any:
        from kernel.domain import Decision

        self.inputs.append(inp.execution["input"])
        return Decision.permissive()


def test_steps_of_an_execution_with_a_large_input_see_it_whole(kernel: Kernel, running: Running) -> None:
    big = {"doc": [f"line {i}" for i in range(2000)]}  # ~20 KB of JSON
    recorder = _Recorder()
    kernel.policy = recorder  # type: ignore[assignment]
    eid, did, att = running.start(big)
    for i in range(3):
        text = canonical_json(json.dumps({"i": i}))
        req = steps.StepRequest(kind="tool_call", target="t", args={"i": i}, args_text=text,
                                args_hash=args_hash(text), idempotency="safe_to_retry")
        answer = steps.submit_step(kernel, Lease(running.agent_id, eid, did, att), req)
        assert answer.decision == "proceed"
        assert steps.record_outcome(kernel, Lease(running.agent_id, eid, did, att), answer.step_id or "",
                                    result={"ok": i}).decision == "recorded"
    assert recorder.inputs == [big, big, big]
    assert len(kernel.store.inputs) == 1  # decoded once, shared by the three submits and outcomes
