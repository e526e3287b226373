"""`regent dev | serve`: bind first, build the runtime, serve with uvicorn, stop on a signal."""

from __future__ import annotations

import argparse
import os
import socket
from typing import TYPE_CHECKING, Any

from kernel.cli.common import console, settings_from
from kernel.errors import ConfigError

if TYPE_CHECKING:
    from kernel.config import Settings


def _listen(host: str, port: int) -> socket.socket:
    """Bind and listen before anything starts: the dispatcher may deliver a webhook during app
    start-up, and the agent's call back must queue in the backlog rather than be refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def install_inline(server: Any) -> None:
    """Let this uvicorn server's step calls run on its event loop when the kernel is idle
    (kernel/lane.py `call_hot`; SQLite only, `REGENT_SQLITE_INLINE_IDLE_CALLS`)."""
    from kernel import lane as threads

    # uvicorn adds a request's task when its headers are read, before the task runs: requests
    # that arrived together are all counted, so a step call runs on the loop only when alone.
    tasks = server.server_state.tasks
    threads.install_inline(threads.InlineGate(lambda: len(tasks)))


def _serve(settings: Settings) -> int:
    import signal

    import uvicorn

    from kernel.bootstrap import build_runtime

    sock = _listen(settings.host, settings.port)
    try:
        rt = build_runtime(settings)
    except BaseException:
        sock.close()
        raise
    url = f"http://{settings.host}:{settings.port}"
    console.print(f"[bold]regent[/] {'dev' if settings.dev else 'serve'} on [cyan]{url}[/]")
    console.print(f"  store   {rt.store.dialect} {_redact(settings.db_url or '')}")
    if rt.manifest is not None:
        console.print(f"  config  {rt.manifest.path} ({len(rt.manifest.agents)} agent(s) provisioned)")
        for warning in rt.manifest.warnings:
            console.print(f"  [yellow]warning[/] {warning}")
    with rt.store.read() as tx:
        agents = tx.list_agents()
    console.print(f"  agents  {', '.join(a.id for a in agents) or '(none)'}")
    console.print(f"  replica {settings.replica_id}; dispatch concurrency {settings.dispatch_concurrency}, "
                  f"lease {settings.dispatch_lease_timeout:g}s")
    if settings.dev:
        console.print("  auth    anonymous client/admin calls allowed (dev); supplied tokens are checked")
    if settings.mcp_in_kernel:
        console.print(f"  mcp     [cyan]{url}/mcp-gateway/mcp/<agent>[/] (webhooks at {url}/mcp-gateway/webhooks/<agent>)")
    console.print(f"  console [cyan]{url}/console[/] "
                  + ("(anonymous admin)" if settings.dev else "(sign in with an API key or the bootstrap token)"))
    from kernel.api.transport import guarded_protocol

    server = uvicorn.Server(uvicorn.Config(
        rt.app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
        lifespan="on", timeout_graceful_shutdown=10, http=guarded_protocol(settings.request_read_timeout),
    ))
    if settings.sqlite_inline_idle_calls and rt.store.dialect == "sqlite":
        install_inline(server)

    def stop(signum: int, _frame: object) -> None:
        # uvicorn installs its own handlers while serving and re-raises the signal to these once
        # it has shut down gracefully; outside that window a signal asks it to stop as soon as
        # it has started. Either way the process then exits 0 instead of dying by the signal.
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        rt.close()
    if not server.started:
        console.print("[red]regent: the server did not start[/]")
        return 1
    console.print("regent: stopped")
    return 0


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}:***@{host}" if ":" in creds else url
    return url


def cmd_dev(args: argparse.Namespace) -> int:
    db = args.db_url or os.environ.get("REGENT_DB_URL") or "sqlite:///./regent.db"
    config = args.config or os.environ.get("REGENT_CONFIG")
    if config is None and os.path.exists("bundles/regent.yaml"):
        config = "bundles/regent.yaml"
    settings = settings_from(args, dev=True, db_url=db, config=config)
    return _serve(settings)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    missing = []
    if not settings.db_url:
        missing.append("a database URL (--db-url or REGENT_DB_URL)")
    if settings.bearer_token is None or not settings.bearer_token.get_secret_value():
        missing.append("a bootstrap bearer token (REGENT_BEARER_TOKEN)")
    if missing:
        raise ConfigError("regent serve needs " + " and ".join(missing))
    return _serve(settings)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    def server_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--db-url", dest="db_url", help="sqlite:///path or postgresql://… (REGENT_DB_URL)")
        sp.add_argument("--host", help="listen address (REGENT_HOST, default 127.0.0.1)")
        sp.add_argument("--port", type=int, help="listen port (REGENT_PORT, default 8080)")
        sp.add_argument("--config", help="provisioning manifest (REGENT_CONFIG)")
        sp.add_argument("--mcp", action="store_true",
                        help="serve the manifest's MCP gateways in this process, under /mcp-gateway (REGENT_MCP_IN_KERNEL)")

    sp = sub.add_parser("dev", help="serve on an embedded SQLite file with bundles/ loaded; no set-up")
    server_flags(sp)
    sp.set_defaults(fn=cmd_dev)
    sp = sub.add_parser("serve", help="production server: needs a database URL and REGENT_BEARER_TOKEN")
    server_flags(sp)
    sp.set_defaults(fn=cmd_serve)
