"""Crash consistency: `kill -9` a real `regent serve` on a SQLite file mid-load, restart it on the
same file, and check that nothing acknowledged was lost and the log is still well formed.

The agent side is simulated in the test: a tiny webhook receiver records each delivery (dispatch
id, attempt), and loader threads work those leases over HTTP (submit, complete step, complete
execution), remembering every write the kernel acknowledged. After the restart (and a short
second round of work, which replays the redelivered executions) we assert:

* every execution's event seqs are gapless from 1;
* every step has at most one terminal event (`step.succeeded|failed|denied|cancelled`);
* every step outcome and execution completion acknowledged before the crash is still there,
  with the same result, and a replay of the step answers that same result.

Leases only come from the kernel's dispatcher (one process per SQLite file, so the test cannot
claim through the core beside the server). When `regent serve` delivers nothing, dispatch is
broken: the test fails under REGENT_REQUIRE_SERVICES=1 (CI) and skips, saying so, elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import AgentClient, free_port

TOKEN = "crash-test-token"
AGENT = "crash-agent"
SECRET = "crash-secret"
TERMINAL_STEP_EVENTS = frozenset({"step.succeeded", "step.failed", "step.denied", "step.cancelled"})
NO_DELIVERY = (
    "regent serve delivered no webhook within {wait:.0f} s of creating an execution: its dispatcher "
    "is broken or stalled (see the kernel log below), and with one kernel process per SQLite file "
    "nothing else can claim a lease"
)
# How long the first webhook may take: a kernel that has just started on a loaded machine.
FIRST_DELIVERY_SECONDS = 15.0


# -- helpers shared with test_pg_concurrency ------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    execution_id: str
    dispatch_id: str
    attempt: int


class WebhookReceiver:
    """Accepts the kernel's webhook (rebuno-v0 §6.3), checks its signature, queues the lease."""

    def __init__(self, secret: str):
        self.secret = secret
        self.deliveries: queue.Queue[Delivery] = queue.Queue()
        self.seen: list[Delivery] = []
        self.bad_signatures = 0
        self.cut_short = 0  # requests the kill cut off mid-body: not a signature the kernel made
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                declared = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(declared)
                if len(body) < declared:
                    receiver.cut_short += 1
                    return
                want = "sha256=" + hmac.new(receiver.secret.encode(), body, hashlib.sha256).hexdigest()
                if not hmac.compare_digest(self.headers.get("Rebuno-Signature", ""), want):
                    receiver.bad_signatures += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                msg = json.loads(body)
                d = Delivery(msg["execution_id"], msg["dispatch_id"], int(msg["dispatch_attempt"]))
                receiver.seen.append(d)
                receiver.deliveries.put(d)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/webhook"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def wait_for(self, execution_id: str, timeout: float) -> Delivery | None:
        """The next delivery for this execution (others are put back for the loaders)."""
        deadline = time.monotonic() + timeout
        others: list[Delivery] = []
        try:
            while time.monotonic() < deadline:
                try:
                    d = self.deliveries.get(timeout=0.05)
                except queue.Empty:
                    continue
                if d.execution_id == execution_id:
                    return d
                others.append(d)
            return None
        finally:
            for d in others:
                self.deliveries.put(d)


def kernel_argv(db_url: str, port: int) -> list[str]:
    return [sys.executable, "-m", "kernel", "serve", "--db-url", db_url, "--host", "127.0.0.1",
            "--port", str(port)]


class KernelProcess:
    """`regent serve` (as `python -m kernel serve`) in a subprocess on a free loopback port."""

    def __init__(self, db_url: str, log: Path, extra_env: dict[str, str] | None = None):
        self.db_url = db_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {
            **os.environ,
            "REGENT_BEARER_TOKEN": TOKEN,
            "REGENT_DB_URL": db_url,
            "REGENT_LOG_LEVEL": "warning",
            "REGENT_DISPATCH_POLL_INTERVAL": "0.05",
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> KernelProcess:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(kernel_argv(self.db_url, self.port), env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=Path(__file__).resolve().parent.parent)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"regent serve exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/v0/health", timeout=0.5).status_code == 200:
                    return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"regent serve did not become healthy in {timeout} s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"


def bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def register_agent(base_url: str, webhook_url: str, agent_id: str = AGENT, secret: str = SECRET) -> None:
    r = httpx.post(base_url + "/v0/agents", headers=bearer(), timeout=10,
                   json={"id": agent_id, "webhook_url": webhook_url, "secret": secret})
    assert r.status_code in (200, 201), r.text


def create_execution(http: httpx.Client, agent_id: str = AGENT, input: Any = None) -> str:
    r = http.post("/v0/executions", headers=bearer(), json={"agent_id": agent_id, "input": input})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def all_events(http: httpx.Client, execution_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(100):  # bounded paging
        page = http.get(f"/v0/executions/{execution_id}/events",
                        params={"after_seq": out[-1]["event_seq"] if out else 0, "limit": 1000},
                        headers=bearer()).json() or []
        if not page:
            break
        out.extend(page)
    return out


# -- the loader -------------------------------------------------------------------------------------

STEPS_PER_EXECUTION = 4


def expected_result(execution_id: str, j: int) -> dict[str, Any]:
    return {"j": j, "of": execution_id}


@dataclass
class Ledger:
    """What the kernel acknowledged to the loader (only 2xx answers count)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # step_id -> (eid, result)
    completed: set[str] = field(default_factory=set)
    ops: int = 0
    replays: int = 0
    mismatched_replays: list[str] = field(default_factory=list)

    def step(self, eid: str, sid: str, result: dict[str, Any]) -> None:
        with self.lock:
            self.steps[sid] = (eid, result)
            self.ops += 1


def work(client: AgentClient, d: Delivery, ledger: Ledger, stop: threading.Event) -> None:
    """Run one delivery the way an SDK agent does; return quietly when the lease is lost."""
    client.lease(d.dispatch_id, d.attempt)
    eid = d.execution_id
    for j in range(STEPS_PER_EXECUTION):
        if stop.is_set():
            return
        r = client.submit(eid, "tool", {"j": j})
        if r.status_code != 200:
            return  # 409 lease_superseded: a newer attempt owns the execution
        ans = r.json()
        if ans["decision"] == "execution_terminal":
            return
        sid = ans["step_id"]
        if ans["decision"] == "replay":
            with ledger.lock:
                ledger.replays += 1
                if ans.get("result") != expected_result(eid, j):
                    ledger.mismatched_replays.append(sid)
            continue
        assert ans["decision"] == "proceed", ans
        c = client.complete_step(eid, sid, expected_result(eid, j))
        if c.status_code != 200:
            return
        body = c.json()
        if body["decision"] in ("recorded", "replay"):
            if body["decision"] == "replay" and body.get("result") != expected_result(eid, j):
                with ledger.lock:
                    ledger.mismatched_replays.append(sid)
            ledger.step(eid, sid, expected_result(eid, j))
    r = client.request("POST", f"/v0/executions/{eid}/complete", {"output": {"done": eid}})
    if r.status_code == 204:
        with ledger.lock:
            ledger.completed.add(eid)


def run_loaders(base_url: str, receiver: WebhookReceiver, ledger: Ledger, stop: threading.Event,
                workers: int = 4) -> list[threading.Thread]:
    def loop() -> None:
        client = AgentClient(base_url, AGENT, SECRET)
        client.http.timeout = httpx.Timeout(5.0)
        try:
            for _ in range(10_000):  # bounded
                if stop.is_set():
                    return
                try:
                    d = receiver.deliveries.get(timeout=0.05)
                except queue.Empty:
                    continue
                try:
                    work(client, d, ledger, stop)
                except httpx.HTTPError:
                    if stop.is_set():
                        return
                    time.sleep(0.05)  # the kernel is down (or restarting): the delivery is dropped
        finally:
            client.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(workers)]
    for th in threads:
        th.start()
    return threads


def join(threads: list[threading.Thread], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for th in threads:
        th.join(timeout=max(deadline - time.monotonic(), 0.1))
    assert not any(th.is_alive() for th in threads), "a loader thread did not stop"


@contextlib.contextmanager
def running_kernel(kp: KernelProcess) -> Iterator[KernelProcess]:
    kp.start()
    try:
        yield kp
    finally:
        kp.stop()


# -- the test ------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_kill_9_mid_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path}/crash.db"
    log = tmp_path / "kernel.log"
    # Short leases so that executions in flight at the crash are redelivered soon after the restart.
    env = {"REGENT_DISPATCH_LEASE_TIMEOUT": "1.5"}
    ledger = Ledger()
    created: list[str] = []

    with WebhookReceiver(SECRET) as receiver:
        first = KernelProcess(db_url, log, env).start()
        try:
            register_agent(first.url, receiver.url)
            with httpx.Client(base_url=first.url, timeout=5) as http:
                probe = create_execution(http)
                created.append(probe)
                got = receiver.wait_for(probe, timeout=FIRST_DELIVERY_SECONDS)
                if got is None:
                    why = NO_DELIVERY.format(wait=FIRST_DELIVERY_SECONDS) + f":\n{first.tail()}"
                    if os.environ.get("REGENT_REQUIRE_SERVICES") == "1":
                        pytest.fail(why + "\n— a failure because REGENT_REQUIRE_SERVICES=1")
                    pytest.skip(why)
                receiver.deliveries.put(got)

                # Load: 4 loader threads work the leases while this thread keeps creating executions.
                stop = threading.Event()
                threads = run_loaders(first.url, receiver, ledger, stop)
                t_end = time.monotonic() + 2.5
                while time.monotonic() < t_end and len(created) < 300:
                    created.append(create_execution(http, input={"n": len(created)}))
                    time.sleep(0.01)
            first.kill()  # mid-load: the loaders are still submitting
            stop.set()
            join(threads)
        finally:
            first.kill()

        before = Ledger(steps=dict(ledger.steps), completed=set(ledger.completed), ops=ledger.ops)
        assert before.ops > 0, f"the loader got no work acknowledged before the crash:\n{first.tail()}"

        # Restart on the same file; the redelivered executions replay what was recorded.
        with running_kernel(KernelProcess(db_url, log, env)) as second:
            stop2 = threading.Event()
            threads = run_loaders(second.url, receiver, ledger, stop2)
            time.sleep(4.0)  # > lease (1.5 s) + reaper period: in-flight rows come back
            stop2.set()
            join(threads)

            with httpx.Client(base_url=second.url, timeout=10) as http:
                _check(http, created, before, ledger, second)
        assert receiver.bad_signatures == 0


def _check(http: httpx.Client, created: list[str], before: Ledger, after: Ledger, kp: KernelProcess) -> None:
    listed: list[str] = []
    cursor = None
    for _ in range(100):  # bounded paging
        page = http.get("/v0/executions", params={"limit": 200, **({"cursor": cursor} if cursor else {})},
                        headers=bearer()).json()
        listed.extend(e["id"] for e in page["executions"] or [])
        cursor = page.get("next_cursor")
        if not cursor:
            break
    # Every execution whose creation was acknowledged survived the crash.
    assert set(created) <= set(listed), f"acknowledged executions vanished:\n{kp.tail()}"

    step_events: dict[str, list[str]] = {}
    completed_events: Counter[str] = Counter()
    for eid in listed:
        events = all_events(http, eid)
        seqs = [e["event_seq"] for e in events]
        assert seqs == list(range(1, len(seqs) + 1)), f"{eid}: event seqs not gapless from 1: {seqs}"
        assert [e["type"] for e in events[:3]] == ["execution.created", "execution.started", "dispatch.queued"]
        for e in events:
            if e["type"].startswith("step."):
                step_events.setdefault(e["payload"]["step_id"], []).append(e["type"])
            if e["type"] == "execution.completed":
                completed_events[eid] += 1
        steps = http.get(f"/v0/executions/{eid}/steps", headers=bearer()).json() or []
        ids = [s["step_id"] for s in steps]
        assert len(ids) == len(set(ids)), f"{eid}: duplicate step rows"
        occ = Counter((s["kind"], s["target"], s["args_hash"], s["occurrence"]) for s in steps)
        assert max(occ.values(), default=1) == 1, f"{eid}: two steps share an identity"

    for sid, types in step_events.items():
        terminal = [t for t in types if t in TERMINAL_STEP_EVENTS]
        assert len(terminal) <= 1, f"step {sid} has {len(terminal)} terminal events: {types}"

    # Nothing recorded terminal before the crash reverted.
    for sid, (eid, result) in before.steps.items():
        s = http.get(f"/v0/executions/{eid}/steps/{sid}", headers=bearer())
        assert s.status_code == 200, f"acknowledged step {sid} vanished"
        assert s.json()["status"] == "succeeded" and s.json()["result"] == result, s.json()
        assert step_events.get(sid, []).count("step.succeeded") == 1, step_events.get(sid)
    for eid in before.completed:
        e = http.get(f"/v0/executions/{eid}", headers=bearer()).json()
        assert e["status"] == "completed" and e["output"] == {"done": eid}, e
        assert completed_events[eid] == 1
    # ... and what the second round acknowledged is there too.
    for sid, (eid, result) in after.steps.items():
        assert http.get(f"/v0/executions/{eid}/steps/{sid}", headers=bearer()).json()["result"] == result
    assert not after.mismatched_replays, f"replays answered another result: {after.mismatched_replays}"
