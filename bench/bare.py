"""The ceiling: a bare FastAPI app with the two agent endpoints' request shape and nothing else.

Same paths, same POST JSON bodies in, similar JSON out (compact, newline-terminated, as the
kernel renders), served by uvicorn with exactly the settings `regent serve` uses (kernel/cli/server.py:
`_serve`), so the only difference from the kernel is the kernel's own work: signature check,
validation, canonical JSON, the store transaction and the hop to the lane thread.

    python -m bench.bare --port 8765
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys

import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response

_enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class _JSON(Response):
    media_type = "application/json; charset=utf-8"

    def render(self, content: object) -> bytes:
        return (_enc.encode(content) + "\n").encode("utf-8")


def create_bare_app() -> FastAPI:
    app = FastAPI(title="bare", docs_url=None, redoc_url=None)

    @app.get("/v0/health")
    async def health() -> Response:
        return _JSON({"status": "ok"})

    @app.post("/v0/executions/{execution_id}/steps")
    async def submit(execution_id: str, request: Request) -> Response:
        body = await request.body()
        json.loads(body)  # the kernel parses the body; so does the ceiling
        return _JSON({"decision": "proceed", "step_id": hashlib.sha256(body).hexdigest()})

    @app.post("/v0/executions/{execution_id}/steps/{step_id}/complete")
    async def complete(execution_id: str, step_id: str, request: Request) -> Response:
        body = await request.body()
        json.loads(body)
        return _JSON({"decision": "recorded"})

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bare")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    # As kernel/cli/server.py `_listen` and `_serve`: bind first, then the same uvicorn.Config.
    sock = socket.create_server((args.host, args.port), family=socket.AF_INET, backlog=2048)
    server = uvicorn.Server(uvicorn.Config(
        create_bare_app(), host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        lifespan="on", timeout_graceful_shutdown=10,
    ))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
