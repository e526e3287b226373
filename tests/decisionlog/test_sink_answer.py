"""A decision-log server whose answer never ends: the upload counts on its status, reads at most
64 KiB of the body, and the sink goes on shipping (a raw-socket server on loopback)."""

from __future__ import annotations

import re
import socket
import threading
import time

from kernel.decisionlog.sinks import HttpSink


def test_an_answer_body_that_never_ends_does_not_hold_the_sink() -> None:
    # Before: httpx read the whole answer, a chunk at a time under a per-read timeout, so a 200
    # whose body never ended held the sink's thread (and grew its memory) for good.
    sock = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()
    served: list[int] = []

    def answer(conn: socket.socket) -> None:
        deadline = time.monotonic() + 20  # every loop bounded
        try:
            request = b""
            while b"\r\n\r\n" not in request and time.monotonic() < deadline:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            m = re.search(rb"(?i)content-length: *(\d+)", head)
            while m and len(body) < int(m.group(1)) and time.monotonic() < deadline:
                body += conn.recv(65536)
            served.append(len(body))
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while not done.is_set() and time.monotonic() < deadline:
                conn.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
                time.sleep(0.005)
        except OSError:
            pass
        finally:
            conn.close()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sink = HttpSink(f"http://127.0.0.1:{sock.getsockname()[1]}/logs", batch_size=1, flush_interval=0.01, timeout=1.0)
    sink.start()
    try:
        sink.write([b'{"decision_id":"a"}'])
        sink.write([b'{"decision_id":"b"}'])
        for _ in range(1000):  # at most 10 s
            if sink.shipped == 2:
                break
            time.sleep(0.01)
        assert sink.shipped == 2 and sink.uploads_ok == 2 and len(served) == 2
    finally:
        done.set()
        sock.close()
        sink.close(drain_seconds=0.1)
