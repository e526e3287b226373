"""How Regent's uvicorn servers (`regent serve`, `regent gateway`) read requests off the wire:
uvicorn's httptools protocol, with three guards it does not have.

- **A deadline on each request.** uvicorn bounds the idle time between keep-alive requests only,
  and any byte received cancels that: a connection that sends nothing, or a request's headers or
  body a byte at a time, is held open for as long as its client likes, and a few thousand of them
  use up the process's file descriptors. Here each request must arrive whole (request line,
  headers and body) within `read_timeout` of the connection opening or of the previous response
  ending; otherwise the connection is closed. A request that has arrived may take as long as its
  answer needs (an event stream stays open).
- **A bound on a request's headers.** httptools buffers a header until it ends, however long: one
  request with a 64 MB header line was accepted, and grew the process by 64 MB. Past
  `max_header_bytes` (request line and headers) the answer is 431 and the connection is closed.
- **The error envelope.** A request the parser refuses is answered 400 with the API's
  `{code, message}` body instead of uvicorn's plain text.

Both answers close the connection (docs/api.md): after them the server cannot tell where the next
request on the stream begins, so reading on could only misparse it. Errors the API answers keep it.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

from kernel.api.errors import error_response
from kernel.errors import CODE_TO_STATUS

log = logging.getLogger("kernel.api")

MAX_HEADER_BYTES = 64 * 1024
_END_OF_HEADERS = b"\r\n\r\n"
# Headers past the bound: the one status outside the error table, since no route answers it (the
# request never reaches the app); its body is the table's validation_error envelope.
_HEADERS_TOO_LARGE = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE


def _raw_response(message: str, status: int = CODE_TO_STATUS["validation_error"]) -> bytes:
    """A whole HTTP/1.1 answer in the API's envelope, written before the request reached the app."""
    body = bytes(error_response("validation_error", f"validation error: {message}").body)  # as the API renders it
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def guarded_protocol(read_timeout: float, max_header_bytes: int = MAX_HEADER_BYTES) -> Any:
    """The `http=` protocol class for uvicorn.Config ("auto", unguarded, when httptools is not
    installed). `read_timeout` 0 turns the deadline off; the header bound always applies."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        log.warning("httptools is not installed: requests are read without a deadline or a header bound")
        return "auto"

    too_large = _raw_response(f"the request line and headers are over {max_header_bytes} bytes", _HEADERS_TOO_LARGE)

    class GuardedProtocol(HttpToolsProtocol):  # type: ignore[misc]
        deadline: asyncio.TimerHandle | None = None
        header_bytes = -1  # bytes of the current request's line and headers so far; -1: not reading them
        tail = b""  # the last bytes seen, so an end of headers split across two reads is found
        # The current request's body has arrived whole. An answer may go out before (a 401, a body
        # over the limit): the rest of the body then still arrives, and is not the next request's
        # headers — counted as such, a 200 KB body made the next request a 431.
        body_read = True
        next_after_body = False  # the answer went out first: start the next request once it has

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._next_request()

        def data_received(self, data: bytes) -> None:
            if self.header_bytes >= 0:
                seen = self.tail + data
                end = seen.find(_END_OF_HEADERS)
                self.header_bytes += len(data) if end < 0 else end + len(_END_OF_HEADERS) - len(self.tail)
                if self.header_bytes > max_header_bytes:
                    self.transport.write(too_large)
                    self.transport.close()
                    return
                if end >= 0:
                    self.header_bytes = -1  # the rest is this request's body (or the next request)
                    self.body_read = False
                else:
                    self.tail = seen[-3:]
            super().data_received(data)

        def on_message_complete(self) -> None:
            self._disarm()  # the request is read: its handler may take as long as it takes
            self.body_read = True
            super().on_message_complete()
            if self.next_after_body and not self.transport.is_closing():
                self.next_after_body = False
                self._next_request()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # a pipelined request is already read whole
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                if self.body_read:
                    self._next_request()  # on this keep-alive connection
                else:  # the rest of the body is still to come, within the same deadline
                    self.next_after_body = True
                    self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(_raw_response(msg))
            self.transport.close()

        def _next_request(self) -> None:
            self.header_bytes, self.tail = 0, b""
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            if read_timeout > 0:
                self.deadline = self.loop.call_later(read_timeout, self._expired)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expired(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedProtocol
