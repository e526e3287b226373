"""Resources and checkpoints end to end, on SQLite and PostgreSQL: a real `regent dev`, an
official-SDK agent with a directory resource (tests/e2e/resource_agent.py) on loopback, the
official SDK `Client` creating and forking the executions. A fork restored from the checkpoint
that covers its fork point ends with each step's effect on the resource exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rebuno

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import DevKernel, dev_kernel_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

AGENT = Path(__file__).with_name("resource_agent.py")


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevKernel]:
    tmp = tmp_path_factory.mktemp(f"resources-{request.param}")
    box_root = tmp / "boxes"
    box_root.mkdir()
    if request.param == "sqlite":
        with dev_kernel_for(("box",), tmp) as k:
            k.agent("box", script=AGENT, BOX_ROOT=str(box_root))
            yield k
        return
    with scratch_pg_database("regent_res", migrated=False) as url, dev_kernel_for(("box",), tmp, db_url=url) as k:
        k.agent("box", script=AGENT, BOX_ROOT=str(box_root))
        yield k


def _sdk(k: DevKernel, fn: Any) -> Any:
    async def run() -> Any:
        async with rebuno.Client(base_url=k.url) as client:
            return await fn(client)

    return asyncio.run(run())


def _ran(k: DevKernel, eid: str) -> list[str]:
    return [line.split()[1] for line in k.agents[0].effect_lines() if line.startswith(eid)]


def test_a_resource_is_registered_bound_and_checkpointed_after_every_step(kernel: DevKernel) -> None:
    src = _sdk(kernel, lambda client: client.create("box", {"steps": 3}))
    done = kernel.api.wait_status(src.id, "completed", timeout=60)
    assert done["output"] == {"log": ["step-0", "step-1", "step-2"]}
    [box] = kernel.api.http.get(f"/v0/executions/{src.id}/resources").json()
    assert (box["key"], box["generation"], box["covered"], box["every_steps"]) == ("box", 3, True, 1)
    assert "binding" not in box  # a client read never sees how to reopen it
    types = [t for t in kernel.api.types(src.id) if t.startswith("resource.")]
    # registered, bound, the first capture at registration, then one with each step's outcome
    assert types == ["resource.registered", "resource.bound"] + ["resource.checkpointed"] * 4
    checkpointed = [e["payload"] for e in kernel.api.events(src.id) if e["type"] == "resource.checkpointed"]
    assert [p["generation"] for p in checkpointed] == [0, 1, 2, 3]
    points = kernel.api.http.get(f"/v0/executions/{src.id}/fork-points").json()
    assert [p["covered"] for p in points] == [True] * 4
    assert [p.get("resources") for p in points] == [None] + [{"box": True}] * 3


def test_a_fork_restores_the_resource_from_the_checkpoint_covering_its_fork_point(kernel: DevKernel) -> None:
    src = _sdk(kernel, lambda client: client.create("box", {"steps": 4}))
    kernel.api.wait_status(src.id, "completed", timeout=60)
    points = kernel.api.http.get(f"/v0/executions/{src.id}/fork-points").json()
    at = points[2]["event_seq"]  # after step-1's outcome (and its capture)
    checkpointed = [e["payload"] for e in kernel.api.events(src.id) if e["type"] == "resource.checkpointed"]

    fork = _sdk(kernel, lambda client: client.fork(src.id, at_seq=at))
    assert fork.restoration == {"box": {"covered": True, "checkpoint_ref": checkpointed[2]["checkpoint_ref"],
                                        "generation": 2}}
    out = kernel.api.wait_status(fork.id, "completed", timeout=60)
    # Restored with step-0 and step-1 in it; only step-2 and step-3 ran again, once each.
    assert out["output"] == {"log": ["step-0", "step-1", "step-2", "step-3"]}
    assert _ran(kernel, fork.id) == ["step-2", "step-3"]
    assert kernel.api.get(fork.id)["restoration"] == fork.restoration
    [box] = kernel.api.http.get(f"/v0/executions/{fork.id}/resources").json()
    assert (box["generation"], box["covered"]) == (4, True)


def test_a_fork_inside_a_step_that_changed_the_resource_is_reported_not_covered(kernel: DevKernel) -> None:
    src = _sdk(kernel, lambda client: client.create("box", {"steps": 3}))
    kernel.api.wait_status(src.id, "completed", timeout=60)
    events = kernel.api.events(src.id)
    # step-1 executing: its body is changing the box, and no checkpoint covers that state.
    at = next(e["event_seq"] for e in events if e["type"] == "step.executing" and e["payload"]["target"] == "step-1")
    fork = _sdk(kernel, lambda client: client.fork(src.id, at_seq=at))
    assert fork.restoration == {"box": {"covered": False}}
    out = kernel.api.wait_status(fork.id, "completed", timeout=60)
    # Not restored: a fresh box, step-0 replayed (its line is not in it), step-1 on ran live.
    assert out["output"] == {"log": ["step-1", "step-2"]}
    assert _ran(kernel, fork.id) == ["step-1", "step-2"]


def test_resource_routes_refuse_bad_input_with_the_error_envelope(kernel: DevKernel) -> None:
    from tests.e2e.conftest import SECRET
    from tests.support import AgentClient

    src = _sdk(kernel, lambda client: client.create("box", {"steps": 1}))
    kernel.api.wait_status(src.id, "completed", timeout=60)
    agent = AgentClient(kernel.url, "box", SECRET)
    for path, body in ((f"/v0/executions/{src.id}/resources", {"key": "box"}),
                       (f"/v0/executions/{src.id}/resources/checkpoints", {"captures": [{"key": "box"}]}),
                       (f"/v0/executions/{src.id}/resources", {"key": "box", "driver_id": "d", "every_steps": -1})):
        r = agent.request("POST", path, body, lease=False)
        assert r.status_code == 400 and r.json()["code"] == "validation_error", r.text
    # A well-formed call on a finished execution: the lease it names is not live.
    r = agent.lease("0190d1a4-0000-7000-8000-000000000000", 1).request(
        "POST", f"/v0/executions/{src.id}/resources", {"key": "box", "driver_id": "dir"})
    assert r.status_code == 409, r.text


def test_a_session_turn_reopens_the_box_its_previous_turn_bound(kernel: DevKernel) -> None:
    async def turns(client: rebuno.Client) -> list[rebuno.Execution]:
        return [await client.create("box", {"steps": n}, session="box-chat") for n in (2, 1)]

    first, second = _sdk(kernel, turns)
    assert kernel.api.wait_status(first.id, "completed", timeout=60)["output"] == {"log": ["step-0", "step-1"]}
    # The same directory, reopened from the inherited binding: the second turn's line follows the first's.
    out = kernel.api.wait_status(second.id, "completed", timeout=60)
    assert out["output"] == {"log": ["step-0", "step-1", "step-0"]}
    [box] = kernel.api.http.get(f"/v0/executions/{second.id}/resources").json()
    assert (box["generation"], box["covered"]) == (1, True)  # its own generations and captures
    types = [t for t in kernel.api.types(second.id) if t.startswith("resource.")]
    assert types[0] == "resource.registered" and "resource.bound" not in types
