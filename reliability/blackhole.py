"""A loopback webhook that can be a black hole: it accepts TCP and reads each request but never
answers until `recover()`; then it answers 200 to what it held and to everything after. Records
when each execution's webhook arrived (first arrival), and how many connections it holds.

Used by the dispatch fairness checks (tests/core/test_dispatch_fairness.py, `regent chaos` D1)
and reusable by any harness that needs an agent host that hangs: `with Webhook(answer=False) as
bh: … bh.url … bh.recover()`. Every connection lives at most `max_seconds`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Webhook:
    def __init__(self, *, answer: bool = True, max_seconds: float = 300.0) -> None:
        self.answering = answer
        self.max_seconds = max_seconds
        self.arrivals: dict[str, float] = {}  # execution id → time.time() of its first webhook
        self.answered: dict[str, float] = {}  # execution id → when a 200 was first sent for it
        self.requests = 0
        self.open = 0
        self.max_open = 0
        self._loop = asyncio.new_event_loop()
        self._recovered: asyncio.Event | None = None
        self._ready = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._main, name="webhook-blackhole", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the webhook did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhook"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._recovered = asyncio.Event()
            if self.answering:
                self._recovered.set()
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
            self.port = self._server.sockets[0].getsockname()[1]

        self._loop.run_until_complete(start())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            async with asyncio.timeout(self.max_seconds):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value.strip())
                    body = await reader.readexactly(length)
                    self.requests += 1
                    eid = self._note(body)
                    if not await self._held(reader):
                        return  # the client gave up (closed its end) while it was held
                    writer.write(ANSWER)
                    await writer.drain()
                    if eid is not None:
                        self.answered.setdefault(eid, time.time())
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def _held(self, reader: asyncio.StreamReader) -> bool:
        """The black hole: wait until recovered (True), noticing meanwhile a client that closes
        its end (False), so `open` counts only connections the client still holds."""
        assert self._recovered is not None
        if self._recovered.is_set():
            return True
        recovered = asyncio.ensure_future(self._recovered.wait())
        eof = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait({recovered, eof}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            recovered.cancel()
            eof.cancel()
            # The cancelled read must be over before the connection's next read starts.
            await asyncio.gather(recovered, eof, return_exceptions=True)
        return recovered.done() and not recovered.cancelled() and not (eof.done() and not eof.cancelled())

    def _note(self, body: bytes) -> str | None:
        try:
            eid = json.loads(body).get("execution_id")
        except (ValueError, AttributeError):
            return None
        if not isinstance(eid, str):
            return None
        self.arrivals.setdefault(eid, time.time())
        return eid

    def recover(self) -> None:
        """Answer 200 from now on, including the requests held so far."""
        self.answering = True
        assert self._recovered is not None
        self._loop.call_soon_threadsafe(self._recovered.set)

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Webhook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
