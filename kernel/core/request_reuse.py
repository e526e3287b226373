"""Signed agent mutations already seen: the replay guard (docs/api.md, Replayed requests)."""

from __future__ import annotations

import heapq
import threading
import time
from datetime import UTC, datetime, timedelta

from kernel.core.kernel import Kernel

# How often a replica deletes expired rows from the shared table (PostgreSQL), at most.
PURGE_EVERY_SECONDS = 30.0


class ReplayGuard:
    """(agent id, timestamp, signature) of each signed mutation this replica accepted, kept until
    its timestamp leaves the signature window (after that the timestamp check refuses it anyway).

    Bounded by `max_entries`. When full, the entry with the oldest timestamp is dropped and its
    timestamp becomes the floor: a mutation signed at or before the floor is refused from then on,
    so a dropped entry can never be replayed (fail closed). Under more signed traffic than the bound
    holds over one window, the accepted window narrows instead of letting replays through.
    """

    def __init__(self, window_seconds: int = 300, max_entries: int = 200_000):
        if max_entries < 1:
            raise ValueError("the replay cache needs room for at least one entry")
        self.window = window_seconds
        self.max_entries = max_entries
        self.floor: int | None = None
        self.refused = 0  # repeats refused by this replica (/metrics)
        self._seen: set[tuple[int, str, str]] = set()
        self._by_time: list[tuple[int, str, str]] = []  # min-heap by timestamp
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def count_refused(self) -> None:
        """A repeat refused elsewhere (the shared record), counted here for /metrics."""
        with self._lock:
            self.refused += 1

    def first_sight(self, agent_id: str, timestamp: int, signature: str, now_unix: int) -> bool:
        """Record the request; False when it was seen before (or is at or below the floor)."""
        key = (timestamp, agent_id, signature)  # ordered by timestamp for the heap
        with self._lock:
            heap = self._by_time
            while heap and heap[0][0] < now_unix - self.window:
                self._seen.discard(heapq.heappop(heap))
            if key in self._seen or (self.floor is not None and timestamp <= self.floor):
                self.refused += 1
                return False
            while len(self._seen) >= self.max_entries:
                oldest = heapq.heappop(heap)
                self._seen.discard(oldest)
                self.floor = oldest[0] if self.floor is None else max(self.floor, oldest[0])
            if self.floor is not None and timestamp <= self.floor:
                self.refused += 1
                return False
            self._seen.add(key)
            heapq.heappush(heap, key)
            return True


class SharedReplays:
    """The replicas' common record, a table in the store they share (PostgreSQL): an insert that
    finds the row already there is a repeat some replica accepted."""

    def __init__(self, window_seconds: int = 300):
        self.window = window_seconds
        self._purged_at = float("-inf")
        self._lock = threading.Lock()

    def first_sight(self, k: Kernel, agent_id: str, timestamp: int, signature: str) -> bool:
        expires = datetime.fromtimestamp(timestamp + self.window + 1, UTC)
        with k.store.autocommit() as tx:  # one statement: on PostgreSQL, no BEGIN and COMMIT round trips
            fresh = tx.record_request_signature(agent_id, timestamp, signature, expires)
        self._purge(k)
        return fresh

    def _purge(self, k: Kernel) -> None:
        with self._lock:
            if time.monotonic() - self._purged_at < PURGE_EVERY_SECONDS:
                return
            self._purged_at = time.monotonic()
        with k.store.transaction() as tx:
            tx.purge_request_signatures(datetime.now(UTC) - timedelta(seconds=1))
