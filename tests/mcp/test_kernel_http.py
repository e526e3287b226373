"""The separate gateway's own client for its signed step calls (kernel/mcp/kernel_http.py): kept-alive
connections reused, the answer's framings read, failures raised as httpx's errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from kernel.mcp.kernel_http import KernelHttp
from tests.support import free_port

Handler = Callable[[bytes, bytes], bytes]  # (request head, body) -> the raw answer


async def _serving(handler: Handler, go: Callable[[str, list[bytes]], Awaitable[Any]]) -> Any:
    """Run `go(url, heads)` against a loopback server answering each request with `handler`;
    `heads` collects the request heads, and an empty one for each connection accepted."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(b"")
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                heads.append(head)
                answer = handler(head, body)
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await go(f"http://127.0.0.1:{port}/prefix", heads)
    finally:
        server.close()


def _json(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


def test_requests_reuse_one_kept_alive_connection_and_carry_the_signed_headers() -> None:
    conns = 0

    async def go(url: str, heads: list[bytes]) -> list[Any]:
        nonlocal conns
        http = KernelHttp(url)
        out = []
        for i in range(3):
            r = await http.post(f"/v0/x/{i}", b'{"n": %d}' % i, {"Rebuno-Agent-Id": "a1"})
            out.append((r.status_code, r.json()))
        conns = heads.count(b"")
        await http.aclose()
        return out

    got = asyncio.run(_serving(lambda head, body: _json(body), go))
    assert got == [(200, {"n": 0}), (200, {"n": 1}), (200, {"n": 2})]
    assert conns == 1


def test_a_chunked_answer_and_a_closing_answer_are_read_whole() -> None:
    def handler(head: bytes, body: bytes) -> bytes:
        assert head.startswith(b"POST /prefix/v0/y HTTP/1.1\r\n") and b"rebuno-agent-id: a1" in head.lower()
        if b"chunked" in body:
            return b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"cod\r\n8\r\ne\": \"x\"}\r\n0\r\n\r\n"
        return _json(b'{"ok": true}', "connection: close\r\n")

    async def go(url: str, heads: list[bytes]) -> list[Any]:
        http = KernelHttp(url)
        a = await http.post("/v0/y", b"chunked", {"Rebuno-Agent-Id": "a1"})
        b = await http.post("/v0/y", b"close", {"Rebuno-Agent-Id": "a1"})
        c = await http.post("/v0/y", b"again", {"Rebuno-Agent-Id": "a1"})  # a new connection
        await http.aclose()
        return [(a.status_code, a.json()), (b.status_code, b.text), c.status_code]

    assert asyncio.run(_serving(handler, go)) == [(409, {"code": "x"}), (200, '{"ok": true}'), 200]


def test_an_unreachable_kernel_and_a_cut_answer_are_httpx_errors() -> None:
    async def refused() -> None:
        await KernelHttp(f"http://127.0.0.1:{free_port()}").post("/v0/z", b"{}", {})

    with pytest.raises(httpx.ConnectError):
        asyncio.run(refused())

    async def go(url: str, heads: list[bytes]) -> None:
        await KernelHttp(url).post("/v0/z", b"{}", {})

    with pytest.raises(httpx.ReadError):
        asyncio.run(_serving(lambda head, body: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\n{}", go))


def test_only_a_plain_http_kernel_gets_this_client() -> None:
    assert KernelHttp.of("https://kernel.example") is None
    assert KernelHttp.of("http://[::1]:8080") is not None


@pytest.mark.parametrize("answer", [
    b"NOT HTTP AT ALL\r\n\r\n",  # not a status line
    b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",  # a length h11 refuses
    b"HTTP/1.1 200 OK\r\nx: " + b"a" * 200_000,  # a head that goes on past 64 KiB
])
def test_a_malformed_answer_is_a_read_error_and_the_connection_is_not_reused(answer: bytes) -> None:
    """The answer is framed by h11: a kernel (or whatever answers on its port) that sends garbage
    gets an httpx.ReadError, never a hang or a crash, and the next request opens a new connection."""

    async def go(url: str, heads: list[bytes]) -> Any:
        http = KernelHttp(url, timeout=5.0)
        with pytest.raises(httpx.ReadError):
            await http.post("/v0/z", b"{}", {})
        assert http._idle == []
        await http.aclose()

    asyncio.run(_serving(lambda head, body: answer, go))
