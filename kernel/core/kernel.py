"""The use cases' shared context: store, clock, policy, limiter and the kernel's knobs."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

from kernel.clock import Clock, SystemClock
from kernel.core.ports import Limiter, NoLimiter, PermissiveResolver, PolicyResolver
from kernel.store import SqlStore


@dataclass
class Kernel:
    store: SqlStore
    clock: Clock = field(default_factory=SystemClock)
    policy: PolicyResolver = field(default_factory=PermissiveResolver)
    limiter: Limiter = field(default_factory=NoLimiter)
    replica_id: str = "regent"
    dispatch_max_attempts: int = 5
    dispatch_base_delay: float = 1.0
    dispatch_max_delay: float = 30.0
    dispatch_lease_timeout: float = 120.0
    approval_timeout: float = 900.0
    deadline_timeout: float | None = None
    retention: float = 86400.0
    rng: random.Random = field(default_factory=random.Random)

    def backoff(self, attempt: int) -> timedelta:
        """min(base × 2^(attempt−1), max) plus uniform jitter in [0, 25 %)."""
        base = min(self.dispatch_base_delay * (2 ** max(attempt - 1, 0)), self.dispatch_max_delay)
        return timedelta(seconds=base + self.rng.uniform(0, 0.25 * base))

    def lease_seconds(self, agent_lease: int | None) -> float:
        return float(agent_lease) if agent_lease else self.dispatch_lease_timeout
