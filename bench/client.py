"""The load generator: one signing HTTP/1.1 client per worker thread, the same for every target.

Every request the bench sends goes through `Agent.post`, so the bare ceiling, SQLite and
PostgreSQL receive byte-identical request shapes (same headers, same body sizes) from the same
client code at the same concurrency. Loops are bounded in count and in time.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class BenchError(Exception):
    """A target answered something the scenario did not expect (a bench bug or a kernel bug)."""


@dataclass(frozen=True)
class Lease:
    execution_id: str
    dispatch_id: str
    attempt: int


def sign(secret: str, method: str, target: str, ts: str, dispatch_id: str, attempt: str, body: bytes) -> str:
    """The v1 request signature, written from the spec (as the SDK does), not from kernel.signing."""
    msg = f"rebuno-request-v1\n{method}\n{target}\n{ts}\n{dispatch_id}\n{attempt}\n".encode() + body
    return "v1=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


class Agent:
    """A keep-alive HTTP/1.1 client that signs like the official SDK. One per thread.

    On the standard library's `http.client`, not httpx: the bench client shares the machine's two
    CPUs with the kernel and the database, and httpx's request and response models cost ~0.6 ms
    of CPU per request against ~0.15 ms here (the bare app's round trip, two requests: 1.0 → 0.3 ms
    client CPU, measured 2026-12-05). The bytes on the wire are the same request: POST, the
    signature headers, a JSON body with its Content-Length, one persistent connection."""

    def __init__(self, base_url: str, agent_id: str, secret: str):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"the bench client speaks plain HTTP to a host: {base_url}")
        self.host, self.port = u.hostname, u.port or 80
        self.conn = self._connect()
        self.agent_id = agent_id
        self.secret = secret
        self.key = secret.encode()

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=30.0)

    def post(self, path: str, body: dict[str, Any], lease: Lease) -> dict[str, Any]:
        data = json.dumps(body).encode()
        ts = str(int(time.time()))
        attempt = str(lease.attempt)
        headers = {
            "Rebuno-Agent-Id": self.agent_id,
            "Rebuno-Timestamp": ts,
            "Rebuno-Signature": sign(self.secret, "POST", path, ts, lease.dispatch_id, attempt, data),
            "Rebuno-Dispatch-Id": lease.dispatch_id,
            "Rebuno-Dispatch-Attempt": attempt,
            "Content-Type": "application/json",
            "Accept": "*/*",  # as httpx and the SDK send; http.client adds Host and Content-Length
            "User-Agent": "regent-bench",
        }
        try:
            self.conn.request("POST", path, body=data, headers=headers)
            r = self.conn.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException) as exc:
            # No retry: the same signed request again would be refused as a replay.
            self.conn.close()
            self.conn = self._connect()
            raise BenchError(f"POST {path} → {type(exc).__name__}: {exc}") from exc
        if r.will_close:
            self.conn.close()
            self.conn = self._connect()
        if r.status != 200:
            raise BenchError(f"POST {path} → {r.status}: {raw[:300].decode(errors='replace')}")
        out = json.loads(raw)
        if not isinstance(out, dict):
            raise BenchError(f"POST {path} → not a JSON object: {raw[:300].decode(errors='replace')}")
        return out

    def close(self) -> None:
        self.conn.close()


# -- the request shapes ------------------------------------------------------------------------------

TARGET = "bench.echo"


def step_args(n: int) -> dict[str, str]:
    """Fixed-width args, so every submit body has the same size; distinct n → a new step."""
    return {"n": f"{n:010d}"}


def submit_body(args: Any, target: str = TARGET) -> dict[str, Any]:
    # The field set the official SDK sends on every submit.
    return {"kind": "tool_call", "target": target, "args": args, "idempotency": "safe_to_retry", "resources": []}


def result_of(args: dict[str, str]) -> dict[str, Any]:
    return {"ok": True, "echo": args["n"]}


def round_trip(agent: Agent, lease: Lease, n: int) -> None:
    """signed submit → `proceed` → signed complete → `recorded`."""
    args = step_args(n)
    base = f"/v0/executions/{lease.execution_id}/steps"
    ans = agent.post(base, submit_body(args), lease)
    if ans.get("decision") != "proceed" or not ans.get("step_id"):
        raise BenchError(f"submit answered {ans!r}, expected proceed")
    done = agent.post(f"{base}/{ans['step_id']}/complete", {"result": result_of(args)}, lease)
    if done.get("decision") != "recorded":
        raise BenchError(f"complete answered {done!r}, expected recorded")


# -- CPU accounting ----------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """User+system CPU seconds of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return float("nan")


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine (every core), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
        idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
        steal = parts[7] if len(parts) > 7 else 0
        return (sum(parts[:8]) - idle - steal) / _TICK
    except (OSError, ValueError, IndexError):
        return float("nan")


@dataclass
class CpuSample:
    server: float
    client: float
    machine: float

    @classmethod
    def take(cls, server_pid: int | None) -> CpuSample:
        t = os.times()
        return cls(proc_cpu(server_pid) if server_pid else float("nan"), t.user + t.system, machine_busy())

    def __sub__(self, other: CpuSample) -> CpuSample:
        return CpuSample(self.server - other.server, self.client - other.client, self.machine - other.machine)

    def __add__(self, other: CpuSample) -> CpuSample:
        return CpuSample(self.server + other.server, self.client + other.client, self.machine + other.machine)


@dataclass
class Run:
    """What one measured window produced."""

    latencies: list[float]  # seconds, one per operation
    wall: float  # seconds from the common start to the last worker's end
    workers: int
    cpu: CpuSample
    notes: list[str] = field(default_factory=list)

    @property
    def ops(self) -> int:
        return len(self.latencies)

    @classmethod
    def merge(cls, runs: list[Run]) -> Run:
        """Rounds of one scenario on one target, taken at different moments, as one sample."""
        cpu = runs[0].cpu
        for r in runs[1:]:
            cpu = cpu + r.cpu
        return cls([x for r in runs for x in r.latencies], sum(r.wall for r in runs), runs[0].workers, cpu,
                   [n for r in runs for n in r.notes])

    @property
    def throughput(self) -> float:
        return self.ops / self.wall if self.wall > 0 else float("nan")


# -- the driver --------------------------------------------------------------------------------------

Op = Callable[[Agent, int], None]  # one timed operation: (the worker's client, its op index)


def drive(
    make_agent: Callable[[], Agent],
    ops: list[Op],
    *,
    duration: float,
    max_ops: int,
    warmup_ops: int,
    warmup_seconds: float,
    server_pid: int | None,
) -> Run:
    """Run one worker thread per entry of `ops`, all released together after their warm-up.

    Each worker repeats its op until `duration` seconds have passed or it has done `max_ops`,
    whichever comes first; the warm-up is bounded the same way and is not measured.
    """
    n = len(ops)
    barrier = threading.Barrier(n + 1, timeout=warmup_seconds + 60)
    results: list[list[float]] = [[] for _ in range(n)]
    ends = [0.0] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        agent = make_agent()
        op = ops[i]
        try:
            k = 0
            try:
                stop = time.perf_counter() + warmup_seconds
                while k < warmup_ops and time.perf_counter() < stop:
                    op(agent, k)
                    k += 1
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()
                return
            barrier.wait()
            lat = results[i]
            start = time.perf_counter()
            stop = start + duration
            now = start
            while len(lat) < max_ops and now < stop:
                op(agent, k)
                k += 1
                t = time.perf_counter()
                lat.append(t - now)
                now = t
            ends[i] = now
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            agent.close()

    threads = [threading.Thread(target=worker, args=(i,), name=f"bench-worker-{i}", daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        for th in threads:
            th.join(timeout=30)
        raise errors[0] if errors else BenchError("a worker failed during warm-up") from None
    cpu0 = CpuSample.take(server_pid)
    t0 = time.perf_counter()
    for th in threads:
        th.join(timeout=duration + 60)
    cpu = CpuSample.take(server_pid) - cpu0
    if any(th.is_alive() for th in threads):
        raise BenchError("a worker did not finish in time (the target stopped answering?)")
    if errors:
        raise errors[0]
    wall = max(ends) - t0 if any(ends) else 0.0
    return Run([x for r in results for x in r], wall, n, cpu)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
