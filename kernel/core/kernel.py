"""The use cases' shared context: store, clock, policy, limiter, judge and the kernel's knobs."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from kernel.clock import Clock, SystemClock
from kernel.core.ports import (
    DecisionLog,
    Judge,
    Limiter,
    NoDecisionLog,
    NoJudge,
    NoLimiter,
    NoShadow,
    PermissiveResolver,
    PolicyResolver,
    ShadowObserver,
)
from kernel.core.store_ports import Store

# The longest lease an agent may ask for (one day). A lease is a crash-detection period (a longer
# one only hides a dead agent), and the bound keeps `timedelta` and the integer lease_ms column
# safe: the API refuses more, and a claim clamps any larger value a store still holds.
MAX_LEASE_SECONDS = 86_400


class SecretCache:
    """agent id → secret, kept `ttl` seconds: the signature check's one store read per agent.

    A replica forgets an entry as soon as it changes the agent itself; a change made on another
    replica is seen within `ttl`. A signature that fails against a cached secret is retried once
    against a fresh read, so a rotated secret works at once everywhere.
    """

    def __init__(self, ttl: float = 1.0, max_entries: int = 10_000):
        self.ttl = ttl
        self.max_entries = max_entries
        self._items: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def get(self, agent_id: str) -> str | None:
        hit = self._items.get(agent_id)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, agent_id: str, secret: str) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._items) >= self.max_entries:
                self._items.clear()  # bounded; the next requests refill it
            self._items[agent_id] = (time.monotonic() + self.ttl, secret)

    def forget(self, agent_id: str) -> None:
        with self._lock:
            self._items.pop(agent_id, None)


class BacklogGauge:
    """The last undelivered-dispatch count read, and when (monotonic seconds)."""

    def __init__(self) -> None:
        self.value = 0
        self.read_at = float("-inf")


@dataclass
class Kernel:
    store: Store
    clock: Clock = field(default_factory=SystemClock)
    policy: PolicyResolver = field(default_factory=PermissiveResolver)
    limiter: Limiter = field(default_factory=NoLimiter)
    judge: Judge = field(default_factory=NoJudge)
    shadow: ShadowObserver = field(default_factory=NoShadow)
    replica_id: str = "regent"
    dispatch_max_attempts: int = 5
    dispatch_base_delay: float = 1.0
    dispatch_max_delay: float = 30.0
    dispatch_lease_timeout: float = 120.0
    approval_timeout: float = 900.0
    deadline_timeout: float | None = None
    retention: float = 86400.0
    decision_retention: float = 90 * 86400.0  # the decisions table's own (docs/audit.md)
    shadow_retention: float = 90 * 86400.0  # shadow disagreement rows' (docs/policy-rollout.md)
    record_decisions: bool = True  # write the decisions table (off only to measure its cost)
    bootstrap_approvals: bool = True  # may the bootstrap token (or dev access) decide approvals
    rng: random.Random = field(default_factory=random.Random)
    agent_cache_ttl: float = 1.0
    secrets: SecretCache = field(default_factory=SecretCache)
    # Dispatch claims that raised and were skipped (kernel/core/dispatch.py); /metrics shows it.
    dispatch_claims_skipped: int = 0
    # Admission control (REGENT_MAX_BACKLOG): creates are refused 503 while this many dispatches
    # wait undelivered (0: no bound); the count is re-read at most every `backlog_ttl` seconds.
    max_backlog: int = 0
    backlog_ttl: float = 0.5
    backlog: BacklogGauge = field(default_factory=lambda: BacklogGauge())
    decision_log: DecisionLog = field(default_factory=NoDecisionLog)
    # Agents whose bundle is pulled from a bundle server: agent id → source URL. The source decides
    # their active revision; the admin API's changes to it are refused (core/policies.py).
    pulled_bundles: dict[str, str] = field(default_factory=dict)
    # Agents whose manifest `mcp:` sets `hide_denied_tools`: their gateways leave the tools the
    # bundle denies whatever the arguments out of tools/list (the console's MCP tools page says so).
    mcp_hide_denied: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.secrets.ttl = self.agent_cache_ttl

    def backoff(self, attempt: int) -> timedelta:
        """min(base × 2^(attempt−1), max) plus uniform jitter in [0, 25 %)."""
        base = min(self.dispatch_base_delay * (2 ** max(attempt - 1, 0)), self.dispatch_max_delay)
        return timedelta(seconds=base + self.rng.uniform(0, 0.25 * base))

    def lease_seconds(self, agent_lease: int | None) -> float:
        lease = float(agent_lease) if agent_lease and agent_lease > 0 else self.dispatch_lease_timeout
        return min(lease, MAX_LEASE_SECONDS)
