"""`GET /metrics`: Prometheus text with the step answers, error codes and the lane, over real HTTP."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Running
from tests.support import AgentClient, ServerThread


def _samples(server: ServerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_count_step_answers_errors_and_show_the_lane(
        server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    eid, did, att = running.start()
    agent_client.lease(did, att)
    first = agent_client.submit(eid, "shell.run", {"cmd": "ls"}).json()
    assert first["decision"] == "proceed"
    assert agent_client.complete_step(eid, first["step_id"], {"out": "a"}).json()["decision"] == "recorded"
    # Re-signed (a later timestamp): the same bytes again are refused as a replay (docs/api.md).
    again = agent_client.complete_step(eid, first["step_id"], {"out": "a"}, ts=int(time.time()) + 1).json()
    assert again["decision"] == "replay"
    stale = agent_client.lease(did, att + 1).submit(eid, "shell.run", {"cmd": "pwd"})
    assert stale.status_code == 409

    m = _samples(server)
    assert m[("regent_step_decisions_total", (("agent_id", "shell"), ("decision", "proceed"), ("kind", "tool_call"),
                                              ("rule_id", "permissive")))] == 1.0
    assert m[("regent_step_outcomes_total", (("answer", "recorded"), ("call", "complete")))] == 1.0
    assert m[("regent_step_outcomes_total", (("answer", "replay"), ("call", "complete")))] == 1.0
    assert m[("regent_api_errors_total", (("code", "lease_superseded"),))] == 1.0
    assert m[("regent_lane_threads", ())] >= 1
    assert m[("regent_lane_queued", ())] == 0
    assert ("regent_lane_spilled_total", ()) in m


def test_label_budget_keeps_agent_and_rule_labels_bounded() -> None:
    from kernel.api.metrics import OTHER, LabelBudget

    b = LabelBudget(max_pairs=3, max_agents=2, max_chars=10)
    assert b.pair("a", "r1") == ("a", "r1")
    assert b.pair("a", "r2") == ("a", "r2")
    assert b.pair("b", "r1") == ("b", "r1")
    assert b.pair("a", "r3") == ("a", OTHER)  # past three pairs
    assert b.pair("a", "r1") == ("a", "r1")  # known pairs keep their labels
    assert b.pair("c", "r1")[0] == OTHER  # past two agents
    assert b.pair("a", "x" * 11) == ("a", OTHER)  # a rule id built from input is cut off by length


def test_rego_pools_show_their_live_workers_once_started() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kernel.api.metrics import RegoPoolCollector
    from kernel.policy.resolver import LazyRegoEngine

    active, shadow = LazyRegoEngine(size=2, timeout=2.0), LazyRegoEngine(size=1)
    registry = CollectorRegistry()
    registry.register(RegoPoolCollector({"active": active, "shadow": shadow}))

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(generate_latest(registry).decode())
                for s in family.samples}

    assert not [k for k in samples() if k[0].startswith("regent_rego")]  # no Rego bundle yet: no pool, no rows
    try:
        engine = active.get()
        assert engine.wait_ready(10)
        m = samples()
        assert m[("regent_rego_workers", (("pool", "active"),))] == 2
        assert m[("regent_rego_workers_replaced_total", (("pool", "active"),))] == 0
        assert m[("regent_rego_faults_total", (("kind", "timeout"), ("pool", "active")))] == 0
        assert not [k for k in m if ("pool", "shadow") in k[1]]  # the shadows' pool never started
    finally:
        active.close()
