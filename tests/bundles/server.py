"""A bundle server for tests, run as its own process: `python server.py ROOT`.

Serves ROOT/<path> for GET /<path> with an ETag (a digest of the bytes) and answers 304 to a
matching If-None-Match, as OPA's bundle servers do; a missing file is a 404. It binds a free
loopback port and writes it to ROOT/port; every request is appended to ROOT/requests.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        target = (ROOT / self.path.lstrip("/")).resolve()
        status, body, etag = 404, b"not found", None
        if target.is_file() and ROOT in target.parents:
            body = target.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            status = 304 if self.headers.get("If-None-Match") == etag else 200
        with (ROOT / "requests.jsonl").open("a") as fh:
            fh.write(json.dumps({"path": self.path, "if_none_match": self.headers.get("If-None-Match"),
                                 "authorization": self.headers.get("Authorization"), "status": status}) + "\n")
        self.send_response(status)
        if etag:
            self.send_header("ETag", etag)
        if status == 200:
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    (ROOT / "port.tmp").write_text(str(server.server_address[1]))
    (ROOT / "port.tmp").rename(ROOT / "port")
    server.serve_forever(poll_interval=0.05)
