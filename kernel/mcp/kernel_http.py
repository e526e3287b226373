"""The separate gateway's step calls into the kernel (submit, complete, fail, heartbeat): HTTP/1.1
POSTs over kept-alive asyncio streams, instead of httpx.

Why: a tools/call through `regent mcp serve` makes two signed kernel requests, and httpx spent
more CPU on each (URL parsing and merging, header models, cookie extraction, the httpcore pool's
locks and anyio cancel scopes) than the kernel spends serving it: 45 % of the gateway's CPU per
call in a yappi profile (1,010 calls, bench/journal/2026-12-05-mcp-gateway.md). These requests
go to one origin (the kernel), carry a JSON body with a Content-Length, and read a JSON answer,
so this needs none of that. Anything else (an https:// kernel, executions, tool reports) stays on
httpx. Failures are raised as httpx's errors, which the callers already handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

# An idle connection older than this is closed rather than reused: uvicorn closes a kept-alive
# connection after 5 s idle (`timeout_keep_alive`), and a request written as it closes is lost.
_IDLE_SECONDS = 2.0
_MAX_IDLE = 32
_MAX_HEADERS = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


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
    __slots__ = ("reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.used = reader, writer, time.monotonic()

    def reusable(self) -> bool:
        return (not self.reader.at_eof() and not self.writer.is_closing()
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
        self._host_header = f"Host: {host}:{self.port}\r\n" if u.port else f"Host: {host}\r\n"
        self._idle: list[_Conn] = []

    @classmethod
    def of(cls, base_url: str, timeout: float = 30.0) -> KernelHttp | None:
        """The client for `base_url`, or None when it is not plain http:// (httpx serves it)."""
        try:
            return cls(base_url, timeout)
        except ValueError:
            return None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST {self.prefix}{path} HTTP/1.1\r\n{self._host_header}{head}Accept: */*\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        conn = self._take()
        try:
            async with asyncio.timeout(self.timeout):
                if conn is None:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    conn = _Conn(reader, writer)
                conn.writer.write(request)
                status, keep, content = await _read_answer(conn.reader)
        except TimeoutError:
            if conn is not None:
                conn.close()
            raise httpx.ReadTimeout("the kernel did not answer in time") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            if conn is not None:
                conn.close()
            if conn is None:
                raise httpx.ConnectError(f"cannot connect to the kernel: {e}") from None
            raise httpx.ReadError(f"the kernel's answer was cut short: {type(e).__name__}") from None
        except BaseException:  # cancelled mid-exchange: the connection's state is unknown
            if conn is not None:
                conn.close()
            raise
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


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """(status, whether the connection may be reused, body) of one HTTP/1.1 answer."""
    while True:
        raw = await reader.readuntil(b"\r\n\r\n")
        if len(raw) > _MAX_HEADERS:
            raise ValueError("headers too long")
        lines = raw.decode("latin-1").split("\r\n")
        version, status_text = lines[0].split(" ", 2)[:2]
        status = int(status_text)
        if status >= 200:
            break  # an interim 1xx answer (100 Continue) is followed by the real one
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
    keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return status, keep, await _read_chunked(reader)
    length = fields.get("content-length")
    if length is not None:
        n = int(length)
        if n < 0 or n > _MAX_BODY:
            raise ValueError("bad content-length")
        return status, keep, await reader.readexactly(n)
    if status in (204, 304):
        return status, keep, b""
    return status, False, await reader.read(_MAX_BODY)  # until the kernel closes


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)
        if len(out) > _MAX_BODY:
            raise ValueError("body too long")
