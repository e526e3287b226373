"""D1 black-hole webhook: one agent's webhook accepts TCP and never answers, with executions
queued for it; another agent's deliveries must stay prompt (p99 ≤ 1 s), the dead host must hold
no more than the agent's share of connections, and its executions are delivered once it
recovers. `regent serve` with its default delivery slots, on SQLite and on PostgreSQL."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from reliability.blackhole import Webhook
from reliability.procs import Kernel, scratch_database, write_manifest
from reliability.report import Outcome

GOAL_P99_SECONDS = 1.0
# The kernel's default: 64 delivery slots, half of them to any one agent.
AGENT_SHARE = 32
# Deliveries give up after 2 s and breakers reopen within 1-2 s, so the run is short; everything
# else is the kernel's default (64 slots, the 0.25 s poll).
ENV = {
    "REGENT_DISPATCH_TIMEOUT": "2s",
    "REGENT_DISPATCH_BREAKER_RESET": "1s",
    "REGENT_DISPATCH_BASE_DELAY": "100ms",
    "REGENT_DISPATCH_MAX_DELAY": "2s",
    "REGENT_DISPATCH_MAX_ATTEMPTS": "1000",
    "REGENT_DISPATCH_LEASE_TIMEOUT": "1h",
}


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("inf")


def _metrics(k: Kernel) -> dict[str, float]:
    try:
        text = httpx.get(k.url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    return {s.name + "".join(f"[{v}]" for v in s.labels.values()): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("regent_dispatch")}


def run_one(tmp: Path, db_url: str, label: str, *, queued: int, healthy: int) -> Outcome:
    out = Outcome("D1", f"black-hole webhook ({label})",
                  tried=f"{queued} executions queued for an agent whose webhook accepts TCP and never answers; "
                        f"{healthy} executions of a healthy agent, one every 0.2 s; then the dead host recovers")
    started = time.monotonic()
    with Webhook(answer=False) as hole, Webhook() as ok:
        manifest = write_manifest(tmp / f"d1-{label}.yaml", {"bh": hole.port, "ok": ok.port})
        k = Kernel(db_url, tmp / f"d1-{label}.log", manifest=manifest, **ENV)
        try:
            k.start()
            with httpx.Client(base_url=k.url, headers=k.bearer(), timeout=30) as http:
                stuck = [http.post("/v0/executions", json={"agent_id": "bh", "input": {"i": i}}).json()["id"]
                         for i in range(queued)]
                created: dict[str, float] = {}
                peak_bh, breaker_opened = 0.0, 0.0
                for i in range(healthy):
                    t0 = time.time()
                    r = http.post("/v0/executions", json={"agent_id": "ok", "input": {"i": i}})
                    created[r.json()["id"]] = t0
                    if i % 5 == 0:
                        m = _metrics(k)
                        peak_bh = max(peak_bh, m.get("regent_dispatch_agent_in_flight[bh]", 0.0))
                        breaker_opened = max(breaker_opened, m.get("regent_dispatch_breaker_opened_total", 0.0))
                    time.sleep(max(0.0, t0 + 0.2 - time.time()))
                deadline = time.monotonic() + 30
                while len(created.keys() & ok.arrivals.keys()) < healthy and time.monotonic() < deadline:
                    time.sleep(0.05)
                held = hole.max_open
                recovered_at = time.monotonic()
                hole.recover()
                deadline = time.monotonic() + 60
                while len(hole.answered.keys() & set(stuck)) < queued and time.monotonic() < deadline:
                    time.sleep(0.1)
                recovery_s = time.monotonic() - recovered_at
                delivered = len(hole.answered.keys() & set(stuck))
                failed = sum(1 for eid in stuck[:20] if http.get(f"/v0/executions/{eid}").json()["status"] == "failed")
            lat = [ok.arrivals.get(eid, float("inf")) - t0 for eid, t0 in created.items()]
            p50, p99 = statistics.median(lat), _p99(lat)
            out.check(f"healthy agent's delivery latency p99 ≤ {GOAL_P99_SECONDS:g} s", p99 <= GOAL_P99_SECONDS,
                      f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
            out.check(f"the dead host held at most the agent's share ({AGENT_SHARE}) of connections",
                      held <= AGENT_SHARE, f"{held} held")
            out.check("its breaker opened (/metrics)", breaker_opened >= 1,
                      f"{breaker_opened:.0f}")
            out.check(f"all {queued} delivered once the host recovered", delivered == queued and failed == 0,
                      f"{delivered}/{queued} in {recovery_s:.1f} s")
            out.check("kernel alive after", k.healthy())
            out.figures = {"healthy p50 ms": f"{p50 * 1000:.0f}", "healthy p99 ms": f"{p99 * 1000:.0f}",
                           "dead host connections": held, "bh in flight (metrics)": f"{peak_bh:.0f}",
                           "breaker opened": f"{breaker_opened:.0f}", "recovery s": f"{recovery_s:.1f}"}
            out.details = {"latencies_s": sorted(lat)}
        finally:
            hole.recover()
            k.stop()
    out.seconds = time.monotonic() - started
    return out


def run(tmp: Path, *, pg_url: str, queued: int, healthy: int) -> list[Outcome]:
    outs = [run_one(tmp, f"sqlite:///{tmp}/d1.db", "SQLite", queued=queued, healthy=healthy)]
    try:
        db = scratch_database(pg_url)
        url = db.__enter__()
    except Exception as exc:  # no server: SKIP, which --require-services turns into a failure
        outs.append(Outcome("D1", "black-hole webhook (PostgreSQL)", skipped=f"no PostgreSQL at {pg_url}: "
                                                                             f"{type(exc).__name__}"))
        return outs
    try:
        outs.append(run_one(tmp, url, "PostgreSQL", queued=queued, healthy=healthy))
    finally:
        db.__exit__(None, None, None)
    return outs
