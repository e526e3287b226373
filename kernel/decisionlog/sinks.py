"""Where decision-log entries go: a rotating local file, stdout, and an HTTP endpoint that
receives batched gzip POSTs (OPA's decision-log service protocol).

Entries reach a sink already masked and encoded as one JSON text each (`bytes`, no newline).
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO

import httpx

log = logging.getLogger("kernel.decisionlog")

__all__ = ["FileSink", "HttpSink", "StdoutSink"]
MAX_ANSWER_BYTES = 64 * 1024  # of a decision-log server's answer: read so its connection is reused, no more


class FileSink:
    """JSON lines appended to `path`; past `max_bytes` the file is renamed `path.1` (and `.1` to
    `.2`, ...), keeping `backups` old files."""

    name = "file"

    def __init__(self, path: str, max_bytes: int = 100 * 1024 * 1024, backups: int = 5):
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fh: BinaryIO | None = None
        self._size = 0

    def _open(self) -> BinaryIO:
        if self._fh is None:
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
            self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open between batches
            self._size = self._fh.tell()
        return self._fh

    def _rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.backups <= 0:
            os.remove(self.path)
            return
        for i in range(self.backups - 1, 0, -1):
            older = f"{self.path}.{i}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")

    def write(self, lines: list[bytes]) -> None:
        fh = self._open()
        for line in lines:
            if self._size > 0 and self._size + len(line) + 1 > self.max_bytes:
                fh.flush()
                self._rotate()
                fh = self._open()
            fh.write(line + b"\n")
            self._size += len(line) + 1
        fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class StdoutSink:
    """JSON lines on the process's standard output (the kernel's own messages go to stderr)."""

    name = "stdout"

    def __init__(self, stream: Callable[[], Any] | None = None):
        self._stream = stream or (lambda: sys.stdout)

    def write(self, lines: list[bytes]) -> None:
        out = self._stream()
        text = b"".join(line + b"\n" for line in lines).decode("utf-8")
        out.write(text)
        out.flush()

    def close(self) -> None:
        return None


class HttpSink:
    """Batched gzip POSTs of a JSON array of entries to `url`, from a thread of its own.

    The buffer holds at most `buffer_size` entries; when it is full the oldest entry is dropped
    and counted. A failed upload (connection error, timeout, 408, 429, 5xx) is retried with
    exponential backoff from `retry_min_delay` to `retry_max_delay` (plus up to 25 % jitter) and
    keeps its entries; any other answer drops the batch (counted as `rejected`).
    """

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        buffer_size: int = 10_000,
        batch_size: int = 500,
        batch_bytes: int = 1024 * 1024,
        flush_interval: float = 1.0,
        timeout: float = 10.0,
        retry_min_delay: float = 0.5,
        retry_max_delay: float = 30.0,
        on_drop: Callable[[str, str, int], None] | None = None,
    ):
        self.url = url
        self.buffer_size = max(1, buffer_size)
        self.batch_size = max(1, batch_size)
        self.batch_bytes = batch_bytes
        self.flush_interval = flush_interval
        self.retry_min_delay = retry_min_delay
        self.retry_max_delay = max(retry_max_delay, retry_min_delay)
        self._on_drop = on_drop or (lambda sink, reason, n: None)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip",
                   "User-Agent": "regent-decision-log"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self._upload_deadline = 2 * timeout  # the whole upload, answer included (httpx's is per read)
        self._buf: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rng = random.Random()
        self.uploads_ok = 0
        self.uploads_failed = 0
        self.shipped = 0
        self.last_error = ""

    # The producer side (the decision log's encoder thread) ---------------------------------
    def write(self, lines: list[bytes]) -> None:
        dropped = 0
        with self._cond:
            for line in lines:
                if len(self._buf) >= self.buffer_size:
                    self._buf.popleft()
                    dropped += 1
                self._buf.append(line)
            self._cond.notify()
        if dropped:
            self._on_drop(self.name, "buffer_full", dropped)

    def buffered(self) -> int:
        return len(self._buf)

    # The uploader ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decision-log-http", daemon=True)
            self._thread.start()

    def close(self, drain_seconds: float = 2.0) -> None:
        """Stop the uploader, after one last attempt of at most `drain_seconds` at what is
        buffered."""
        self._stop.set()
        with self._cond:
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=drain_seconds + 1.0)
            self._thread = None
        if self._buf:
            deadline = time.monotonic() + drain_seconds
            while self._buf and time.monotonic() < deadline:
                batch = self._take()
                if not self._upload(batch):
                    self._restore(batch)
                    break
        if self._buf:
            n = len(self._buf)
            self._buf.clear()
            self._on_drop(self.name, "shutdown", n)
        self._client.close()

    def _take(self) -> list[bytes]:
        with self._cond:
            batch: list[bytes] = []
            size = 2
            while self._buf and len(batch) < self.batch_size:
                nxt = self._buf[0]
                if batch and size + len(nxt) + 1 > self.batch_bytes:
                    break
                batch.append(self._buf.popleft())
                size += len(nxt) + 1
            return batch

    def _restore(self, batch: list[bytes]) -> None:
        """Put a failed batch back at the front, within the buffer's bound (oldest dropped)."""
        dropped = 0
        with self._cond:
            for line in reversed(batch):
                if len(self._buf) >= self.buffer_size:
                    dropped += 1  # the batch is older than anything buffered since
                    continue
                self._buf.appendleft(line)
        if dropped:
            self._on_drop(self.name, "buffer_full", dropped)

    def _upload(self, batch: list[bytes]) -> bool:
        """True when the batch is done with (sent, or rejected and dropped)."""
        body = gzip.compress(b"[" + b",".join(batch) + b"]", compresslevel=5)
        try:
            status = self._post(body)
        except httpx.HTTPError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if 200 <= status < 300:
            self.uploads_ok += 1
            self.shipped += len(batch)
            self.last_error = ""
            return True
        if status in (408, 429) or status >= 500:
            self._failed(f"HTTP {status}")
            return False
        self._failed(f"HTTP {status} (batch dropped)")
        self._on_drop(self.name, "rejected", len(batch))
        return True

    def _post(self, body: bytes) -> int:
        """The upload's status. The answer's body is not used: at most MAX_ANSWER_BYTES of it is
        read, and none once the upload has taken twice the timeout (a body that never ends)."""
        deadline = time.monotonic() + self._upload_deadline
        with self._client.stream("POST", self.url, content=body) as r:
            read = 0
            for chunk in r.iter_raw():
                read += len(chunk)
                if read > MAX_ANSWER_BYTES or time.monotonic() > deadline:
                    break  # leaving the block closes the connection rather than reading on
            return r.status_code

    def _failed(self, why: str) -> None:
        if why != self.last_error:
            log.warning("decision-log upload to %s failed: %s", self.url, why)
        self.uploads_failed += 1
        self.last_error = why

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            with self._cond:
                if len(self._buf) < self.batch_size:
                    self._cond.wait(timeout=self.flush_interval)
            if self._stop.is_set():
                return
            batch = self._take()
            if not batch:
                continue
            if self._upload(batch):
                failures = 0
                continue
            self._restore(batch)
            delay = min(self.retry_min_delay * (2 ** failures), self.retry_max_delay)
            failures += 1
            self._stop.wait(delay + self._rng.uniform(0, 0.25 * delay))
