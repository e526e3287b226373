"""Stream brokers: fan a delta out to the subscribers of its execution without ever blocking."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

SUBSCRIBER_BUFFER = 64  # rebuno-v0 §10: a full buffer drops new deltas


class StreamBroker(Protocol):
    def publish(self, execution_id: str, message: dict[str, Any]) -> None: ...

    def subscribe(self, execution_id: str) -> contextlib.AbstractContextManager[asyncio.Queue[dict[str, Any]]]: ...


class InProcessBroker:
    """One process's subscribers (SQLite runs one kernel per file). Must be used on one event loop."""

    def __init__(self, buffer: int = SUBSCRIBER_BUFFER):
        self.buffer = buffer
        self.subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self.dropped = 0

    def publish(self, execution_id: str, message: dict[str, Any]) -> None:
        for q in tuple(self.subscribers.get(execution_id, ())):
            try:
                q.put_nowait(message)
            except asyncio.QueueFull:
                self.dropped += 1  # the slow subscriber loses it; the producer never waits

    @contextlib.contextmanager
    def subscribe(self, execution_id: str) -> Iterator[asyncio.Queue[dict[str, Any]]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self.buffer)
        self.subscribers.setdefault(execution_id, set()).add(q)
        try:
            yield q
        finally:
            subs = self.subscribers.get(execution_id)
            if subs is not None:
                subs.discard(q)
                if not subs:
                    del self.subscribers[execution_id]
