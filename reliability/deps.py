"""R6 dependencies down: a private PostgreSQL restarted mid-load, a private Redis stopped under
rate-limited steps, and the SQLite file's disk filling up.

Only servers this module starts are stopped: PostgreSQL from initdb in a temp dir on its own
port, redis-server on its own port, and a small tmpfs (or, without the right to mount one, the
scenario is skipped and says why)."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from reliability.audit import audit, effect_counts, first
from reliability.crash import create_paced, wait_terminal
from reliability.fuzz import Receiver, agent_headers
from reliability.procs import (
    FAST_DISPATCH,
    TOKEN,
    Agent,
    Kernel,
    PrivatePostgres,
    PrivateRedis,
    effect_lines,
    free_port,
    write_manifest,
)
from reliability.report import Outcome


def postgres_restart(tmp: Path, writes: int, restarts: int) -> Outcome:
    out = Outcome("R6", "PostgreSQL restarted mid-load",
                  tried=f"{writes} five-step executions on a private PostgreSQL, restarted "
                        f"(-m immediate) {restarts}× while they run")
    started = time.monotonic()
    pg = PrivatePostgres(tmp)
    try:
        pg.start()
    except (OSError, subprocess.SubprocessError) as exc:
        out.skipped = f"could not start a private PostgreSQL: {exc}"
        return out
    agent_port = free_port()
    manifest = write_manifest(tmp / "regent.yaml", {"pgload": agent_port})
    k: Kernel | None = None
    agent: Agent | None = None
    try:
        k = Kernel(pg.url, tmp / "kernel.log", manifest=manifest, **FAST_DISPATCH).start()
        agent = Agent(k.url, "pgload", agent_port, tmp)
        acked: dict[int, str] = {}
        stats: dict[str, int] = {}
        stop = threading.Event()
        window = 8.0
        deadline = [time.monotonic() + window + 90]
        creators = [threading.Thread(target=create_paced, daemon=True,
                                     args=(k.url, "pgload", writes, 2 * window / writes, deadline, "r6", acked,
                                           stats, stop, off)) for off in (0, 1)]
        for t in creators:
            t.start()
        for _ in range(restarts):
            time.sleep(window / (restarts + 1))
            pg.restart()
        for t in creators:
            t.join(timeout=max(1.0, deadline[0] - time.monotonic()))
        ready = False
        with contextlib.suppress(Exception):
            ready = httpx.get(k.url + "/v0/ready", timeout=5).status_code == 200
        ids = [acked[i] for i in sorted(acked)]
        stuck = wait_terminal(k.url, ids, timeout=120)
        a = audit(k.url, TOKEN, ids)
        counts = effect_counts(effect_lines(agent.effects))
        twice = [f"{eid}:{n}" for (eid, step), n in counts.items() if step == "s3" and n > 1]
        five = {key: n for key, n in stats.items() if key.startswith("create 5")}
        out.check("kernel alive, ready again after the restarts", k.alive() and ready)
        out.check(f"every acknowledged create ({len(ids)}/{writes}) terminal and completed",
                  not stuck and len(ids) == writes and a.not_completed() == 0, first(stuck) or f"{dict(a.statuses)}")
        out.check("no lost acknowledged write: seqs gapless, one terminal event per step",
                  not (a.seq_gaps or a.seq_duplicates or a.steps_without_one_terminal or a.terminal_events_duplicated),
                  first(a.seq_gaps + a.steps_without_one_terminal))
        out.check("no at_most_once effect twice", not twice, first(twice))
        out.check("errors while it was down were 503, not 500", "create 500" not in stats,
                  f"{five}" if five else "", items=[f"create 500 ×{stats['create 500']} while PostgreSQL restarted"]
                  if "create 500" in stats else None)
        out.figures = {"restarts": restarts, "acknowledged": len(ids), **stats}
    finally:
        if agent is not None:
            agent.stop()
        if k is not None:
            k.stop()
        pg.stop()
        out.seconds = time.monotonic() - started
    return out


RATE_LIMITED_BUNDLE = """\
default_action: deny
rules:
  - id: closed
    when: {target: closed}
    then:
      decision: allow
      rate_limit: {max_calls: 1000, window: 1m, on_limiter_error: deny}
  - id: open
    when: {target: open}
    then:
      decision: allow
      rate_limit: {max_calls: 1000, window: 1m, on_limiter_error: allow}
"""


def redis_stopped(tmp: Path) -> Outcome:
    out = Outcome("R6", "Redis stopped",
                  tried="rate-limited steps on a private Redis; Redis stopped, then started again")
    started = time.monotonic()
    redis = PrivateRedis(tmp)
    try:
        redis.start()
    except (OSError, TimeoutError) as exc:
        out.skipped = f"could not start a private redis-server: {exc}"
        return out
    rec = Receiver()
    (tmp / "limited.yaml").write_text(RATE_LIMITED_BUNDLE)
    manifest = write_manifest(tmp / "regent.yaml", {"limited": rec.port}, policy={"limited": "limited.yaml"})
    k = Kernel(f"sqlite:///{tmp}/r6-redis.db", tmp / "kernel-redis.log", manifest=manifest,
               REGENT_RATE_LIMIT_STORAGE=redis.url, REGENT_DISPATCH_LEASE_TIMEOUT="1h")
    try:
        k.start()
        with httpx.Client(base_url=k.url, timeout=30) as http:
            eid = http.post("/v0/executions", json={"agent_id": "limited"}, headers=k.bearer()).json()["id"]
            deadline = time.monotonic() + 30
            while eid not in rec.leases and time.monotonic() < deadline:
                time.sleep(0.05)
            lease = rec.leases[eid]
            n = 0

            def submit(target: str) -> tuple[str, float]:
                nonlocal n
                n += 1
                path = f"/v0/executions/{eid}/steps"
                body = (b'{"kind":"tool_call","target":"%s","args":{"n":%d},"idempotency":"safe_to_retry",'
                        b'"resources":[]}' % (target.encode(), n))
                t0 = time.monotonic()
                r = http.post(path, content=body, headers={"Content-Type": "application/json",
                                                           **agent_headers("POST", path, body, lease, agent_id="limited")})
                dt = time.monotonic() - t0
                if r.status_code != 200:
                    return f"HTTP {r.status_code}", dt
                d = r.json()
                return d["decision"] + (f"/{d['reason']}" if d.get("reason") else ""), dt

            up = [submit("closed")[0], submit("open")[0]]
            redis.stop()
            closed, t_closed = submit("closed")
            opened, t_open = submit("open")
            health = httpx.get(k.url + "/v0/health", timeout=5).status_code
            redis = PrivateRedis(tmp, port=redis.port).start()
            again = "?"
            for _ in range(20):  # the limiter reconnects on its own; bounded
                again = submit("closed")[0]
                if again == "proceed":
                    break
                time.sleep(0.25)
        out.check("Redis up: both rules proceed", up == ["proceed", "proceed"], f"{up}")
        out.check("Redis down, on_limiter_error: deny → rate_limited/rate_limiter_unavailable (fail closed)",
                  closed == "rate_limited/rate_limiter_unavailable", f"{closed} in {t_closed:.2f} s")
        out.check("Redis down, on_limiter_error: allow → proceed (fail open)", opened == "proceed",
                  f"{opened} in {t_open:.2f} s")
        out.check("each answer bounded (≤ 2 s) and /v0/health 200 meanwhile",
                  t_closed <= 2 and t_open <= 2 and health == 200)
        out.check("Redis back: proceed again", again == "proceed", again)
        out.figures = {"down, closed": f"{t_closed * 1000:.0f} ms", "down, open": f"{t_open * 1000:.0f} ms"}
    finally:
        k.stop()
        rec.close()
        redis.stop()
        out.seconds = time.monotonic() - started
    return out


def disk_full(tmp: Path, writes: int) -> Outcome:
    out = Outcome("R6", "disk full (SQLite)",
                  tried="executions with 64 KB inputs on a SQLite file in a 6 MB tmpfs until the disk is "
                        "full; then space freed")
    started = time.monotonic()
    mnt = tmp / "small"
    mnt.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        out.skipped = f"cannot mount a small tmpfs here (needs root): {exc}"
        return out
    rec = Receiver()
    manifest = write_manifest(tmp / "regent-disk.yaml", {"disk": rec.port})
    db = mnt / "r6.db"
    k = Kernel(f"sqlite:///{db}", tmp / "kernel-disk.log", manifest=manifest, REGENT_DISPATCH_LEASE_TIMEOUT="1h")
    try:
        k.start()
        statuses: Counter[str] = Counter()
        first_error = ""
        ok_before = 0
        payload = "x" * 64 * 1024
        with httpx.Client(base_url=k.url, headers=k.bearer(), timeout=30) as http:
            for i in range(max(writes, 200)):  # bounded: 6 MB / 64 KB ≈ 90 fit
                try:
                    r = http.post("/v0/executions", json={"agent_id": "disk", "input": {"i": i, "p": payload}})
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    first_error = first_error or type(exc).__name__
                    break
                statuses[str(r.status_code)] += 1
                if r.status_code == 201:
                    ok_before += 1
                else:
                    first_error = f"{r.status_code} {r.text[:100]}"
                    if len([s for s in statuses if s != "201"]) and statuses[str(r.status_code)] >= 3:
                        break
            health = http.get("/v0/health").status_code
            readable = http.get("/v0/executions", params={"limit": 5}).status_code
            # Make room as an operator would, by growing the volume (nothing of the kernel's is deleted).
            subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True, capture_output=True, timeout=30)
            after = "?"
            for _ in range(20):  # bounded
                r = http.post("/v0/executions", json={"agent_id": "disk", "input": {"after": True}})
                after = str(r.status_code)
                if r.status_code == 201:
                    break
                time.sleep(0.25)
        k.stop()
        con = sqlite3.connect(db)
        try:
            integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        finally:
            con.close()
        full_answers = [s for s in statuses if s not in ("201",)]
        clear = bool(first_error) and first_error[:3] in ("503", "507") and "internal_error" not in first_error
        out.check("the disk filled up (writes refused)", bool(full_answers), f"{dict(statuses)}")
        out.check("a clear error, not a 500", clear, first_error[:120],
                  items=None if clear else [f"disk full → {first_error[:80]}"])
        out.check("kernel alive and reading meanwhile", health == 200 and readable == 200 and k.proc is not None)
        out.check("writes succeed once there is space", after == "201", after)
        out.check("PRAGMA integrity_check ok after", integrity == "ok", integrity)
        out.figures = {"accepted before full": ok_before, "answers": " ".join(f"{s}×{n}" for s, n in statuses.items())}
    finally:
        k.stop()
        rec.close()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
        out.seconds = time.monotonic() - started
    return out


def run(tmp: Path, *, writes: int, restarts: int) -> list[Outcome]:
    outs = []
    for name, fn in (("pg", lambda d: postgres_restart(d, writes, restarts)), ("redis", redis_stopped),
                     ("disk", lambda d: disk_full(d, writes))):
        d = tmp / name
        d.mkdir(exist_ok=True)
        t0 = time.monotonic()
        try:
            outs.append(fn(d))
        except Exception as exc:
            o = Outcome("R6", f"{name}: harness error")
            o.check("the scenario ran", False, f"{type(exc).__name__}: {exc}"[:300])
            o.seconds = time.monotonic() - t0
            outs.append(o)
    return outs
