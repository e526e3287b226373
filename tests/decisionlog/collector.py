"""A decision-log endpoint for tests: real HTTP on loopback, gzip JSON arrays in, switchable
between accepting (204) and failing (503)."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Collector:
    def __init__(self, port: int = 0):
        self.status = 204
        self.entries: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer._lock:
                    outer.requests += 1
                    outer.headers.append(dict(self.headers))
                    status = outer.status
                    if status < 300:
                        outer.raw.append(body)
                        outer.entries.extend(json.loads(gzip.decompress(body)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/logs"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def start(self) -> Collector:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def count(self) -> int:
        with self._lock:
            return len(self.entries)
