"""R4 overload: many concurrent clients creating and reading executions on one SQLite kernel.

No 5xx other than a 503 with Retry-After (the documented answer of a full bounded queue), every
429 with Retry-After too; p50/p99 reported; the kernel's RSS sampled throughout and bounded; a
separate prober asks /v0/health on a fresh connection every 250 ms and must always get a 200."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from reliability.audit import first
from reliability.fuzz import Receiver
from reliability.procs import TOKEN, Kernel, rss_kib, write_manifest
from reliability.report import Outcome

RSS_GROWTH_LIMIT_MIB = 512


async def _client(url: str, until: float, lat: list[float], statuses: Counter[str], bad: list[str], i: int) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        n = 0
        last: str | None = None
        while time.monotonic() < until:
            n += 1
            t0 = time.perf_counter()
            try:
                if last is None or n % 2:
                    r = await http.post("/v0/executions", json={"agent_id": "load", "input": {"c": i, "n": n}})
                else:
                    r = await http.get(f"/v0/executions/{last}")
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
                bad.append(type(exc).__name__)
                await asyncio.sleep(0.05)
                continue
            lat.append(time.perf_counter() - t0)
            statuses[str(r.status_code)] += 1
            if r.status_code == 201:
                last = r.json()["id"]
            elif r.status_code in (429, 503):
                if not r.headers.get("retry-after"):
                    bad.append(f"{r.status_code} without Retry-After")
                await asyncio.sleep(min(float(r.headers.get("retry-after", "1") or 1), 2.0))
            elif r.status_code >= 500:
                bad.append(f"{r.status_code} {r.text[:80]!r}")


def _probe(url: str, until: float, out: dict[str, float], stop: threading.Event) -> None:
    while time.monotonic() < until and not stop.is_set():
        t0 = time.perf_counter()
        try:
            ok = httpx.get(url + "/v0/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            ok = False
        dt = time.perf_counter() - t0
        out["probes"] += 1
        out["failed"] += 0 if ok else 1
        out["max_s"] = max(out["max_s"], dt)
        time.sleep(0.25)


def _sample(pid: int, until: float, rss: list[int], stop: threading.Event) -> None:
    while time.monotonic() < until and not stop.is_set():
        rss.append(rss_kib(pid))
        time.sleep(0.5)


def run(tmp: Path, *, clients: int, seconds: int) -> Outcome:
    out = Outcome("R4", "overload (SQLite)",
                  tried=f"{clients} concurrent clients creating and reading executions for {seconds} s; "
                        "/v0/health probed every 250 ms")
    started = time.monotonic()
    rec = Receiver()  # acknowledges every delivery and does no work: the backlog only grows
    manifest = write_manifest(tmp / "regent.yaml", {"load": rec.port})
    k = Kernel(f"sqlite:///{tmp}/r4.db", tmp / "kernel.log", manifest=manifest,
               REGENT_DISPATCH_LEASE_TIMEOUT="1h").start()
    try:
        lat: list[float] = []
        statuses: Counter[str] = Counter()
        bad: list[str] = []
        probe = {"probes": 0.0, "failed": 0.0, "max_s": 0.0}
        rss: list[int] = [rss_kib(k.pid)]
        stop = threading.Event()
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=_probe, args=(k.url, until, probe, stop), daemon=True),
                   threading.Thread(target=_sample, args=(k.pid, until, rss, stop), daemon=True)]
        for t in threads:
            t.start()

        async def main() -> None:
            await asyncio.gather(*(_client(k.url, until, lat, statuses, bad, i) for i in range(clients)))

        asyncio.run(main())
        stop.set()
        for t in threads:
            t.join(timeout=10)
        alive = k.alive() and httpx.get(k.url + "/v0/health", timeout=5).status_code == 200
        lat.sort()
        p50 = statistics.median(lat) if lat else 0.0
        p99 = lat[int(len(lat) * 0.99) - 1] if len(lat) >= 100 else (lat[-1] if lat else 0.0)
        growth_mib = (max(rss) - rss[0]) / 1024
        out.check("no 5xx but 503 with Retry-After; every 429/503 has Retry-After", not bad,
                  f"{len(bad)}: {first(bad, 2)}" if bad else "")
        out.check(f"/v0/health answered throughout ({int(probe['probes'])} probes)", probe["failed"] == 0 and probe["probes"] > 0,
                  f"{int(probe['failed'])} failed, slowest {probe['max_s'] * 1000:.0f} ms")
        out.check(f"memory bounded (RSS growth < {RSS_GROWTH_LIMIT_MIB} MiB)", growth_mib < RSS_GROWTH_LIMIT_MIB,
                  f"{rss[0] // 1024} → peak {max(rss) // 1024} MiB")
        out.check("kernel alive after", alive)
        out.figures = {"requests": len(lat), "req/s": f"{len(lat) / seconds:.0f}",
                       "p50 ms": f"{p50 * 1000:.0f}", "p99 ms": f"{p99 * 1000:.0f}",
                       "statuses": " ".join(f"{s}×{n}" for s, n in sorted(statuses.items())),
                       "health max ms": f"{probe['max_s'] * 1000:.0f}", "RSS MiB": f"{rss[0] // 1024}→{max(rss) // 1024}"}
    finally:
        k.stop()
        rec.close()
        out.seconds = time.monotonic() - started
    return out
