"""Rate limiting: the only package that talks to `limits` (RateLimitSpec → limits item + storage)."""

from kernel.ratelimit.limiter import (
    LimitsLimiter,
    async_storage_uri,
    rate_limit_item,
    window_seconds,
)

__all__ = ["LimitsLimiter", "async_storage_uri", "rate_limit_item", "window_seconds"]
