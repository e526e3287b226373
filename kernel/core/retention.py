"""Retention passes: delete rows past their cutoff in bounded batches, one transaction a batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from kernel.core.kernel import Kernel
from kernel.core.store_ports import Transaction

MAX_BATCHES = 100  # a retention pass deletes at most this many batches; the next tick goes on
# Between two batches the pass waits as long as the last one took (at most YIELD_MAX seconds). On
# SQLite every batch holds the file's one write lock, and a thread that releases a lock and takes
# it again at once keeps it (the waiters are woken, the releasing thread holds the GIL): the pass's
# batches ran back to back while the requests' writes queued behind all of them. With 10^5 expired
# executions in a store of 10^6 under 8 stepping workers the round trip's p99 was 1.66× the one
# without retention (bench/scale.py). Waiting a batch's time lets the queued writes go first, so a
# write waits for one batch at most, and retention takes at most half the write time.
YIELD_MAX = 0.25


def delete_in_batches(k: Kernel, delete: Callable[[Transaction, datetime, int], int], cutoff: datetime, batch: int,
                      max_batches: int = MAX_BATCHES) -> int:
    """Run `delete(tx, cutoff, batch)` in a transaction of its own until it deletes fewer than
    `batch` rows or `max_batches` have run; the rows deleted in all."""
    total, took = 0, 0.0
    for i in range(max_batches):
        if i:
            time.sleep(min(took, YIELD_MAX))
        t0 = time.monotonic()
        with k.store.transaction() as tx:
            n = delete(tx, cutoff, batch)
        took = time.monotonic() - t0
        total += n
        if n < batch:
            break
    return total
