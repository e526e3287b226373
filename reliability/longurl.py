"""D2 long webhook URL: a 64 KiB URL (and one just past the bound) is refused at registration,
by the API in the envelope and by the manifest before `regent serve` starts; an agent stored
with one anyway (registered before the bound) fails each delivery as a recorded
`dispatch.failed` with back-off, and its execution ends `dispatch_exhausted` in seconds rather
than waiting out a lease per attempt. SQLite."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from reliability.procs import ROOT, SECRET, TOKEN, Kernel, clean_env, wait_for
from reliability.report import Outcome

BOUND = 2048  # kernel/core/agents.py MAX_WEBHOOK_URL_CHARS, as docs/agents.md states it
STORED = 70_000  # past httpx's 64 KiB: every delivery to it raised InvalidURL inside the kernel
ENV = {"REGENT_DISPATCH_MAX_ATTEMPTS": "3", "REGENT_DISPATCH_BASE_DELAY": "100ms",
       "REGENT_DISPATCH_MAX_DELAY": "500ms", "REGENT_DISPATCH_POLL_INTERVAL": "50ms",
       "REGENT_DISPATCH_LEASE_TIMEOUT": "1h"}


def url_of(length: int) -> str:
    head = "http://127.0.0.1:9/webhook?t="
    return head + "a" * (length - len(head))


def _store_agent(db_url: str, agent_id: str, webhook_url: str) -> None:
    """Write the agent as an older kernel would have, past today's registration checks."""
    from kernel.domain import Agent
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    try:
        migrate(store)
        with store.transaction() as tx:
            tx.upsert_agent(Agent(id=agent_id, webhook_url=webhook_url, secret=SECRET, registered_at=datetime.now(UTC)))
    finally:
        store.close()


def run(tmp: Path) -> Outcome:
    out = Outcome("D2", "long webhook URL (SQLite)",
                  tried=f"register agents with a 64 KiB and a {BOUND + 1}-character webhook URL (API and manifest); "
                        "deliver to one stored before the bound")
    started = time.monotonic()
    manifest = tmp / "d2.yaml"
    manifest.write_text(f"agents:\n  - id: long\n    webhook_url: {url_of(64 * 1024)}\n    secret: {SECRET}\n")
    # Started beside the kernel below (each start takes seconds on a loaded machine); it must exit.
    serve = subprocess.Popen([sys.executable, "-m", "kernel", "serve", "--db-url", f"sqlite:///{tmp}/d2-manifest.db",
                              "--config", str(manifest), "--port", "9"], env=clean_env(REGENT_BEARER_TOKEN=TOKEN),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    db_url = f"sqlite:///{tmp}/d2.db"
    _store_agent(db_url, "stored-long", url_of(STORED))
    k = Kernel(db_url, tmp / "d2.log", **ENV)
    try:
        k.start()
        try:
            said = serve.communicate(timeout=60)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            serve.kill()
            said = serve.communicate()[0].decode(errors="replace") + " (still running after 60 s: killed)"
        out.check("the manifest is refused before serving, naming the bound", serve.returncode not in (0, None)
                  and f"at most {BOUND} characters" in said, f"exit {serve.returncode}: {said.strip()[-160:]}")
        with httpx.Client(base_url=k.url, headers=k.bearer(), timeout=30) as http:
            answers = {}
            for name, length in (("64KiB", 64 * 1024), ("bound+1", BOUND + 1)):
                r = http.post("/v0/agents", json={"id": f"long-{name}", "webhook_url": url_of(length), "secret": SECRET})
                answers[name] = (r.status_code, r.headers.get("content-type", ""), r.text[:300])
            refused = all(s == 400 and '"validation_error"' in text and "application/json" in ct
                          for s, ct, text in answers.values())
            out.check(f"POST /v0/agents refuses both with a 400 in the envelope naming {BOUND}", refused,
                      "; ".join(f"{n}: {s}" for n, (s, _, _) in answers.items()))
            at_bound = http.post("/v0/agents", json={"id": "at-bound", "webhook_url": url_of(BOUND), "secret": SECRET})
            out.check(f"a {BOUND}-character URL is accepted", at_bound.status_code == 201, str(at_bound.status_code))

            t0 = time.monotonic()
            eid = http.post("/v0/executions", json={"agent_id": "stored-long", "input": {}}).json()["id"]

            def ended() -> bool:
                return http.get(f"/v0/executions/{eid}").json()["status"] == "failed"

            with contextlib.suppress(TimeoutError):  # judged below, with what it reached
                wait_for(ended, "the execution to fail dispatch_exhausted", timeout=30, every=0.1)
            took = time.monotonic() - t0
            e = http.get(f"/v0/executions/{eid}").json()
            events = http.get(f"/v0/executions/{eid}/events").json()
            rows = events.get("events", events) if isinstance(events, dict) else events
            failed = [ev["payload"].get("error", "") for ev in rows if ev["type"] == "dispatch.failed"]
        out.check("every delivery is a recorded dispatch.failed (InvalidURL)",
                  len(failed) == 3 and all(f.startswith("InvalidURL") for f in failed), f"{len(failed)}: {failed[:1]}")
        out.check("the execution failed dispatch_exhausted in seconds, not a lease per attempt",
                  e["status"] == "failed" and e.get("failure_reason") == "dispatch_exhausted" and took < 30,
                  f"{e['status']} ({e.get('failure_reason')}) after {took:.1f} s")
        out.check("no delivery task died unrecorded (log)", "delivery task failed" not in k.tail(200_000))
        out.check("kernel alive after", k.healthy())
        out.figures = {"exhausted after s": f"{took:.1f}", "dispatch.failed": len(failed)}
    finally:
        k.stop()
    out.seconds = time.monotonic() - started
    return out
