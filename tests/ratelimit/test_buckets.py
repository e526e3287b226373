"""Which bucket a rate-limited call counts against (RateLimitSpec.bucket): one function, used by
the step path that hits the limiter and by the shadow that peeks it, so both name the same key."""

from __future__ import annotations

import pytest

from kernel.domain.decision import RateLimitSpec


@pytest.mark.parametrize(("per_what", "session", "key"), [
    ("execution", "s-1", "r:exec:e-1"),
    ("session", "s-1", "r:session:s-1"),
    ("session", None, "r:exec:e-1"),  # an execution without a session is its own bucket
    ("agent", "s-1", "r:agent:a-1"),
    ("global", None, "r:global"),
])
def test_a_rules_bucket_follows_its_per_what(per_what: str, session: str | None, key: str) -> None:
    spec = RateLimitSpec(max_calls=2, window_seconds=60, per_what=per_what)
    assert spec.bucket("r", "a-1", "e-1", session) == key
