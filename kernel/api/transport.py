"""A deadline on reading each request, for the uvicorn servers Regent runs (`regent serve`, `regent
gateway`).

uvicorn bounds the idle time between keep-alive requests only, and any byte received cancels that:
a connection that sends nothing, or sends a request's headers or body a byte at a time, is held
open for as long as its client likes. A few thousand of them use up the process's file descriptors
and every other client is refused. Here each request must arrive whole (request line, headers and
body) within `seconds` of the connection opening or of the previous response ending; otherwise
the connection is closed. Requests whose reading is done are not affected, however long their
response takes (an event stream stays open).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("kernel.api")


def read_deadline_protocol(seconds: float) -> Any:
    """The `http=` protocol class for uvicorn.Config: uvicorn's httptools protocol with the
    deadline; "auto" (no deadline) when `seconds` is 0 or httptools is not installed."""
    if seconds <= 0:
        return "auto"
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        log.warning("httptools is not installed: requests are read without a deadline")
        return "auto"

    class ReadDeadlineProtocol(HttpToolsProtocol):  # type: ignore[misc]
        deadline: asyncio.TimerHandle | None = None
        closed_slow = 0  # connections closed by the deadline, in this process (tests, /metrics)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_complete(self) -> None:
            self._disarm()  # the request is read: its handler may take as long as it takes
            super().on_message_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # a pipelined request is already read whole
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self._arm()  # the next request on this keep-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expired(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                type(self).closed_slow += 1
                self.transport.close()

    return ReadDeadlineProtocol
