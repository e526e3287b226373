"""One error handler for everything (issue 18 §0): an internal error is the envelope and keeps the
keep-alive connection; the router's 404 and 405 are enveloped too, 405 with the full `Allow`
list. Over real HTTP on loopback, on both stores."""

from __future__ import annotations

import socket

import httpx
from sqlalchemy import text

from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import ServerThread


def _poison(kernel: Kernel, eid: str) -> None:
    # A row the codec cannot read: reading this execution raises inside the use case (a real
    # internal error, not one a client's input can cause).
    with kernel.store.engine.begin() as c:
        c.execute(text("UPDATE executions SET status = 'bogus' WHERE id = :id"), {"id": eid})


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)  # a 204 has none
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_internal_error_is_the_envelope_and_keeps_the_connection(server: ServerThread, running: Running,
                                                                kernel: Kernel) -> None:
    eid, _, _ = running.start()
    _poison(kernel, eid)
    host, port = "127.0.0.1", server.port
    with socket.create_connection((host, port), timeout=10) as s:
        get = f"GET /v0/executions/{eid} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        s.sendall(get)
        head = _read_response(s)
        assert head.startswith(b"HTTP/1.1 500") and b"connection: close" not in head.lower()
        s.sendall(b"GET /v0/health HTTP/1.1\r\nHost: x\r\n\r\n")  # same socket
        assert _read_response(s).startswith(b"HTTP/1.1 200")


def test_pooled_client_survives_an_internal_error(server: ServerThread, running: Running, kernel: Kernel) -> None:
    eid, _, _ = running.start()
    _poison(kernel, eid)
    with httpx.Client(base_url=server.url, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)) as c:
        for _ in range(3):
            r = c.get(f"/v0/executions/{eid}")
            assert r.status_code == 500 and r.json() == {"code": "internal_error", "message": "internal error"}
            assert r.headers.get("connection") != "close"
            assert c.get("/v0/health").status_code == 200


def test_wrong_method_is_405_with_every_allowed_method_and_the_envelope(server: ServerThread) -> None:
    r = httpx.request("PATCH", f"{server.url}/v0/agents/x")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    assert r.headers["allow"] == "DELETE, GET, HEAD"
    r = httpx.request("PUT", f"{server.url}/v0/executions")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, POST"


def test_unknown_route_is_404_with_the_envelope(server: ServerThread) -> None:
    r = httpx.get(f"{server.url}/v0/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_bearer_scheme_is_case_insensitive(server: ServerThread) -> None:
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = httpx.get(f"{server.url}/v0/executions", headers={"Authorization": f"{scheme} boot-token"})
        assert r.status_code == 200, scheme
    for header in ("bearer", "Basic boot-token", "bearerboot-token", "bearer nope"):
        r = httpx.get(f"{server.url}/v0/executions", headers={"Authorization": header})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", header


def test_every_client_error_keeps_the_connection(server: ServerThread, running: Running) -> None:
    eid, _, _ = running.start()
    dup = b'{"agent_id":"a","agent_id":1}'
    bad = [  # 400 (body, query, path), 401, 404, 405, 409, each on the same socket, then a 200
        b"POST /v0/executions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(dup), dup),
        b"GET /v0/executions?limit=bogus HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v0/agents/hel%00lo HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v0/executions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n",
        f"POST /v0/executions/{eid}/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode(),
        b"GET /v0/nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PATCH /v0/agents/x HTTP/1.1\r\nHost: x\r\n\r\n",
        f"POST /v0/executions/{eid}/cancel HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"POST /v0/executions/{eid}/cancel HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
    ]
    expected = [b"400", b"400", b"400", b"401", b"401", b"404", b"405", b"204", b"409"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        for raw, status in zip(bad, expected, strict=True):
            s.sendall(raw)
            head = _read_response(s)
            assert head.startswith(b"HTTP/1.1 " + status) and b"connection: close" not in head.lower(), (raw, head)
        s.sendall(b"GET /v0/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(s).startswith(b"HTTP/1.1 200")

