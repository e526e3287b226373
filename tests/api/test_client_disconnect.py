"""A client that goes away mid-request is not a kernel error: it is logged at INFO, one line
without a traceback, and counted nowhere as a 500. Before, the body read raised ClientDisconnect,
which reached the catch-all handler and was logged as `ERROR unhandled error` with a traceback."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from tests.support import ServerThread


class Records(logging.Handler):
    """The kernel.api records, with an event set when the disconnect's line arrives."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.disconnected = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if "disconnect" in record.getMessage() or "unhandled error" in record.getMessage():
            self.disconnected.set()


@pytest.fixture
def records() -> Iterator[Records]:
    h = Records()
    log = logging.getLogger("kernel.api")
    level = log.level
    log.addHandler(h)
    log.setLevel(logging.DEBUG)
    yield h
    log.removeHandler(h)
    log.setLevel(level)


@pytest.fixture
def server(kernel: Kernel) -> Iterator[ServerThread]:
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    with ServerThread(app) as srv:
        yield srv


@pytest.mark.parametrize("path", ["/v0/executions", "/v0/agents", "/v0/api-keys"])
def test_a_client_gone_mid_body_is_an_info_line_without_a_traceback(server: ServerThread, records: Records,
                                                                    path: str) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: 100000\r\n\r\n{\"agent_id\":".encode())
    assert records.disconnected.wait(10), [r.getMessage() for r in records.records]
    errors: list[Any] = [r for r in records.records if r.levelno >= logging.WARNING]
    assert errors == [], [(r.levelname, r.getMessage()) for r in errors]
    line = next(r for r in records.records if "disconnect" in r.getMessage())
    assert line.levelno == logging.INFO and line.exc_info is None and path in line.getMessage()
