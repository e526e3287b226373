"""Answers are gzip-compressed when the client asks and the body is worth it; event streams and the
agent's step answers never are (docs/api.md, "Compression")."""

from __future__ import annotations

import gzip
import socket

import httpx

from kernel import console
from kernel.api.app import GZIP_MIN_BYTES, create_app
from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

GZIP = {"Accept-Encoding": "gzip"}


def test_a_large_list_is_gzipped_when_the_client_asks(server: ServerThread, running: Running) -> None:
    for _ in range(20):
        running.start({"note": "x" * 100})
    with httpx.stream("GET", f"{server.url}/v0/executions?limit=50", headers=GZIP) as r:
        wire = b"".join(r.iter_raw())
        assert r.status_code == 200 and r.headers["content-encoding"] == "gzip", r.headers
        assert "accept-encoding" in r.headers["vary"].lower()
    plain = httpx.get(f"{server.url}/v0/executions?limit=50", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert gzip.decompress(wire) == plain.content
    assert len(wire) < len(plain.content) / 3


def test_a_small_answer_is_sent_as_it_is(server: ServerThread) -> None:
    with httpx.stream("GET", f"{server.url}/v0/health", headers=GZIP) as r:
        body = b"".join(r.iter_raw())
    assert len(body) < GZIP_MIN_BYTES and "content-encoding" not in r.headers
    assert r.status_code == 200 and body.startswith(b"{")


def test_a_step_answer_is_never_compressed(server: ServerThread, running: Running) -> None:
    eid, did, att = running.start()
    with AgentClient(server.url, running.agent_id, running.secret) as c:
        big = {"blob": "y" * 5000}  # an answer carries no args, but make sure size is not why
        r = c.lease(did, att).request("POST", f"/v0/executions/{eid}/steps",
                                      {"kind": "tool_call", "target": "t", "args": big})
    assert r.status_code == 200 and "content-encoding" not in r.headers


def test_an_event_stream_is_not_compressed_or_held_back(server: ServerThread, running: Running) -> None:
    """The first frame (`: ok`) arrives at once, in clear text, though the client accepts gzip: a
    compressing layer would hold it back waiting for more body."""
    eid, _, _ = running.start()
    got: list[bytes] = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(f"GET /v0/executions/{eid}/stream HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n".encode())
        buf = b""
        while b": ok" not in buf:
            chunk = s.recv(4096)
            assert chunk, buf
            buf += chunk
        got.append(buf)
    head = got[0].split(b"\r\n\r\n", 1)[0].lower()
    assert b"text/event-stream" in head and b"content-encoding" not in head, head


def test_a_console_page_is_gzipped(kernel: Kernel, running: Running) -> None:
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    console.install(app, dev=True, bearer_token="boot-token")  # as bootstrap.py mounts it
    for _ in range(30):
        running.start()
    with ServerThread(app) as server, httpx.stream("GET", f"{server.url}/console/executions", headers=GZIP) as r:
        wire = b"".join(r.iter_raw())
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert b"<html" in gzip.decompress(wire).lower()
