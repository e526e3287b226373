"""Two `regent serve` replicas on one PostgreSQL database share the dispatch queue: every
execution is delivered once and completes once, and no dispatch goes to both replicas."""

from __future__ import annotations

import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernel.store import open_store
from tests.conftest import _truncate
from tests.e2e.conftest import SECRET, AgentProc, Api, KernelProc, wait_for
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

EXECUTIONS = 200
TOKEN = "e2e-bootstrap-token"


def test_two_replicas_deliver_every_execution_exactly_once(pg_database: str, tmp_path: Path) -> None:
    store = open_store(pg_database)
    _truncate(store)  # the session database is shared with the store contract tests
    store.close()
    agent_port = free_port()
    manifest = tmp_path / "regent.yaml"
    manifest.write_text(
        f"agents:\n  - id: bulk\n    webhook_url: http://127.0.0.1:{agent_port}/webhook\n    secret: {SECRET}\n")
    env = {"REGENT_BEARER_TOKEN": TOKEN, "REGENT_DISPATCH_POLL_INTERVAL": "100ms", "REGENT_LOG_LEVEL": "warning"}
    replicas = [
        KernelProc("serve", free_port(), pg_database, manifest, tmp_path / f"{name}.out", REGENT_REPLICA_ID=name, **env)
        for name in ("r1", "r2")
    ]
    agent = AgentProc(replicas[0].url, "bulk", agent_port, tmp_path, MODE="bulk")
    apis = [Api(r.url, TOKEN) for r in replicas]
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:  # clients spread over both replicas
            ids = list(pool.map(lambda i: apis[i % 2].create("bulk", {"i": i}), range(EXECUTIONS)))

        def all_done() -> bool:
            r = apis[0].http.get("/v0/executions", params={"agent_id": "bulk", "status": "completed", "limit": 200})
            return len(r.json()["executions"]) == EXECUTIONS

        wait_for(all_done, f"{EXECUTIONS} executions to complete", timeout=60, every=0.25)
        elapsed = time.monotonic() - started

        # every tool body ran once per execution
        effects = Counter(line.split()[0] for line in agent.effect_lines())
        assert set(effects) == set(ids) and set(effects.values()) == {1}
        # every (dispatch, attempt) reached the agent once, from one replica
        webhooks = agent.log_lines("webhook")
        deliveries = Counter((w["body"]["dispatch_id"], w["body"]["dispatch_attempt"]) for w in webhooks)
        assert len(deliveries) == EXECUTIONS and set(deliveries.values()) == {1}
        assert {w["body"]["execution_id"] for w in webhooks} == set(ids)
        by_replica = Counter(w["user_agent"].split("(")[-1].rstrip(")") for w in webhooks)
        assert set(by_replica) == {"r1", "r2"}, by_replica
        # and the log of each execution shows one ack and one completion
        with ThreadPoolExecutor(8) as pool:
            logs = list(pool.map(apis[1].types, ids))
        assert all(t.count("dispatch.acked") == 1 and t.count("execution.completed") == 1 for t in logs)
        assert not any("dispatch.failed" in t for t in logs)
        print(f"\n{EXECUTIONS} executions on 2 replicas in {elapsed:.1f}s; deliveries per replica {dict(by_replica)}")
    finally:
        for api in apis:
            api.close()
        agent.stop(signal.SIGTERM)
        for r in replicas:
            r.stop_gracefully()
