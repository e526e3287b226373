"""One upstream MCP server (stdio or streamable HTTP) held open by the gateway: its tools, its
list changes, and calls bounded in time. A connection that breaks is reopened on the next use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

from kernel.manifest_mcp import Upstream

log = logging.getLogger("regent.mcp")

CONNECT_TIMEOUT_SECONDS = 20.0  # start (a stdio process's interpreter) + initialize + tools/list


class UpstreamError(Exception):
    """The upstream could not answer: unreachable, died, timed out, or answered a protocol error.
    `kind` is the metric label: `unavailable`, `timeout`, `protocol`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class UpstreamConn:
    def __init__(self, spec: Upstream, default_timeout: float, on_tools_changed: Callable[[], None]):
        self.spec = spec
        self.timeout = spec.timeout_seconds or default_timeout
        self._read_timeout = timedelta(seconds=self.timeout)
        self.on_tools_changed = on_tools_changed
        self.tools: list[types.Tool] = []
        self.session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._closed = asyncio.Event()
        self._lock = asyncio.Lock()
        self.error = ""

    async def ensure(self) -> ClientSession:
        """The open session, opening (or reopening) it first."""
        async with self._lock:
            if self.session is not None and self._task is not None and not self._task.done():
                return self.session
            self._ready, self._closed = asyncio.Event(), asyncio.Event()
            self._task = asyncio.create_task(self._run(), name=f"mcp-upstream-{self.spec.prefix}")
            try:
                await asyncio.wait_for(self._ready.wait(), CONNECT_TIMEOUT_SECONDS)
            except TimeoutError:
                self._closed.set()
                raise UpstreamError("timeout", f"upstream {self.spec.prefix} did not start within "
                                    f"{CONNECT_TIMEOUT_SECONDS:g}s") from None
            if self.session is None:
                raise UpstreamError("unavailable", f"upstream {self.spec.prefix} is unavailable: {self.error}")
            return self.session

    async def _run(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.spec.command is not None:
                    env = {**get_default_environment(), **dict(self.spec.env)}
                    params = StdioServerParameters(command=self.spec.command, args=list(self.spec.args), env=env,
                                                   cwd=self.spec.cwd)
                    read, write = await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
                else:
                    assert self.spec.url is not None
                    http = await stack.enter_async_context(httpx.AsyncClient(
                        headers=dict(self.spec.headers), timeout=httpx.Timeout(30.0, read=self.timeout + 30.0)))
                    read, write, _ = await stack.enter_async_context(
                        streamable_http_client(self.spec.url, http_client=http))
                session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._on_message))
                await session.initialize()
                self.tools = await self._list(session)
                self.session = session
                self.error = ""
                self._ready.set()
                await self._closed.wait()
        except BaseException as e:  # a dying process or a refused connection ends here, as an ExceptionGroup too
            self.error = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning("upstream %s closed: %s", self.spec.prefix, self.error)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.session = None
            self._ready.set()

    @staticmethod
    async def _list(session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # pages, bounded
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            tools += page.tools
            cursor = page.nextCursor
            if not cursor:
                break
        return tools

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(message.root, types.ToolListChangedNotification):
            asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        session = self.session
        if session is None:
            return
        try:
            self.tools = await asyncio.wait_for(self._list(session), self.timeout)
        except Exception as e:
            log.warning("upstream %s: tools/list after a change failed: %s", self.spec.prefix, type(e).__name__)
            return
        self.on_tools_changed()

    async def call(self, name: str, args: dict[str, Any]) -> types.CallToolResult:
        session = await self.ensure()
        try:
            # send_request, not call_tool: call_tool checks the result's structured content
            # against the tool's output schema with jsonschema on every call (0.7 ms of CPU for a
            # one-field schema, a tenth of what the gateway spent per call); the gateway passes
            # the result on unchanged and the client's own SDK checks it against the same schema
            # (tools/list passes it on), so the check would only run twice.
            # asyncio.timeout, not wait_for: wait_for ran the call in a task of its own (3.11).
            request = types.ClientRequest(types.CallToolRequest(
                params=types.CallToolRequestParams(name=name, arguments=args)))
            async with asyncio.timeout(self.timeout + 5.0):
                return await session.send_request(request, types.CallToolResult,
                                                  request_read_timeout_seconds=self._read_timeout)
        except TimeoutError:
            raise UpstreamError("timeout", f"upstream {self.spec.prefix} did not answer within {self.timeout:g}s") from None
        except McpError as e:
            if "timed out" in str(e).lower():
                raise UpstreamError("timeout", f"upstream {self.spec.prefix} did not answer within "
                                    f"{self.timeout:g}s") from None
            if self.session is None or "closed" in str(e).lower():
                self._closed.set()
                raise UpstreamError("unavailable", f"upstream {self.spec.prefix} closed: {e}") from None
            raise UpstreamError("protocol", f"upstream {self.spec.prefix}: {e}") from None
        except Exception as e:  # a broken stream, a validation failure of its answer, garbage
            self._closed.set()
            raise UpstreamError("unavailable", f"upstream {self.spec.prefix} failed: {type(e).__name__}: "
                                f"{str(e)[:200]}") from None

    async def passthrough(self, method: str, *args: Any) -> Any:
        """A resources/prompts request as it is (not governed: docs/mcp.md)."""
        session = await self.ensure()
        try:
            return await asyncio.wait_for(getattr(session, method)(*args), self.timeout)
        except TimeoutError:
            raise UpstreamError("timeout", f"upstream {self.spec.prefix} did not answer") from None
        except McpError:
            raise
        except Exception as e:
            self._closed.set()
            raise UpstreamError("unavailable", f"upstream {self.spec.prefix} failed: {type(e).__name__}") from None

    async def close(self) -> None:
        self._closed.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 5.0)
