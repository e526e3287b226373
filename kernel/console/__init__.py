"""The operator console at /console: server-rendered pages over the core's read models and use
cases, in the kernel's own process (docs/console.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from kernel.console.session import Sessions
from kernel.console.web import HERE


@dataclass(frozen=True, slots=True)
class ConsoleState:
    sessions: Sessions
    dev: bool
    bearer_token: str | None


def install(app: FastAPI, *, dev: bool, bearer_token: str | None, session_key: bytes | None = None,
            session_ttl_seconds: float = 8 * 3600) -> None:
    from kernel.console import (
        approvals,
        audit,
        cancel,
        executions,
        mcp_tools,
        playground,
        policies,
        signin,
    )

    app.state.console = ConsoleState(Sessions(session_key, session_ttl_seconds), dev, bearer_token)
    for module in (signin, executions, cancel, approvals, audit, policies, mcp_tools, playground):
        app.router.routes.extend(module.router.routes)
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")
