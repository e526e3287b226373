"""Reading a kernel's record back after a run: the oracle every scenario shares.

For each execution: its status, its events (seqs gapless from 1, none repeated), its steps (each
with exactly one terminal event); and from the agents' side file, how often each effect ran.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

TERMINAL_STEP_EVENTS = frozenset({"step.succeeded", "step.failed", "step.denied", "step.cancelled"})
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


@dataclass
class Audit:
    executions: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    seq_gaps: list[str] = field(default_factory=list)
    seq_duplicates: list[str] = field(default_factory=list)
    steps: int = 0
    steps_without_one_terminal: list[str] = field(default_factory=list)
    terminal_events_duplicated: list[str] = field(default_factory=list)
    redelivered: int = 0  # executions delivered (acked) more than once
    errors: list[str] = field(default_factory=list)

    def not_completed(self) -> int:
        return self.executions - self.statuses.get("completed", 0)


def _get(http: httpx.Client, path: str, **params: Any) -> Any:
    for _ in range(5):
        try:
            r = http.get(path, params=params)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
    raise RuntimeError(f"GET {path} kept failing")


def audit_one(http: httpx.Client, eid: str, out: Audit) -> None:
    e = _get(http, f"/v0/executions/{eid}")
    out.statuses[e["status"]] += 1
    events: list[dict[str, Any]] = []
    after = 0
    for _ in range(100):  # bounded: 100 000 events
        page = _get(http, f"/v0/executions/{eid}/events", after_seq=after, limit=1000)
        if not page:
            break
        events += page
        after = page[-1]["event_seq"]
    seqs = [ev["event_seq"] for ev in events]
    if len(set(seqs)) != len(seqs):
        out.seq_duplicates.append(eid)
    if sorted(set(seqs)) != list(range(1, len(set(seqs)) + 1)):
        out.seq_gaps.append(eid)
    terminal = Counter(ev["payload"].get("step_id") for ev in events if ev["type"] in TERMINAL_STEP_EVENTS)
    acked = [ev for ev in events if ev["type"] == "dispatch.acked"]
    if len(acked) > 1:
        out.redelivered += 1
    steps = _get(http, f"/v0/executions/{eid}/steps")
    out.steps += len(steps)
    for s in steps:
        n = terminal.get(s["step_id"], 0)
        if n > 1:
            out.terminal_events_duplicated.append(f"{eid}/{s['step_id']}")
        if (s["status"] in ("succeeded", "failed", "denied", "cancelled") and n != 1) or (s["status"] not in ("succeeded", "failed", "denied", "cancelled") and e["status"] == "completed"):
            out.steps_without_one_terminal.append(f"{eid}/{s['step_id']}:{s['status']}:{n}")


def audit(url: str, token: str, ids: list[str], threads: int = 4) -> Audit:
    out = Audit(executions=len(ids))
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http, \
            ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(audit_one, http, eid, out) for eid in ids]:
            try:
                f.result()
            except Exception as exc:
                out.errors.append(str(exc))
    return out


def effect_counts(lines: list[list[str]]) -> Counter[tuple[str, str]]:
    """(execution id, step name) → how many times the body ran."""
    return Counter((parts[0], parts[1]) for parts in lines if len(parts) >= 2)


def first(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" … (+{len(items) - n})" if len(items) > n else "")
