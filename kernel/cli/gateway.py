"""`regent gateway`: serve the OpenAI-compatible gateway in front of an upstream provider."""

from __future__ import annotations

import argparse
import os


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from kernel.gateway.app import create_gateway_app

    kernel_url = args.kernel or os.environ.get("REGENT_KERNEL_URL", "http://127.0.0.1:8080")
    app = create_gateway_app(args.upstream, kernel_url, max_body_bytes=args.max_body_bytes,
                             upstream_timeout_seconds=args.upstream_timeout_seconds)
    from kernel.api.transport import guarded_protocol

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                http=guarded_protocol(args.request_read_timeout))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("gateway", help="OpenAI-compatible proxy recording LLM calls as llm_call steps")
    sp.add_argument("--upstream", required=True, help="provider base URL replacing /v1, e.g. https://api.openai.com/v1")
    sp.add_argument("--kernel", help="kernel URL (REGENT_KERNEL_URL, default http://127.0.0.1:8080)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8090)
    sp.add_argument("--max-body-bytes", dest="max_body_bytes", type=int, default=4 * 1024 * 1024)
    sp.add_argument("--upstream-timeout-seconds", dest="upstream_timeout_seconds", type=float, default=600.0)
    sp.add_argument("--request-read-timeout", dest="request_read_timeout", type=float, default=30.0,
                    help="seconds a request may take to arrive whole; else its connection is closed (0: no limit)")
    sp.set_defaults(fn=cmd_gateway)
