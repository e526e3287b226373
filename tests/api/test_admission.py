"""Admission control on POST /v0/executions (issue 18 §0): past REGENT_MAX_BACKLOG undelivered
dispatches a create is 503 `overloaded` with Retry-After, and nothing is written; once deliveries
catch up creates are admitted again. Over real HTTP, on both stores."""

from __future__ import annotations

import httpx

from kernel.core.dispatch import claim_due
from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import ServerThread


def test_create_is_503_with_retry_after_past_the_backlog_bound(server: ServerThread, running: Running,
                                                              kernel: Kernel) -> None:
    kernel.max_backlog, kernel.backlog_ttl = 3, 0.0  # re-count on every create
    url = f"{server.url}/v0/executions"
    assert [httpx.post(url, json={"agent_id": "shell"}).status_code for _ in range(3)] == [201] * 3
    r = httpx.post(url, json={"agent_id": "shell"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["code"] == "overloaded" and "bound 3" in r.json()["message"]
    assert len(httpx.get(url).json()["executions"]) == 3
    assert len(claim_due(kernel, 10)) == 3  # delivered: the backlog is gone
    assert httpx.post(url, json={"agent_id": "shell"}).status_code == 201


def test_no_bound_when_max_backlog_is_zero(server: ServerThread, running: Running, kernel: Kernel) -> None:
    kernel.max_backlog = 0
    url = f"{server.url}/v0/executions"
    assert all(httpx.post(url, json={"agent_id": "shell"}).status_code == 201 for _ in range(5))
