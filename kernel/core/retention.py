"""Retention passes: delete rows past their cutoff in bounded batches, one transaction a batch,
sized and paced so that the requests' writes never wait long behind them."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from kernel.core.kernel import Kernel
from kernel.core.store_ports import Transaction

MAX_BATCHES = 500  # a retention pass deletes at most this many batches ...
PASS_SECONDS = 30.0  # ... or for about this long; the next tick goes on
# A batch's size follows its duration: each batch is resized so that it takes about TARGET_SECONDS,
# between MIN_BATCH rows and the caller's batch. On SQLite a batch holds the file's one write lock,
# so a step's commit that arrives during it waits for the rest of it; on PostgreSQL a batch's
# WAL is flushed with the commits that follow it. In the store of 10^6 executions (bench/scale.py)
# 200 executions took 52-65 ms to delete on SQLite (their ~2 200 events, 400 steps and the index
# entries), 20 took 4 ms; 1 000 decision records 38 ms, 200 took 3 ms. Under 8 stepping workers a
# commit waits for the rest of a batch, so the round trip's p99 grows by about one batch: batches
# of 15 ms gave 2.06× on a machine whose p99 without retention was 20 ms (the full scale run,
# 2026-12-05 20:14-20:43), batches of 5 ms 0.99× (28.7 / 29.0 ms) at the same rate, ~320 executions
# deleted a second (the fixed cost of a batch is small on SQLite).
# On PostgreSQL no batch holds a lock a step needs (row locks on rows no step reads), so a batch may
# run longer there: what it costs the steps is its share of the CPU and the WAL, which the pause
# bounds. Batches of 10 executions took 8-12 ms on PostgreSQL (nine statements and a commit), so
# at a 15 ms target the pass deleted 71 executions a second under 8 stepping workers, against 660
# with batches of 200 and the same round-trip p99 (0.81× against 0.64×, load 3-6).
TARGET_SECONDS = 0.005
TARGET_SECONDS_SHARED = 0.050
MIN_BATCH = 10
# Between two batches the pass waits PAUSE_FACTOR times as long as the last one took (at most
# YIELD_MAX seconds): retention takes a quarter of the time at most, and the writes queued behind a
# batch go first. A thread that releases a lock and takes it again at once keeps it (the waiters are
# woken, the releasing thread holds the GIL): without the pause a pass's batches ran back to back
# and the requests' writes queued behind all of them. With 10^5 expired executions in a store of
# 10^6 under 8 stepping workers the round trip's p99 was 1.66× the one without retention with
# batches of 200 back to back, 1.33× on SQLite (2.44× on PostgreSQL) with batches of 200 and a
# pause as long as the batch.
PAUSE_FACTOR = 1.0
YIELD_MAX = 1.0


def target_seconds(k: Kernel) -> float:
    """How long a batch should take on this store: short where it holds the one write lock."""
    return TARGET_SECONDS if k.store.dialect == "sqlite" else TARGET_SECONDS_SHARED


def next_size(size: int, took: float, most: int, target: float = TARGET_SECONDS) -> int:
    """The next batch's size: scaled towards `target` seconds by the last batch's duration, at
    most doubled at once, between MIN_BATCH and `most`."""
    if took <= 0:
        return min(most, size * 2)
    scaled = round(size * target / took)
    return max(min(MIN_BATCH, most), min(most, size * 2, scaled))


def delete_in_batches(k: Kernel, delete: Callable[[Transaction, datetime, int], int], cutoff: datetime, batch: int,
                      max_batches: int = MAX_BATCHES) -> int:
    """Run `delete(tx, cutoff, size)` in a transaction of its own until it deletes fewer than
    `size` rows, `max_batches` have run or PASS_SECONDS have passed; the rows deleted in all.
    `size` starts at a tenth of `batch` and follows each batch's duration (`next_size`,
    towards `target_seconds`)."""
    total, took, target = 0, 0.0, target_seconds(k)
    size = max(min(MIN_BATCH, batch), batch // 10)
    started = time.monotonic()
    for i in range(max_batches):
        if i:
            if time.monotonic() - started > PASS_SECONDS:
                break
            time.sleep(min(took * PAUSE_FACTOR, YIELD_MAX))
            size = next_size(size, took, batch, target)
        t0 = time.monotonic()
        with k.store.transaction() as tx:
            n = delete(tx, cutoff, size)
        took = time.monotonic() - t0
        total += n
        if n < size:
            break
    return total
