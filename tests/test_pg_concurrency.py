"""Two `regent serve` processes on one fresh PostgreSQL database, hammered concurrently for the
same execution under the same lease: the per-execution advisory lock must serialise them.

Checked in the database itself: no duplicate step rows (identity columns unique, identical calls
got distinct occurrences 0..N-1), events gapless from 1 with one `step.proposed` and exactly one
`step.succeeded` per step, and the occurrence counter equals the number of identical calls.

The lease comes from whichever claims the dispatch first: the kernels' dispatcher (delivered to
an in-test webhook receiver) or, when serve has no dispatcher yet, a direct claim through the
core on the shared database (PostgreSQL allows that; the claim is the same code path).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from kernel.core.dispatch import claim_one
from kernel.core.kernel import Kernel
from kernel.identity import args_hash
from kernel.store import open_store
from kernel.store.postgres import driver_url
from tests.conftest import scratch_pg_database
from tests.support import AgentClient
from tests.test_crash import (
    AGENT,
    SECRET,
    Delivery,
    KernelProcess,
    WebhookReceiver,
    bearer,
    create_execution,
    register_agent,
)

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

THREADS_PER_KERNEL = 4
ROUNDS = 6


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    """A database of its own (not the session one other tests truncate), dropped afterwards."""
    with scratch_pg_database("regent_conc") as url:
        yield url


def _lease(url: str, receiver: WebhookReceiver, execution_id: str) -> Delivery:
    """The execution's first lease: from the dispatcher's webhook, or claimed here if none comes."""
    got = receiver.wait_for(execution_id, timeout=1.0)
    if got is not None:
        return got
    store = open_store(url)
    try:
        with store.read() as tx:
            did = tx.conn.execute(text("SELECT id FROM dispatches WHERE execution_id = :e"),
                                  {"e": execution_id}).scalar_one()
        claim = claim_one(Kernel(store=store), did)
    finally:
        store.close()
    if claim is not None:
        return Delivery(claim.execution_id, claim.dispatch_id, claim.attempt)
    got = receiver.wait_for(execution_id, timeout=5.0)  # a dispatcher won the race: it delivers
    assert got is not None, "the dispatch was claimed but never delivered"
    return got


@pytest.mark.timeout(90)
def test_two_kernels_submitting_for_one_execution_write_no_duplicates(fresh_pg: str, tmp_path: Path) -> None:
    with WebhookReceiver(SECRET) as receiver:
        kernels: list[KernelProcess] = []
        try:
            for i in range(2):  # one after the other: each migrates on start-up
                kernels.append(KernelProcess(fresh_pg, tmp_path / f"kernel{i}.log").start())
            register_agent(kernels[0].url, receiver.url)
            with httpx.Client(base_url=kernels[1].url, timeout=10) as http:
                eid = create_execution(http, input={"two": "kernels"})
            lease = _lease(fresh_pg, receiver, eid)
            same, own = _hammer(kernels, lease)
            with httpx.Client(base_url=kernels[0].url, timeout=10) as http:
                agent = AgentClient(kernels[1].url, AGENT, SECRET).lease(lease.dispatch_id, lease.attempt)
                try:
                    r = agent.request("POST", f"/v0/executions/{eid}/complete", {"output": {"ok": True}})
                    assert r.status_code == 204, r.text
                finally:
                    agent.close()
                assert http.get(f"/v0/executions/{eid}", headers=bearer()).json()["status"] == "completed"
        finally:
            for k in kernels:
                k.stop()
    _check_database(fresh_pg, eid, lease, same | own)


def _hammer(kernels: list[KernelProcess], lease: Delivery) -> tuple[set[str], set[str]]:
    """8 threads, 4 per kernel, same lease: submit identical and distinct calls, then all race to
    complete every identical step. Returns the step ids handed out (identical, distinct)."""
    eid = lease.execution_id
    n = THREADS_PER_KERNEL * len(kernels)
    start, middle = threading.Barrier(n), threading.Barrier(n)
    same_ids: list[list[str]] = [[] for _ in range(n)]
    own_ids: list[list[str]] = [[] for _ in range(n)]
    recorded: Counter[str] = Counter()
    errors: list[str] = []
    lock = threading.Lock()

    signed_at = int(time.time())

    def worker(w: int) -> None:
        client = AgentClient(kernels[w % len(kernels)].url, AGENT, SECRET).lease(lease.dispatch_id, lease.attempt)
        try:
            start.wait(timeout=30)
            for i in range(ROUNDS):
                for target, args, sink in (("same", {"x": 1}, same_ids[w]), ("mine", {"w": w, "i": i}, own_ids[w])):
                    r = client.submit(eid, target, args)
                    if r.status_code != 200 or r.json().get("decision") != "proceed":
                        with lock:
                            errors.append(f"submit {target}: {r.status_code} {r.text}")
                        continue
                    sink.append(r.json()["step_id"])
            middle.wait(timeout=30)
            # Every thread races to complete every "same" step, plus its own steps.
            mine = [sid for ids in same_ids for sid in ids] + own_ids[w]
            random.Random(w).shuffle(mine)
            for sid in mine:
                # Each worker signs with a timestamp of its own: the same bytes from two workers
                # would be one request replayed, refused 401 (docs/api.md, Replayed requests).
                r = client.complete_step(eid, sid, {"sid": sid}, ts=signed_at - 10 * w)
                body = r.json() if r.status_code == 200 else {}
                if body.get("decision") == "recorded":
                    with lock:
                        recorded[sid] += 1
                elif body.get("decision") != "replay" or body.get("result") != {"sid": sid}:
                    with lock:
                        errors.append(f"complete {sid}: {r.status_code} {r.text}")
        except Exception as exc:  # surfaced below
            with lock:
                errors.append(f"worker {w}: {type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "a worker did not finish"
    assert not errors, errors[:5]

    all_same = [sid for ids in same_ids for sid in ids]
    all_own = [sid for ids in own_ids for sid in ids]
    assert len(all_same) == n * ROUNDS and len(set(all_same)) == n * ROUNDS, "identical calls shared a step id"
    assert len(set(all_own)) == n * ROUNDS
    assert set(recorded) == set(all_same) | set(all_own)
    assert all(c == 1 for c in recorded.values()), "a step outcome was recorded twice"
    return set(all_same), set(all_own)


def _check_database(url: str, eid: str, lease: Delivery, handed_out: set[str]) -> None:
    n_same = THREADS_PER_KERNEL * 2 * ROUNDS
    engine = create_engine(driver_url(url))
    try:
        with engine.connect() as c:
            steps = c.execute(text(
                "SELECT step_id, kind, target, args_hash, occurrence, status FROM steps WHERE execution_id = :e"
            ), {"e": eid}).all()
            events = c.execute(text(
                "SELECT event_seq, type, payload FROM events WHERE execution_id = :e ORDER BY event_seq"
            ), {"e": eid}).all()
            last_seq = c.execute(text("SELECT last_event_seq FROM executions WHERE id = :e"), {"e": eid}).scalar_one()
            consumed = c.execute(text(
                "SELECT consumed FROM dispatch_step_counters WHERE dispatch_id = :d AND kind = 'tool_call' "
                "AND target = 'same' AND args_hash = :h"
            ), {"d": lease.dispatch_id, "h": args_hash('{"x":1}')}).scalar_one()
    finally:
        engine.dispose()

    ids = [s.step_id for s in steps]
    assert len(ids) == len(set(ids)) == n_same * 2, "duplicate or missing step rows"
    assert set(ids) == handed_out
    identities = Counter((s.kind, s.target, s.args_hash, s.occurrence) for s in steps)
    assert max(identities.values()) == 1, "two rows share (execution, kind, target, args_hash, occurrence)"
    assert sorted(s.occurrence for s in steps if s.target == "same") == list(range(n_same))
    assert all(s.occurrence == 0 for s in steps if s.target == "mine")
    assert {s.status for s in steps} == {"succeeded"}
    assert consumed == n_same

    seqs = [e.event_seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)) and last_seq == len(seqs), "event seqs not gapless from 1"
    per_step: dict[str, Counter[str]] = {}
    for e in events:
        payload = json.loads(e.payload) if isinstance(e.payload, str) else e.payload
        if e.type.startswith("step."):
            per_step.setdefault(payload["step_id"], Counter())[e.type] += 1
    assert set(per_step) == set(ids)
    for sid, counts in per_step.items():
        assert counts == Counter({"step.proposed": 1, "step.allowed": 1, "step.executing": 1,
                                  "step.succeeded": 1}), (sid, counts)
    types = [e.type for e in events]
    assert types.count("execution.completed") == 1 and types[-1] == "execution.completed"
