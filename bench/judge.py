"""The `judge` scenario: plain steps' latency on other executions while one execution's judge call
takes 2 s, against the same without it, in interleaved rounds of one run.

It runs its own servers, after the shared targets have stopped: the test judge process
(tests/judge/judge_server.py, answering after a 2 s delay) and `regent serve` on a temp SQLite file
with REGENT_JUDGE_PROVIDER pointing at it. A judge call holds no transaction and no lane thread, so
the goal is plain-step p99 with the judge busy ≤ 1.2× without.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench import fixtures
from bench.client import Agent, BenchError, Lease, Run, drive, percentile, round_trip, submit_body
from bench.scenarios import LocalScenario, Profile, Result
from bench.servers import ROOT, free_port, serve_kernel

JUDGE_DELAY = 2.0
JUDGED_TARGET = "bench.judged"
BUNDLE = f"""\
default_action: allow
rules:
  - id: ask-model
    when: {{target: {JUDGED_TARGET}}}
    then: {{decision: judge, judge: {{fallback: deny}}}}
"""
PROVIDER = """\
url: {url}/judge
body: '{{"tool_call": {{{{json .ToolCall}}}}}}'
probabilities: answers.decision.probabilities
"""


@contextlib.contextmanager
def _judge_server(delay: float) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "judge" / "judge_server.py"), str(port)],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.post(f"{url}/control", json={"mode": "ok", "probabilities": {"allow": 0.99}, "delay": delay},
                           timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise BenchError("the judge server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _prepare(db_url: str, workers: int) -> tuple[fixtures.AgentCreds, list[Lease], Lease]:
    from kernel.core.kernel import Kernel
    from kernel.core.policies import store_policy
    from kernel.policy.resolver import BundleResolver
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    try:
        migrate(store)
        k = Kernel(store=store, policy=BundleResolver(store))
        agent = fixtures.new_agent(k)
        store_policy(k, agent.agent_id, "yaml", BUNDLE)
        plain = fixtures.start_executions(k, agent, workers, "judge-bench-plain")
        [judged] = fixtures.start_executions(k, agent, 1, "judge-bench-judged")
    finally:
        store.close()
    return agent, plain, judged


def _judge_loop(url: str, agent: fixtures.AgentCreds, lease: Lease, stop: threading.Event, calls: list[float]) -> None:
    """One execution asking the judge back to back (each submit is a new step: 2 s each)."""
    a = Agent(url, agent.agent_id, agent.secret)
    try:
        n = 0
        while not stop.is_set():
            t = time.perf_counter()
            ans = a.post(f"/v0/executions/{lease.execution_id}/steps",
                         submit_body({"n": f"{n:010d}"}, JUDGED_TARGET), lease)
            if ans.get("decision") != "proceed":
                raise BenchError(f"judged submit answered {ans!r}, expected proceed")
            calls.append(time.perf_counter() - t)
            n += 1
    finally:
        a.close()


def _run(p: Profile) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="regent-bench-judge-"))
    try:
        with _judge_server(JUDGE_DELAY) as judge_url:
            provider = tmp / "judge.yaml"
            provider.write_text(PROVIDER.format(url=judge_url))
            db = f"sqlite:///{tmp}/judge-bench.db"
            agent, plain, judged = _prepare(db, p.concurrency)
            env = {"REGENT_JUDGE_PROVIDER": str(provider), "REGENT_JUDGE_TIMEOUT": "30s"}
            with serve_kernel("sqlite-judge", db, tmp, extra_env=env) as srv:
                srv.wait_ready()
                runs: dict[bool, list[Run]] = {False: [], True: []}
                calls: list[float] = []
                rounds = max(2, p.rounds) * 2
                seconds = max(p.conc_seconds / p.rounds, 2 * JUDGE_DELAY)
                for i in range(rounds):
                    busy = i % 2 == 1
                    stop = threading.Event()
                    th = None
                    if busy:
                        th = threading.Thread(target=_judge_loop, args=(srv.url, agent, judged, stop, calls),
                                              daemon=True)
                        th.start()
                        time.sleep(0.2)  # let the first judge call be in flight
                    base = (i + 1) * 10_000_000

                    def op_for(lease: Lease, base: int = base) -> object:
                        return lambda a, n: round_trip(a, lease, base + n)

                    make = lambda: Agent(srv.url, agent.agent_id, agent.secret)  # noqa: E731
                    runs[busy].append(drive(make, [op_for(lease) for lease in plain],  # type: ignore[misc]
                                            duration=seconds, max_ops=p.conc_max_ops, warmup_ops=p.warmup_ops,
                                            warmup_seconds=p.warmup_seconds, server_pid=srv.pid))
                    stop.set()
                    if th is not None:
                        th.join(timeout=JUDGE_DELAY * 3 + 30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    quiet, busy_run = Run.merge(runs[False]), Run.merge(runs[True])
    q99 = percentile(sorted(quiet.latencies), 0.99)
    b99 = percentile(sorted(busy_run.latencies), 0.99)
    name = "judge: plain round trips on other executions"
    judged_p50 = percentile(sorted(calls), 0.5) if calls else float("nan")
    return [
        Result(name, "sqlite, no judge call", quiet),
        Result(name, f"sqlite, one judge call in flight ({JUDGE_DELAY:g} s)", busy_run, figures=[
            ("judge: plain p99 with a 2 s judge in flight / without", f"{b99 / q99:.2f}×", "≤ 1.2×"),
            ("judge: the judged submit's own latency (p50)", f"{judged_p50:.2f} s", f"≈ {JUDGE_DELAY:g} s"),
        ]),
    ]


JUDGE = LocalScenario("judge", "judge", _run,
                      "plain steps' p99 while another execution's judge takes 2 s, vs without (own servers)")
