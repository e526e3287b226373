"""Session admission across two `regent serve` replicas on one PostgreSQL, with the official SDK
as the client and two official-SDK chat agents (tests/e2e/session_agent.py) on loopback, each
talking to its own replica (so executions end, and the next is admitted, on both): 50 executions
of one session, created at once through both replicas for both agents, run one at a time,
admitted in creation order, and each turn sees the state of its agent's turns before it."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import rebuno

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import SECRET, AgentProc, Api, KernelProc, wait_for
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(300)]

AGENT = Path(__file__).with_name("session_agent.py")
TOKEN = "e2e-bootstrap-token"
TURNS = 50
SESSION = "shared-chat"


AGENTS = ("chat-a", "chat-b")


def _create_all(url: str, replica: str, n: int) -> list[tuple[str, str, str]]:
    async def run() -> list[tuple[str, str, str]]:
        async with rebuno.Client(base_url=url, api_key=TOKEN) as client:
            out = []
            for i in range(n):
                msg, agent_id = f"{replica}-{i}", AGENTS[i % 2]
                e = await client.create(agent_id, msg, session=SESSION)
                assert e.session == SESSION and e.status in ("pending", "running")
                out.append((e.id, agent_id, msg))
            return out

    return asyncio.run(run())


def test_two_replicas_admit_fifty_queued_turns_of_one_session_one_at_a_time_in_order(tmp_path: Path) -> None:
    with scratch_pg_database("regent_sess_e2e") as db:
        ports = {a: free_port() for a in AGENTS}
        manifest = tmp_path / "regent.yaml"
        manifest.write_text("agents:\n" + "".join(
            f"  - id: {a}\n    webhook_url: http://127.0.0.1:{p}/webhook\n    secret: {SECRET}\n"
            for a, p in ports.items()))
        env = {"REGENT_BEARER_TOKEN": TOKEN, "REGENT_DISPATCH_POLL_INTERVAL": "50ms", "REGENT_LOG_LEVEL": "warning"}
        replicas = [KernelProc("serve", free_port(), db, manifest, tmp_path / f"{name}.out", REGENT_REPLICA_ID=name,
                               **env) for name in ("r1", "r2")]
        agents = [AgentProc(r.url, a, ports[a], tmp_path, script=AGENT, MODE="chat")
                  for r, a in zip(replicas, AGENTS, strict=True)]
        apis = [Api(r.url, TOKEN) for r in replicas]
        live_seen: list[int] = []
        stop = threading.Event()

        def watch() -> None:  # the session's running or blocked executions, sampled on both replicas
            i = 0
            while not stop.is_set():
                rows = apis[i % 2].http.get("/v0/executions", params={"session": SESSION, "limit": 200}).json()
                live_seen.append(sum(e["status"] in ("running", "blocked") for e in rows["executions"]))
                i += 1

        watcher = threading.Thread(target=watch, daemon=True)
        try:
            watcher.start()
            results: dict[str, list[tuple[str, str, str]]] = {}
            creators = [threading.Thread(target=lambda r=r, name=name: results.__setitem__(
                name, _create_all(r.url, name, TURNS // 2))) for r, name in zip(replicas, ("r1", "r2"), strict=True)]
            for th in creators:
                th.start()
            for th in creators:
                th.join(120)
            created = results["r1"] + results["r2"]
            assert len(created) == TURNS

            def all_done() -> list[dict[str, Any]] | None:
                rows = apis[1].http.get("/v0/executions", params={"session": SESSION, "limit": 200}).json()
                done = [e for e in rows["executions"] if e["status"] == "completed"]
                return rows["executions"] if len(done) == TURNS else None

            rows = wait_for(all_done, f"{TURNS} turns to complete", timeout=180, every=0.25)
            stop.set()
            watcher.join(10)

            agent_of = {eid: a for eid, a, _ in created}
            message = {eid: m for eid, _, m in created}
            order = sorted(message)  # UUIDv7 ids: creation order, the order of admission
            by_id = {e["id"]: e for e in rows}
            for i, eid in enumerate(order):
                # Each turn saw the state of exactly its agent's turns before it, in order.
                mine = [x for x in order[:i] if agent_of[x] == agent_of[eid]]
                assert by_id[eid]["output"] == {"turn": len(mine) + 1, "seen": [message[x] for x in mine]}, i
                assert by_id[eid].get("previous_execution_id") == (mine[-1] if mine else None)
            events = {eid: apis[i % 2].events(eid) for i, eid in enumerate(order)}
            started = [next(e["occurred_at"] for e in events[x] if e["type"] == "execution.started") for x in order]
            ended = [next(e["occurred_at"] for e in events[x] if e["type"] == "execution.completed") for x in order]
            assert all(started[i] >= ended[i - 1] for i in range(1, TURNS))
            assert live_seen and max(live_seen) == 1, f"{len(live_seen)} samples, max {max(live_seen)}"
            # (chat-a completes through r1 and chat-b through r2, so ends, and the admissions that follow
            # them, happened on both replicas, while creates went through both.)
            print(f"\n{TURNS} turns over 2 replicas; {len(live_seen)} samples of the session, never two live")
        finally:
            stop.set()
            for api in apis:
                api.close()
            for agent in agents:
                agent.stop(signal.SIGTERM)
            for r in replicas:
                r.stop_gracefully()
