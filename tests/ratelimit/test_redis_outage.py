"""Redis stopped in the middle of a run, through a real kernel served over HTTP with a YAML bundle:
the fail-open rule keeps proceeding, the fail-closed rule refuses with `rate_limiter_unavailable`,
the kernel keeps serving, and when Redis is back both rules count against the buckets Redis kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernel.core.kernel import Kernel
from kernel.core.policies import store_policy
from kernel.policy.resolver import BundleResolver
from kernel.ratelimit import LimitsLimiter
from tests.conftest import Running
from tests.ratelimit.proxy import TcpProxy
from tests.support import AgentClient, ServerThread

BUNDLE = """
default_action: deny
rules:
  - id: open-cap
    when: {target: open}
    then:
      decision: allow
      rate_limit: {max_calls: 3, window: 1m, on_limiter_error: allow}
  - id: closed-cap
    when: {target: closed}
    then:
      decision: allow
      rate_limit: {max_calls: 3, window: 1m, on_limiter_error: deny}
"""

pytestmark = pytest.mark.redis


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    host, port = redis_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    p = TcpProxy(host, int(port)).start()
    yield p
    p.stop()


@pytest.fixture
def governed(kernel: Kernel, running: Running, proxy: TcpProxy, redis_namespace: str) -> Iterator[Kernel]:
    kernel.policy = BundleResolver(kernel.store)
    store_policy(kernel, running.agent_id, "yaml", BUNDLE)
    with LimitsLimiter(proxy.url, namespace=redis_namespace, timeout_seconds=0.5) as lim:
        kernel.limiter = lim
        yield kernel


def _decision(c: AgentClient, eid: str, target: str, n: int) -> str:
    r = c.submit(eid, target, {"n": n})
    assert r.status_code == 200, r.text
    body = r.json()
    if body["decision"] == "proceed":
        assert c.complete_step(eid, body["step_id"], {"ok": n}).status_code == 200
    return str(body.get("reason") or body["decision"])


def test_redis_stopped_mid_run_fail_open_and_fail_closed_rules(
    governed: Kernel, running: Running, server: ServerThread, proxy: TcpProxy
) -> None:
    eid, did, att = running.start()
    c = AgentClient(server.url, running.agent_id, running.secret).lease(did, att)

    before = [_decision(c, eid, "open", 1), _decision(c, eid, "closed", 1)]
    assert before == ["proceed", "proceed"]

    proxy.stop()
    during_open = [_decision(c, eid, "open", n) for n in (2, 3, 4, 5)]
    during_closed = [_decision(c, eid, "closed", n) for n in (2, 3)]
    assert during_open == ["proceed"] * 4  # fail open: more than the limit, none refused
    assert during_closed == ["rate_limiter_unavailable"] * 2
    assert c.http.get("/v0/health").status_code == 200  # still serving

    proxy.start()
    # Redis kept the buckets: `closed` used 1 of 3 before the outage (the refusals took nothing),
    # `open` used 1 before and none during (its hits failed), so each has 2 left.
    after_open = [_decision(c, eid, "open", n) for n in (6, 7, 8)]
    after_closed = [_decision(c, eid, "closed", n) for n in (4, 5, 6)]
    assert after_open == ["proceed", "proceed", "rate_limit_exceeded"]
    assert after_closed == ["proceed", "proceed", "rate_limit_exceeded"]

    with governed.store.read() as tx:
        limited = [e.payload for e in tx.list_events(eid, 0, 1000) if e.type == "step.rate_limited"]
    reasons = [(p["rule_id"], p["error"]["reason"]) for p in limited]
    assert reasons == [
        ("closed-cap", "rate_limiter_unavailable"),
        ("closed-cap", "rate_limiter_unavailable"),
        ("open-cap", "rate_limit_exceeded"),
        ("closed-cap", "rate_limit_exceeded"),
    ]
