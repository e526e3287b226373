"""R2 replicas: two `regent serve` on one PostgreSQL database, every dispatch duplicated.

The agent's webhook URL is a duplicator in front of two SDK agent processes of the same agent id,
one talking to each replica. Every delivery is sent twice to its process (an exact duplicate,
which the SDK ignores), and the first attempt of every dispatch is handed to one process and then
answered 500, as if the acknowledgement were lost: the kernel delivers the dispatch again, to the
other process, while the first may still be running it. Two workers on one execution, one of them
on a superseded lease. Afterwards: every execution completed, no step with two terminal events,
no `at_most_once` effect twice.

(Two processes on one and the same lease are not a case the contract covers: a lease belongs to
one worker, and identical calls under one lease are distinct occurrences by design.)"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from reliability.audit import audit, effect_counts, first
from reliability.crash import wait_terminal
from reliability.procs import (
    FAST_DISPATCH,
    TOKEN,
    Agent,
    Kernel,
    effect_lines,
    free_port,
    http_receiver,
    scratch_database,
    write_manifest,
)
from reliability.report import Outcome


class Duplicator:
    """Attempt n goes to target n mod 2, twice; attempt 1 is then answered 500 (ack lost)."""

    def __init__(self, targets: list[str]):
        self.targets = targets
        self.forwarded: Counter[str] = Counter()
        dup = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {"Content-Type": "application/json",
                           "Rebuno-Signature": self.headers.get("Rebuno-Signature", "")}
                attempt = int(json.loads(body).get("dispatch_attempt", 1))
                target = dup.targets[attempt % len(dup.targets)]
                def send(copy: str) -> int:
                    try:
                        code = httpx.post(target, content=body, headers=headers, timeout=5).status_code
                        dup.forwarded[copy] += 1
                        return code
                    except httpx.HTTPError:
                        return 0

                codes = [send("delivered")]
                # The exact duplicate follows the delivery, off the kernel's clock.
                threading.Thread(target=send, args=("duplicate",), daemon=True).start()
                if attempt == 1 and 200 in codes:
                    dup.forwarded["ack lost"] += 1
                    codes = [500]
                self.send_response(200 if 200 in codes else 500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.port, self.thread = http_receiver(Handler)

    def __enter__(self) -> Duplicator:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def run(tmp: Path, *, pg_url: str, executions: int) -> Outcome:
    out = Outcome("R2", "replicas (PostgreSQL)",
                  tried=f"{executions} five-step executions on 2 kernels sharing one PostgreSQL database; "
                        "every webhook sent twice, every first attempt's ack lost (redelivered to a "
                        "second agent process while the first runs)")
    started = time.monotonic()
    try:
        db = scratch_database(pg_url)
        url = db.__enter__()
    except Exception as exc:
        out.skipped = f"no PostgreSQL at {pg_url}: {type(exc).__name__}"
        return out
    stack = contextlib.ExitStack()
    stack.callback(db.__exit__, None, None, None)
    try:
        ports = (free_port(), free_port())
        dup = stack.enter_context(Duplicator([f"http://127.0.0.1:{p}/webhook" for p in ports]))
        manifest = write_manifest(tmp / "regent.yaml", {"twin": dup.port})
        kernels = []
        for name in ("r1", "r2"):
            # A delivery here is two hops (duplicator, agent): give it more than the forwarder's 5 s.
            k = Kernel(url, tmp / f"{name}.log", manifest=manifest, REGENT_REPLICA_ID=name,
                       **{**FAST_DISPATCH, "REGENT_DISPATCH_TIMEOUT": "15s"})
            kernels.append(k.start())
            stack.callback(k.stop)
        effects = tmp / "twin.effects"
        for k, port in zip(kernels, ports, strict=True):
            a = Agent(k.url, "twin", port, tmp, effects=effects)
            stack.callback(a.stop)
        clients = [httpx.Client(base_url=k.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15)
                   for k in kernels]
        for c in clients:
            stack.callback(c.close)

        def create(i: int) -> str:
            r = clients[i % 2].post("/v0/executions", json={"agent_id": "twin", "input": {"i": i}})
            r.raise_for_status()
            return str(r.json()["id"])

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(create, range(executions)))
        stuck = wait_terminal(kernels[0].url, ids, timeout=120)
        a = audit(kernels[1].url, TOKEN, ids)
        counts = effect_counts(effect_lines(effects))
        twice = [f"{eid}:{n}" for (eid, step), n in counts.items() if step == "s3" and n > 1]
        out.check(f"every execution terminal ({executions})", not stuck, first(stuck))
        out.check("every one completed", a.not_completed() == 0 and not a.errors, f"{dict(a.statuses)}")
        out.check("0 duplicate terminal events", not a.terminal_events_duplicated and not a.steps_without_one_terminal,
                  first(a.terminal_events_duplicated + a.steps_without_one_terminal))
        out.check("event seqs gapless, no duplicate", not a.seq_gaps and not a.seq_duplicates,
                  first(a.seq_gaps + a.seq_duplicates))
        out.check("0 double at_most_once", not twice, first(twice))
        safe_twice = sum(1 for (_, step), n in counts.items() if step != "s3" and n > 1)
        out.figures = {**dict(dup.forwarded), "delivered more than once": a.redelivered,
                       "safe effects run twice (allowed)": safe_twice,
                       "s3 run once": sum(1 for (_, step), n in counts.items() if step == "s3" and n == 1),
                       "s3 indeterminate": sum(1 for eid in ids if counts.get((eid, "s3"), 0) == 0)}
    finally:
        stack.close()
        out.seconds = time.monotonic() - started
    return out
