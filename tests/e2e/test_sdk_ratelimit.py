"""Rate limits end to end: a real `regent dev`, an official-SDK agent (tests/e2e/ratelimit_agent.py)
on loopback, YAML and Rego bundles posted through the admin API. A call over the limit reaches the
agent as `RateLimited`; with `max_wait` the execution parks (`blocked`) and is re-delivered after the
wait; a second park in one execution is refused (rebuno-v0 §2.1 step 14, §3.7)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import AgentProc, DevKernel, dev_kernel_for, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

RL_AGENT = Path(__file__).with_name("ratelimit_agent.py")
YAML_AGENT, REGO_AGENT = "rl-yaml", "rl-rego"

YAML_BUNDLE = """
default_action: deny
rules:
  - id: search-cap
    when: {target: search}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m}
  - id: fetch-park
    when: {target: fetch}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 2s, max_wait: 10s}
"""

REGO_MODULE = """package rl

import rego.v1

decision := {"decision": "allow", "rule_id": "search-cap", "rate_limit": {"max_calls": 1, "window": "1m"}} if {
	input.target == "search"
}
"""


def rego_bundle() -> dict[str, Any]:
    return {"kind": "rego", "bundle": {
        "modules": {"policy.rego": REGO_MODULE},
        "data": {},
        "manifest": {"revision": "e2e-rl", "roots": ["rl"],
                     "metadata": {"regent": {"entrypoint": "rl/decision", "default_action": "deny"}}},
    }}


class RlKernel:
    def __init__(self, k: DevKernel):
        self.k = k
        self.api = k.api
        self.agents: dict[str, AgentProc] = {}

    def run(self, agent_id: str, calls: list[tuple[str, int]], timeout: float = 30) -> tuple[str, dict[str, Any]]:
        eid = self.api.create(agent_id, {"calls": [{"tool": t, "n": n} for t, n in calls]})
        return eid, self.api.wait_status(eid, "completed", "failed", "cancelled", timeout=timeout)

    def effects(self, agent_id: str, eid: str) -> list[list[str]]:
        return [line.split()[1:] for line in self.agents[agent_id].effect_lines() if line.startswith(f"{eid} ")]

    def logs(self, agent_id: str, eid: str, event: str) -> list[dict[str, Any]]:
        return [r for r in self.agents[agent_id].log_lines(event) if r.get("execution_id") == eid]

    def payloads(self, eid: str, typ: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.api.events(eid) if e["type"] == typ]


@pytest.fixture(scope="module")
def rl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RlKernel]:
    """One `regent dev` (memory:// buckets) with one rate-limit agent per bundle kind."""
    tmp = tmp_path_factory.mktemp("ratelimit")
    with dev_kernel_for((YAML_AGENT, REGO_AGENT), tmp) as k:
        r = RlKernel(k)
        for agent_id in (YAML_AGENT, REGO_AGENT):
            r.agents[agent_id] = k.agent(agent_id, script=RL_AGENT)
        resp = k.api.http.post(f"/v0/policies/{YAML_AGENT}", json={"bundle": YAML_BUNDLE})
        assert resp.status_code == 204, resp.text
        resp = k.api.http.post(f"/v0/policies/{REGO_AGENT}", json=rego_bundle())
        assert resp.status_code == 204, resp.text
        yield r


def _assert_refused_second_search(rl: RlKernel, agent_id: str) -> None:
    eid, e = rl.run(agent_id, [("search", 1), ("search", 2)])
    assert e["status"] == "completed", e
    assert e["output"] == {"rate_limited": True, "at": 2, "reason": "rate_limit_exceeded",
                           "results": ["ran search 1"]}
    [seen] = rl.logs(agent_id, eid, "rate_limited")
    assert (seen["type"], seen["n"], seen["reason"]) == ("RateLimited", 2, "rate_limit_exceeded")
    assert [x[:2] for x in rl.effects(agent_id, eid)] == [["search", "1"]]
    [refusal] = rl.payloads(eid, "step.rate_limited")
    assert refusal["error"] == {"reason": "rate_limit_exceeded", "rule_id": "search-cap"}
    assert refusal["step_id"] not in {s["step_id"] for s in rl.api.steps(eid)}  # the id it would have had
    # No step row for the refused call: only the admitted search is recorded.
    rows = rl.api.steps(eid)
    assert [(s["target"], s["args"]) for s in rows] == [("search", {"n": 1})], rows
    # Refused, not parked: one delivery, no second dispatch queued.
    assert len(rl.logs(agent_id, eid, "delivered")) == 1


def test_yaml_second_call_over_a_per_minute_limit_is_rate_limited_in_the_agent(rl: RlKernel) -> None:
    _assert_refused_second_search(rl, YAML_AGENT)


def test_rego_second_call_over_a_per_minute_limit_is_rate_limited_in_the_agent(rl: RlKernel) -> None:
    _assert_refused_second_search(rl, REGO_AGENT)


def test_refusal_does_not_advance_the_occurrence(rl: RlKernel) -> None:
    # Three identical calls: the first runs, the next two are refused. Had the refusal advanced the
    # occurrence, the third would carry a new step id; it carries the same one.
    eid = rl.api.create(YAML_AGENT, {"keep_going": True, "calls": [{"tool": "search", "n": 7}] * 3})
    e = rl.api.wait_status(eid, "completed", "failed", "cancelled", timeout=30)
    assert e["output"] == {"rate_limited": False, "results": ["ran search 7"]}, e
    assert [r["n"] for r in rl.logs(YAML_AGENT, eid, "rate_limited")] == [7, 7]
    first, second = rl.payloads(eid, "step.rate_limited")
    assert first["step_id"] == second["step_id"]
    [step] = rl.api.steps(eid)
    assert step["step_id"] != first["step_id"]


def test_max_wait_parks_then_redelivers_after_the_wait_and_runs_each_body_once(rl: RlKernel) -> None:
    started = time.monotonic()
    eid = rl.api.create(YAML_AGENT, {"calls": [{"tool": "fetch", "n": 1}, {"tool": "fetch", "n": 2}]})
    wait_for(lambda: rl.logs(YAML_AGENT, eid, "blocked"), "the agent to see blocked", timeout=15)
    assert rl.api.get(eid)["status"] == "running"  # parked, not failed or blocked on a human
    e = rl.api.wait_status(eid, "completed", "failed", "cancelled", timeout=25)
    elapsed = time.monotonic() - started
    assert e["status"] == "completed", e
    assert e["output"] == {"rate_limited": False, "results": ["ran fetch 1", "ran fetch 2"]}
    # The agent saw `blocked` once, then was delivered again and finished.
    blocked = rl.logs(YAML_AGENT, eid, "blocked")
    delivered = rl.logs(YAML_AGENT, eid, "delivered")
    assert [b["n"] for b in blocked] == [2]
    assert len(delivered) == 2, delivered
    # Each allowed body ran exactly once (fetch 1 was replayed on re-delivery, not re-run).
    fx = rl.effects(YAML_AGENT, eid)
    assert [x[:2] for x in fx] == [["fetch", "1"], ["fetch", "2"]]
    gap = float(fx[1][2]) - float(fx[0][2])
    redelivery_wait = delivered[1]["at"] - blocked[0]["at"]
    assert 1.0 <= redelivery_wait <= 10.0 + 3.0, redelivery_wait  # ~window; the park is capped at max_wait
    assert 1.5 <= gap <= 10.0 + 3.0, gap
    assert elapsed < 20, elapsed
    types = rl.api.types(eid)
    assert types.count("step.rate_limited") == 1
    [park] = rl.payloads(eid, "step.rate_limited")
    assert park["error"] == {"reason": "rate_limit_exceeded", "rule_id": "fetch-park"}
    i = types.index("step.rate_limited")
    assert types[i + 1] == "dispatch.queued", types  # the lease is released and a new dispatch queued at once
    queued = [p for p in rl.payloads(eid, "dispatch.queued") if p.get("next_attempt_at")]
    assert queued, rl.api.events(eid)
    assert [s["args"] for s in rl.api.steps(eid)] == [{"n": 1}, {"n": 2}]


def test_a_second_park_in_the_same_execution_is_refused(rl: RlKernel) -> None:
    eid, e = rl.run(YAML_AGENT, [("fetch", 1), ("fetch", 2), ("fetch", 3)], timeout=25)
    assert e["status"] == "completed", e
    assert e["output"] == {"rate_limited": True, "at": 3, "reason": "rate_limit_exceeded",
                           "results": ["ran fetch 1", "ran fetch 2"]}
    [seen] = rl.logs(YAML_AGENT, eid, "rate_limited")
    assert (seen["type"], seen["n"]) == ("RateLimited", 3)
    assert [b["n"] for b in rl.logs(YAML_AGENT, eid, "blocked")] == [2]
    assert [x[:2] for x in rl.effects(YAML_AGENT, eid)] == [["fetch", "1"], ["fetch", "2"]]
    limited = rl.payloads(eid, "step.rate_limited")
    assert [p["error"]["rule_id"] for p in limited] == ["fetch-park", "fetch-park"]
    assert len(rl.api.steps(eid)) == 2
