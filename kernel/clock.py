"""The kernel's clock: the core takes one so tests advance time instead of sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: datetime | None = None):
        self._now = start or datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    def set(self, when: datetime) -> None:
        self._now = when


def unix_seconds() -> int:
    return int(time.time())


def rfc3339(when: datetime) -> str:
    """RFC 3339 in UTC with microsecond fraction, `Z` suffix (Rebuno's JSON timestamps)."""
    if when.tzinfo is not UTC:
        when = when.astimezone(UTC)
    # isoformat of the naive value: the same text as strftime("%Y-%m-%dT%H:%M:%S.%fZ") for years
    # 1000-9999, in a third less time (a step's policy input formats two).
    return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
