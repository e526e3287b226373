"""Fan-out across replicas through one PostgreSQL LISTEN/NOTIFY channel (rebuno-v0 §10).

Each replica holds two connections of its own (not from the store's pool): one LISTENs on
`rebuno_stream` and hands every notification to the replica's in-process subscribers; one sends
this replica's deltas with `pg_notify`. A replica hears its own notifications too, so local and
remote subscribers see one order: the order PostgreSQL delivered them in.

Best-effort by contract, and never in the producer's way:

- `publish` only enqueues (a bounded queue; full → the delta is dropped and counted);
- a payload over PostgreSQL's 8000-byte NOTIFY limit (7000 bytes of data can grow when JSON
  escapes quotes or control characters) is dropped and counted;
- a lost connection is re-opened with capped backoff; deltas sent while no replica listens are
  lost, as the spec says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg

from kernel.stream.broker import InProcessBroker

log = logging.getLogger("regent.stream")

CHANNEL = "rebuno_stream"
NOTIFY_LIMIT = 7999  # bytes; PostgreSQL rejects payloads of 8000 and more
SEND_QUEUE = 1024


def _plain_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


class PostgresBroker:
    """A `StreamBroker` for several replicas on one PostgreSQL. `start()`/`stop()` on the app's loop."""

    def __init__(self, url: str, buffer: int | None = None, retry_max_seconds: float = 5.0):
        self.url = _plain_url(url)
        self.local = InProcessBroker() if buffer is None else InProcessBroker(buffer)
        self.retry_max_seconds = retry_max_seconds
        self.dropped = 0  # deltas this replica could not send
        self._outbox: asyncio.Queue[str] = asyncio.Queue(SEND_QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = asyncio.Event()

    # -- the StreamBroker protocol --------------------------------------------------------------
    def publish(self, execution_id: str, message: dict[str, Any]) -> None:
        payload = json.dumps({"execution_id": execution_id, **message}, ensure_ascii=False,
                             separators=(",", ":"))
        try:
            size = len(payload.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate in `data`: relayed as its \uXXXX escape
            payload = json.dumps({"execution_id": execution_id, **message}, separators=(",", ":"))
            size = len(payload)
        if size > NOTIFY_LIMIT:
            self.dropped += 1
            return
        try:
            self._outbox.put_nowait(payload)
        except asyncio.QueueFull:
            self.dropped += 1

    @contextlib.contextmanager
    def subscribe(self, execution_id: str) -> Iterator[asyncio.Queue[dict[str, Any]]]:
        with self.local.subscribe(execution_id) as q:
            yield q

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, ready_timeout: float = 10.0) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="regent-stream-listen"),
                       asyncio.create_task(self._send(), name="regent-stream-send")]
        # Serve only once this replica hears the channel; a replica that cannot reach the
        # database keeps retrying in the background (the kernel itself would not be ready either).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), ready_timeout)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=5)

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await self._connect()
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    delay = 0.1
                    async for note in conn.notifies():
                        self._deliver(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._listening.clear()
                log.warning("stream listener lost PostgreSQL (%s); retrying in %.1fs", type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_seconds)

    def _deliver(self, payload: str) -> None:
        try:
            msg = json.loads(payload)
            execution_id = msg.pop("execution_id")
        except (ValueError, KeyError, AttributeError, TypeError):
            return  # not ours
        self.local.publish(str(execution_id), msg)

    async def _send(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await self._connect()
                async with conn:
                    delay = 0.1
                    while True:
                        payload = await self._outbox.get()
                        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.dropped += 1  # the delta in hand is lost; best-effort
                log.warning("stream sender lost PostgreSQL (%s); retrying in %.1fs", type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_seconds)


def postgres_stream_hook(url: str) -> Any:
    """An app lifespan hook (see `create_app`): installs the broker, returns its stop."""

    async def hook(app: Any) -> Any:
        broker = PostgresBroker(url)
        await broker.start()
        app.state.stream_broker = broker
        return broker.stop

    return hook
