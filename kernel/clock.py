"""The kernel's clock: the core takes one so tests advance time instead of sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from kernel.errors import invalid


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


def rfc3339(when: datetime) -> str:
    """RFC 3339 in UTC with microsecond fraction, `Z` suffix (Rebuno's JSON timestamps)."""
    if when.tzinfo is not UTC:
        when = when.astimezone(UTC)
    # isoformat of the naive value: the same text as strftime("%Y-%m-%dT%H:%M:%S.%fZ") for years
    # 1000-9999, in a third less time (a step's policy input formats two).
    return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(value: str, name: str, *, naive_is_utc: bool) -> datetime:
    """A time given from outside (RFC 3339; `Z` or an offset), in UTC. Without a zone it is UTC
    when `naive_is_utc` (the console's date-time fields), else refused. A time with no UTC
    equivalent (year 1 at +14:00, year 9999 at -14:00) is refused too, rather than overflowing
    in the store. ValidationError names `name` and quotes the value."""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(f"{name} {value!r} is not a date and time (RFC 3339)") from None
    if when.tzinfo is None:
        if not naive_is_utc:
            raise invalid(f"{name} {value!r} must carry a time zone (e.g. Z)")
        return when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except OverflowError:
        raise invalid(f"{name} {value!r} is out of range in UTC") from None
