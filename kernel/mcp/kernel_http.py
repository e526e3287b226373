"""The separate gateway's step calls into the kernel (submit, complete, fail, heartbeat): HTTP/1.1
POSTs over kept-alive asyncio streams, instead of httpx.

Why: a tools/call through `regent mcp serve` makes two signed kernel requests, and httpx spent
more CPU on each (URL parsing and merging, header models, cookie extraction, the httpcore pool's
locks and anyio cancel scopes) than the kernel spends serving it: 45 % of the gateway's CPU per
call in a yappi profile (1,010 calls, bench/journal/2026-12-05-mcp-gateway.md). These requests
go to one origin (the kernel), carry a JSON body with a Content-Length, and read a JSON answer,
so this needs none of that: h11 (the HTTP/1.1 state machine under httpx) frames the request and
reads the answer over an asyncio stream. Anything else (an https:// kernel, executions, tool
reports) stays on httpx. Failures are raised as httpx's errors, which the callers already handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx

# An idle connection older than this is closed rather than reused: uvicorn closes a kept-alive
# connection after 5 s idle (`timeout_keep_alive`), and a request written as it closes is lost.
_IDLE_SECONDS = 2.0
_MAX_IDLE = 32
_MAX_HEADERS = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024
_READ = 64 * 1024


@dataclass(frozen=True, slots=True)
class Answer:
    """What the gateway reads of an answer (`kernel.mcp.leases.Reply`)."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Conn:
    __slots__ = ("h11", "reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.used = reader, writer, time.monotonic()
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEADERS)

    def reusable(self) -> bool:
        return (self.h11.our_state is h11.IDLE and not self.reader.at_eof() and not self.writer.is_closing()
                and time.monotonic() - self.used < _IDLE_SECONDS)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class KernelHttp:
    """POSTs to one plain-HTTP origin, on a small pool of kept-alive connections."""

    def __init__(self, base_url: str, timeout: float = 30.0):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"not a plain http:// URL: {base_url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host = f"{host}:{self.port}" if u.port else host
        self._idle: list[_Conn] = []

    @classmethod
    def of(cls, base_url: str, timeout: float = 30.0) -> KernelHttp | None:
        """The client for `base_url`, or None when it is not plain http:// (httpx serves it)."""
        try:
            return cls(base_url, timeout)
        except ValueError:
            return None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        fields = [("Host", self._host), *headers.items(), ("Accept", "*/*"), ("Content-Length", str(len(body)))]
        conn = self._take()
        try:
            async with asyncio.timeout(self.timeout):
                if conn is None:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    conn = _Conn(reader, writer)
                c = conn.h11
                conn.writer.write(c.send(h11.Request(method="POST", target=self.prefix + path, headers=fields))
                                  + (c.send(h11.Data(data=body)) or b"") + (c.send(h11.EndOfMessage()) or b""))
                status, content = await _read_answer(conn)
        except TimeoutError:
            if conn is not None:
                conn.close()
            raise httpx.ReadTimeout("the kernel did not answer in time") from None
        except (OSError, h11.ProtocolError, ValueError) as e:
            if conn is not None:
                conn.close()
            if conn is None:
                raise httpx.ConnectError(f"cannot connect to the kernel: {e}") from None
            raise httpx.ReadError(f"the kernel's answer was cut short or malformed: {type(e).__name__}") from None
        except BaseException:  # cancelled mid-exchange: the connection's state is unknown
            if conn is not None:
                conn.close()
            raise
        keep = conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE
        if keep:
            conn.h11.start_next_cycle()
        if keep and len(self._idle) < _MAX_IDLE:
            conn.used = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        return Answer(status, content)

    def _take(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable():
                return conn
            conn.close()
        return None

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


async def _read_answer(conn: _Conn) -> tuple[int, bytes]:
    """(status, body) of one answer, read through the connection's h11 state machine (interim 1xx
    answers skipped); at most _MAX_BODY bytes of body."""
    c, status, out = conn.h11, 0, bytearray()
    while True:
        event = c.next_event()
        if event is h11.NEED_DATA:
            data = await conn.reader.read(_READ)
            c.receive_data(data)  # b"" is the end of the stream: h11 raises if the answer is cut short
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            out += event.data
            if len(out) > _MAX_BODY:
                raise ValueError("body too long")
        elif isinstance(event, h11.EndOfMessage):
            return status, bytes(out)
        elif isinstance(event, h11.ConnectionClosed):
            raise ValueError("the connection closed before the answer ended")
