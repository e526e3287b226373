"""The decision log: entries handed off by the core after their transaction commits, masked,
encoded and shipped to the sinks by a background thread. The kernel's answer never waits on it.

`submit` is an append to a bounded buffer under a lock: when the buffer is full the entries are
dropped and counted, so a slow or broken sink costs the hot path nothing but that count.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kernel.decisionlog.mask import MaskRule, apply_masks
from kernel.decisionlog.sinks import HttpSink

log = logging.getLogger("kernel.decisionlog")

__all__ = ["DecisionLog", "DecisionLogCollector", "Sink", "encode_entry"]


class Sink(Protocol):
    name: str

    def write(self, lines: list[bytes]) -> None: ...

    def close(self) -> None: ...


def encode_entry(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")


class DecisionLog:
    """Bounded intake → one encoder thread (masks, encodes, writes the local sinks, hands the
    HTTP sink its lines; the HTTP sink uploads from a thread of its own)."""

    enabled = True

    def __init__(self, sinks: list[Any], *, masks: tuple[MaskRule, ...] = (), buffer_size: int = 10_000,
                 labels: dict[str, str] | None = None):
        self.sinks = sinks
        self.masks = masks
        self.buffer_size = max(1, buffer_size)
        self.labels = labels or {}
        self._intake: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.accepted = 0
        self.written: dict[str, int] = {s.name: 0 for s in sinks}
        self.dropped: dict[tuple[str, str], int] = {}
        self._last_error_log = 0.0
        for s in sinks:
            if isinstance(s, HttpSink):
                s._on_drop = self.count_drop

    # Producer side: the core, after commit --------------------------------------------------
    def submit(self, entries: list[dict[str, Any]]) -> None:
        """Never blocks on a sink and never raises."""
        over = 0
        with self._lock:
            room = self.buffer_size - len(self._intake)
            if room < len(entries):
                over = len(entries) - max(room, 0)
                entries = entries[: max(room, 0)]
            self._intake.extend(entries)
            self.accepted += len(entries)
        if over:
            self.count_drop("intake", "buffer_full", over)
        self._wake.set()

    def count_drop(self, sink: str, reason: str, n: int) -> None:
        with self._lock:
            self.dropped[(sink, reason)] = self.dropped.get((sink, reason), 0) + n

    def buffered(self) -> int:
        return len(self._intake)

    # The encoder thread --------------------------------------------------------------------
    def start(self) -> None:
        for s in self.sinks:
            if isinstance(s, HttpSink):
                s.start()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Write what is buffered (bounded), then close the sinks."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._drain()
        for s in self.sinks:
            try:
                s.close()
            except Exception:  # a sink that cannot close must not stop the others
                log.exception("closing decision-log sink %s", s.name)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            self._drain()

    def _take(self, n: int) -> list[dict[str, Any]]:
        with self._lock:
            out: list[dict[str, Any]] = []
            while self._intake and len(out) < n:
                out.append(self._intake.popleft())
            return out

    def _drain(self) -> None:
        while True:
            batch = self._take(500)
            if not batch:
                return
            lines = []
            for entry in batch:
                try:
                    if self.labels:
                        entry = {**entry, "labels": self.labels}
                    lines.append(encode_entry(apply_masks(entry, self.masks)))
                except Exception:  # an entry that cannot be encoded is dropped, never shipped raw
                    self.count_drop("intake", "encode_error", 1)
            for s in self.sinks:
                try:
                    s.write(lines)
                    self.written[s.name] = self.written.get(s.name, 0) + len(lines)
                except Exception as exc:
                    self.count_drop(s.name, "write_error", len(lines))
                    now = time.monotonic()
                    if now - self._last_error_log > 60:
                        self._last_error_log = now
                        log.error("decision-log sink %s failed: %s", s.name, exc)

    def stats(self) -> dict[str, Any]:
        """What /metrics shows."""
        with self._lock:
            dropped = dict(self.dropped)
        buffered = {"intake": len(self._intake)}
        for s in self.sinks:
            if isinstance(s, HttpSink):
                buffered["http"] = s.buffered()
        return {"accepted": self.accepted, "written": dict(self.written), "dropped": dropped,
                "buffered": buffered}


class DecisionLogCollector(Collector):
    """The decision log's counters, read at scrape time."""

    def __init__(self, dl: DecisionLog):
        self.dl = dl

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        st = self.dl.stats()
        yield CounterMetricFamily("regent_decision_log_entries", "Decision-log entries accepted "
                                  "from the core.", value=st["accepted"])
        written = CounterMetricFamily("regent_decision_log_written", "Decision-log entries handed "
                                      "to each sink (for http: buffered for upload).", labels=["sink"])
        for sink, n in sorted(st["written"].items()):
            written.add_metric([sink], n)
        yield written
        dropped = CounterMetricFamily("regent_decision_log_dropped", "Decision-log entries dropped, by "
                                      "where (intake, file, stdout, http) and why (buffer_full, "
                                      "write_error, rejected, encode_error, shutdown).",
                                      labels=["sink", "reason"])
        for (sink, reason), n in sorted(st["dropped"].items()):
            dropped.add_metric([sink, reason], n)
        yield dropped
        buffered = GaugeMetricFamily("regent_decision_log_buffered", "Decision-log entries waiting, "
                                     "by buffer (intake, http).", labels=["buffer"])
        for name, n in sorted(st["buffered"].items()):
            buffered.add_metric([name], n)
        yield buffered
        for s in self.dl.sinks:
            if isinstance(s, HttpSink):
                yield CounterMetricFamily("regent_decision_log_uploads_failed", "Failed decision-log "
                                          "uploads (each is retried with backoff).",
                                          value=s.uploads_failed)
                yield CounterMetricFamily("regent_decision_log_shipped", "Decision-log entries the "
                                          "HTTP endpoint accepted.", value=s.shipped)
