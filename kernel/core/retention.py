"""Retention passes: delete rows past their cutoff in bounded batches, one transaction a batch."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from kernel.core.kernel import Kernel
from kernel.core.store_ports import Transaction

MAX_BATCHES = 100  # a retention pass deletes at most this many batches; the next tick goes on


def delete_in_batches(k: Kernel, delete: Callable[[Transaction, datetime, int], int], cutoff: datetime, batch: int,
                      max_batches: int = MAX_BATCHES) -> int:
    """Run `delete(tx, cutoff, batch)` in a transaction of its own until it deletes fewer than
    `batch` rows or `max_batches` have run; the rows deleted in all."""
    total = 0
    for _ in range(max_batches):
        with k.store.transaction() as tx:
            n = delete(tx, cutoff, batch)
        total += n
        if n < batch:
            break
    return total
