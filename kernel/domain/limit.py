"""What a rate limiter answers for one call: admitted, or how long until it would be."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LimitOutcome:
    admitted: bool
    wait_seconds: float = 0.0  # until one call is available again, when refused
    error: str | None = None  # the limiter could not be asked
