"""`regent mcp`: serve the MCP gateway (streamable HTTP, or one client over stdio), and list or
approve pinned tool definitions through the kernel's API (`regent mcp pins list|approve`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from kernel.errors import ConfigError


def _manifest(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from kernel.manifest import load_manifest

    path = args.config or os.environ.get("REGENT_CONFIG")
    if path is None and os.path.exists("bundles/regent.yaml"):
        path = "bundles/regent.yaml"
    if path is None:
        raise ConfigError("regent mcp needs the provisioning manifest (--config or REGENT_CONFIG)")
    return load_manifest(path)


def _gateways(args: argparse.Namespace, only: str | None):  # type: ignore[no-untyped-def]
    from kernel.mcp.app import Gateways

    manifest = _manifest(args)
    kernel_url = args.kernel or os.environ.get("REGENT_KERNEL_URL", "http://127.0.0.1:8080")
    pins = args.pins_file or os.environ.get("REGENT_MCP_PINS_FILE")
    gws = Gateways(manifest, kernel_url, kernel_token=os.environ.get("REGENT_MCP_KERNEL_TOKEN") or None,
                   pins_path=Path(pins) if pins else None, only=only)
    if not gws.agents:
        which = f"agent {only!r}" if only else "any agent"
        raise ConfigError(f"{manifest.path}: no `mcp:` section for {which}")
    return gws


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    # The SDK logs each request at INFO, and a traceback each time a client ends its session
    # ("Error in standalone SSE writer": the stream it reads was closed, as it should be).
    logging.getLogger("mcp").setLevel(logging.WARNING)
    logging.getLogger("mcp.server.streamable_http").setLevel(logging.CRITICAL)

    from kernel.api.transport import guarded_protocol

    if args.stdio and args.gateway:
        if args.agent is None:
            raise ConfigError("--stdio serves one agent: name it with --agent")
        return asyncio.run(_bridge(args))
    gws = _gateways(args, args.agent)
    if args.stdio:
        if args.agent is None:
            raise ConfigError("--stdio serves one agent: name it with --agent")
        return asyncio.run(_stdio(gws, args))
    uvicorn.run(gws.app(), host=args.host, port=args.port, log_level="warning",
                http=guarded_protocol(args.request_read_timeout))
    return 0


async def _stdio(gws, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    """MCP on stdin/stdout for the client that launched us; the webhook listener on --port."""
    import uvicorn
    from mcp.server.stdio import stdio_server

    gw = gws.agents[args.agent]
    gw.stdio_session_key = args.session_key or ""
    config = uvicorn.Config(gws.app(), host=args.host, port=args.port, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    web_task = asyncio.create_task(web.serve())
    for _ in range(400):  # the lifespan (upstreams started) before the first MCP message, 20 s at most
        if web.started or web_task.done():
            break
        await asyncio.sleep(0.05)
    if not web.started:
        raise ConfigError(f"could not listen on {args.host}:{args.port} for the kernel's webhook")
    try:
        async with stdio_server() as (read, write):
            await gw.server.run(read, write, gw.initialization_options())
    finally:
        web.should_exit = True
        await web_task
    return 0


async def _bridge(args: argparse.Namespace) -> int:
    """stdin/stdout ↔ a running HTTP gateway's /mcp/<agent>, message for message: the gateway
    there holds the agent's deliveries, so any number of local clients can share one agent."""
    import anyio
    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.stdio import stdio_server

    headers = {}
    token = os.environ.get("REGENT_MCP_CLIENT_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if args.session_key:
        headers["X-Regent-Session-Key"] = args.session_key
    url = f"{args.gateway.rstrip('/')}/mcp/{args.agent}"

    async def pump(source: Any, sink: Any) -> None:
        async for message in source:
            if not isinstance(message, Exception):  # a line that was not JSON-RPC: the transport logged it
                await sink.send(message)

    async with (httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=3600.0)) as http,
                streamable_http_client(url, http_client=http) as (up_read, up_write, _),
                stdio_server() as (client_read, client_write),
                anyio.create_task_group() as tg):
        tg.start_soon(pump, up_read, client_write)
        await pump(client_read, up_write)
        tg.cancel_scope.cancel()
    return 0


def _kernel(args: argparse.Namespace, method: str, path: str, body: object = None) -> int:
    """One call to the kernel's pin routes with an operator's bearer (`policies:write`)."""
    import httpx

    token = args.token or os.environ.get("REGENT_BEARER_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = (args.kernel or os.environ.get("REGENT_KERNEL_URL", "http://127.0.0.1:8080")).rstrip("/")
    try:
        r = httpx.request(method, url + path, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise ConfigError(f"cannot reach the kernel at {url}: {type(e).__name__}") from None
    try:
        answer = r.json()
    except ValueError:
        answer = {"status": r.status_code, "text": r.text[:500]}
    sys.stdout.write(json.dumps(answer, indent=1) + "\n")
    return 0 if r.status_code < 300 else 1


def cmd_pins_list(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    return _kernel(args, "GET", f"/v0/mcp/{quote(args.agent, safe='')}/tools")


def cmd_pins_approve(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    return _kernel(args, "POST", f"/v0/mcp/{quote(args.agent, safe='')}/tools/approve",
                   {"tool": args.tool, "sha256": args.sha256, "via": "cli"})


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("mcp", help="MCP gateway recording upstream MCP tool calls as tool_call steps")
    mcp_sub = p.add_subparsers(dest="mcp_command", required=True)
    sp = mcp_sub.add_parser("serve", help="serve MCP over streamable HTTP (/mcp/<agent>) or stdio")
    sp.add_argument("--config", help="provisioning manifest with the agents' `mcp:` sections (REGENT_CONFIG)")
    sp.add_argument("--kernel", help="kernel URL (REGENT_KERNEL_URL, default http://127.0.0.1:8080)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8070, help="MCP, webhooks, /metrics and /health")
    sp.add_argument("--agent", help="serve this agent only (required with --stdio)")
    sp.add_argument("--stdio", action="store_true", help="one MCP client on stdin/stdout")
    sp.add_argument("--gateway", help="with --stdio: relay to this running HTTP gateway (its URL) instead of "
                    "serving the agent here; the bearer is REGENT_MCP_CLIENT_TOKEN")
    sp.add_argument("--session-key", dest="session_key",
                    help="with --stdio: resume the execution of this key (a restarted client replays)")
    sp.add_argument("--pins-file", dest="pins_file", help="the kernel's last approvals, read only when it is "
                    "unreachable at start (REGENT_MCP_PINS_FILE)")
    sp.add_argument("--request-read-timeout", dest="request_read_timeout", type=float, default=30.0)
    sp.set_defaults(fn=cmd_serve)
    pins = mcp_sub.add_parser("pins", help="an agent's MCP tools and their approved definitions, in the kernel")
    pins_sub = pins.add_subparsers(dest="pins_command", required=True)
    for name, fn, help_ in (("list", cmd_pins_list, "the agent's tools: state (approved/changed/new), sha256, "
                             "who approved"),
                            ("approve", cmd_pins_approve, "approve the definition a tool is offered with now")):
        pp = pins_sub.add_parser(name, help=help_)
        pp.add_argument("--agent", required=True)
        pp.add_argument("--kernel", help="kernel URL (REGENT_KERNEL_URL, default http://127.0.0.1:8080)")
        pp.add_argument("--token", help="an API key with policies:write, or the bootstrap token (REGENT_BEARER_TOKEN)")
        if name == "approve":
            pp.add_argument("--tool", required=True)
            pp.add_argument("--sha256", required=True, help="the definition's hash, as `pins list` shows it")
        pp.set_defaults(fn=fn)
