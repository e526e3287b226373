"""Forks over real HTTP, on both stores: a fork with its own bundle needs `policies:write` besides
`executions:write` (docs/api.md, "Forks"); the fork-points answer as documented."""

from __future__ import annotations

import httpx

from kernel.core.api_keys import create_key
from kernel.core.kernel import Kernel
from kernel.policy.resolver import BundleResolver
from tests.conftest import Running
from tests.support import ServerThread


def test_a_fork_with_its_own_bundle_needs_policies_write(server: ServerThread, running: Running,
                                                          kernel: Kernel) -> None:
    kernel.policy = BundleResolver(kernel.store)  # the load gate compiles the fork's bundle
    eid, _, _ = running.start()
    _, writer = create_key(kernel, "forker", ["executions:write"], created_by="test")
    _, admin = create_key(kernel, "admin", ["executions:write", "policies:write"], created_by="test")
    url = f"{server.url}/v0/executions/{eid}/fork"
    bundle = {"at_seq": 1, "policy_bundle": "default_action: deny\n"}
    r = httpx.post(url, json=bundle, headers={"Authorization": f"Bearer {writer}"})
    assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    assert httpx.post(url, json={"at_seq": 1}, headers={"Authorization": f"Bearer {writer}"}).status_code == 201
    assert httpx.post(url, json=bundle, headers={"Authorization": f"Bearer {admin}"}).status_code == 201


def test_fork_points_start_at_zero_and_follow_each_step_outcome(server: ServerThread, running: Running,
                                                                 kernel: Kernel) -> None:
    from tests.support import AgentClient

    eid, did, att = running.start()
    agent = AgentClient(server.url, running.agent_id, running.secret).lease(did, att)
    try:
        sid = agent.submit(eid, "t", {}).json()["step_id"]
        assert agent.complete_step(eid, sid, 1).status_code == 200
    finally:
        agent.close()
    points = httpx.get(f"{server.url}/v0/executions/{eid}/fork-points").json()
    first = points[0]
    assert (first["event_seq"], first["steps"], first["covered"]) == (0, 0, True)
    [after] = points[1:]
    assert (after["type"], after["step_id"], after["target"], after["steps"]) == ("step.succeeded", sid, "t", 1)
    assert httpx.get(f"{server.url}/v0/executions/00000000-0000-7000-8000-000000000000/fork-points").status_code == 404
