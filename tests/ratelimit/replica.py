"""One kernel replica for the replica test: the shared PostgreSQL database, the shared Redis bucket.

`python -m tests.ratelimit.replica DB_URL REDIS_URL NAMESPACE AGENT_ID CALLS MAX_CALLS` registers
its own agent, prepares CALLS executions it claimed itself, prints `ready`, waits for a line on
stdin, then submits one step per execution from CALLS threads at once and prints the decisions as
one JSON object.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter

from kernel.core import steps
from kernel.core.agents import register_agent
from kernel.core.dispatch import Claim, claim_one
from kernel.core.executions import create_execution
from kernel.core.kernel import Kernel
from kernel.domain import Decision, Lease, RateLimitSpec, Verdict
from kernel.ratelimit import LimitsLimiter
from kernel.store import open_store
from tests.ratelimit.support import FixedPolicy, req


def main(db_url: str, redis_url: str, namespace: str, agent_id: str, calls: int, max_calls: int) -> int:
    store = open_store(db_url)
    spec = RateLimitSpec(max_calls=max_calls, window_seconds=60, per_what="global")
    limiter = LimitsLimiter(redis_url, namespace=namespace)
    k = Kernel(store=store, limiter=limiter, policy=FixedPolicy(Decision(Verdict.ALLOW, "global-cap", rate_limit=spec)))
    register_agent(k, agent_id, "http://127.0.0.1:9/webhook", "s3cret", None, keep_policy=True)
    claims = [_claim_new(k, agent_id) for _ in range(calls)]
    print("ready", flush=True)
    sys.stdin.readline()

    barrier = threading.Barrier(calls)
    decisions: Counter[str] = Counter()
    lock = threading.Lock()

    def submit(c: Claim) -> None:
        barrier.wait(30)
        try:
            a = steps.submit_step(k, Lease(agent_id, c.execution_id, c.dispatch_id, c.attempt), req())
            outcome = a.decision if a.reason != "rate_limiter_unavailable" else "unavailable"
        except Exception as exc:  # reported, not swallowed: the parent asserts none happened
            outcome = f"error:{type(exc).__name__}:{exc}"
        with lock:
            decisions[outcome] += 1

    threads = [threading.Thread(target=submit, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    limiter.close()
    store.close()
    print(json.dumps(dict(decisions)), flush=True)
    return 0


def _claim_new(k: Kernel, agent_id: str) -> Claim:
    """Create an execution and claim its own dispatch (the other replica's stay untouched)."""
    e, _ = create_execution(k, agent_id, None)
    with k.store.read() as tx:
        [queued] = [ev for ev in tx.list_events(e.id, 0, 10) if ev.type == "dispatch.queued"]
    claim = claim_one(k, queued.payload["dispatch_id"])
    assert claim is not None
    return claim


if __name__ == "__main__":
    db, url, ns, agent, n, cap = sys.argv[1:7]
    sys.exit(main(db, url, ns, agent, int(n), int(cap)))
