"""One agent's MCP face: the MCP server the clients talk to (tools/list from the pinned catalog,
tools/call through `calls.Caller`, resources and prompts passed through), each client session
bound to an execution of the agent."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
from mcp import McpError, types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.session import ServerSession

from kernel.manifest_mcp import McpAgent
from kernel.mcp.calls import Call, Caller, error_result
from kernel.mcp.catalog import APPROVED, CHANGED, Entry, Metrics, build, report
from kernel.mcp.leases import AgentLink, LeaseBook, Slot
from kernel.mcp.pins import KernelPins
from kernel.mcp.upstream import CONNECT_TIMEOUT_SECONDS, UpstreamConn, UpstreamError

log = logging.getLogger("regent.mcp")

SESSION_KEY_HEADER = "x-regent-session-key"
_MAX_SESSION_KEY = 200
# How long a call to an unapproved tool waits for the kernel's fresh answer before it is refused.
_PIN_SYNC_ON_REFUSAL_SECONDS = 5.0


class GatewayError(McpError):
    def __init__(self, code: int, message: str):
        super().__init__(types.ErrorData(code=code, message=message))


@dataclass
class ClientSession:
    """One MCP client session: the execution it is bound to (made at its first request)."""

    slot: Slot | None = None
    sessions: set[ServerSession] = field(default_factory=set)
    binding: asyncio.Lock = field(default_factory=asyncio.Lock)  # two first requests make one execution


_CURRENT: contextvars.ContextVar[ClientSession | None] = contextvars.ContextVar("regent_mcp_session", default=None)


class AgentGateway:
    def __init__(self, agent_id: str, cfg: McpAgent, link: AgentLink, book: LeaseBook, pins: KernelPins,
                 metrics: Metrics):
        self.agent_id, self.cfg, self.link, self.book, self.pins, self.metrics = agent_id, cfg, link, book, pins, metrics
        self.upstreams = [UpstreamConn(u, cfg.call_timeout_seconds, self._tools_changed) for u in cfg.upstreams]
        self.catalog: dict[str, Entry] = {}
        self.caller = Caller(agent_id, cfg, metrics)
        self.live: set[ServerSession] = set()
        self.server = self._server()
        self.stdio_session_key: str | None = None
        self.ready = asyncio.Event()
        self._validators: dict[str, Any] = {}
        self._pin_sync: asyncio.Future[None] | None = None  # the report in flight: a burst of refusals shares it
        self._pins_read_at = 0.0

    # -- the catalog ------------------------------------------------------------------------------

    async def refresh(self) -> None:
        async def one(up: UpstreamConn) -> None:
            try:
                await up.ensure()
            except UpstreamError as e:
                log.warning("%s: %s", self.agent_id, e)

        await asyncio.gather(*(one(up) for up in self.upstreams))
        self.catalog = build(self.agent_id, self.upstreams, self.pins)
        await self.sync_pins()
        self.ready.set()

    async def _catalog(self) -> dict[str, Entry]:
        """The catalog, once the upstreams have first been asked (bounded by their start-up)."""
        if not self.ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), CONNECT_TIMEOUT_SECONDS + 5)
        return self.catalog

    def _tools_changed(self) -> None:
        self.catalog = build(self.agent_id, self.upstreams, self.pins)

        async def report_then_notify() -> None:
            # The new definitions go to the kernel first, which may approve them (trust_new_tools),
            # so a client listing on the notification sees them as the kernel decided.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.sync_pins(fresh=True), _PIN_SYNC_ON_REFUSAL_SECONDS)
            self._notify()

        asyncio.get_running_loop().create_task(_quietly(report_then_notify()))

    def _notify(self) -> None:
        for s in list(self.live):
            asyncio.get_running_loop().create_task(_quietly(s.send_tool_list_changed()))

    async def sync_pins(self, fresh: bool = False) -> None:
        """Report the offered definitions to the kernel and take its approvals back; the catalog
        is rebuilt and clients told when an approval changed (another replica's, an operator's).
        A report in flight is shared, unless `fresh`: the catalog changed since it was sent."""
        if fresh and self._pin_sync is not None and not self._pin_sync.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._pin_sync)
        if self._pin_sync is None or self._pin_sync.done():
            self._pin_sync = asyncio.ensure_future(self._sync_pins())
        await asyncio.shield(self._pin_sync)

    async def sync_pins_soon(self, newer_than_seconds: float = 1.0, fresh: bool = False) -> None:
        """Re-read the approvals before answering, unless they were read within `newer_than_seconds`
        (a client listing in a loop costs the kernel one report a second at most); a report in
        flight is waited for. Bounded."""
        in_flight = self._pin_sync is not None and not self._pin_sync.done()
        if not in_flight and time.monotonic() - self._pins_read_at < newer_than_seconds:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.sync_pins(fresh), _PIN_SYNC_ON_REFUSAL_SECONDS)

    async def _sync_pins(self) -> None:
        self._pins_read_at = time.monotonic()
        hidden = self._hidden()
        changed = await self.pins.sync(self.agent_id, self.link.report_tools,
                                       report(self.cfg, self.catalog, self.pins.manifest_pins.get(self.agent_id, {})))
        if changed:
            self.catalog = build(self.agent_id, self.upstreams, self.pins)
            self._notify()
        elif self._hidden() != hidden:  # the agent's bundle changed what it denies outright
            self._notify()

    def _hidden(self) -> frozenset[str]:
        """The tools tools/list leaves out with `mcp.hide_denied_tools`: those the agent's bundle
        denies whatever the arguments, as the kernel last answered (docs/mcp.md)."""
        return self.pins.denied_always(self.agent_id) if self.cfg.hide_denied_tools else frozenset()

    async def keep_pins(self) -> None:
        """Re-read the approvals every `pins_refresh_seconds` (docs/mcp.md)."""
        while True:
            await asyncio.sleep(self.cfg.pins_refresh_seconds)
            with contextlib.suppress(Exception):
                await self.sync_pins()

    # -- sessions ---------------------------------------------------------------------------------

    async def _session(self) -> tuple[ClientSession, Slot]:
        cs = _CURRENT.get()
        if cs is None:
            raise GatewayError(types.INTERNAL_ERROR, "no session")
        ctx = self.server.request_context
        cs.sessions.add(ctx.session)
        self.live.add(ctx.session)
        if cs.slot is not None:
            return cs, cs.slot
        async with cs.binding:
            if cs.slot is None:
                cs.slot = await self._bind(ctx)
        return cs, cs.slot

    async def _bind(self, ctx: Any) -> Slot:
        """Create (or, with a session key, find) the session's execution."""
        token, key, bearer = None, self.stdio_session_key, ""
        request = ctx.request
        if request is not None:
            auth = request.headers.get("authorization", "")
            bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            token = bearer if bearer.startswith("rbk_") else None
            key = request.headers.get(SESSION_KEY_HEADER) or None
        if key is not None and (len(key) > _MAX_SESSION_KEY or not key.isprintable()):
            raise GatewayError(types.INVALID_PARAMS, f"{SESSION_KEY_HEADER} must be 1-{_MAX_SESSION_KEY} printable characters")
        input_ = {"mcp": {"transport": "stdio" if request is None else "http", **({"session_key": key} if key else {})}}
        try:
            # The key is the client's, under its credential: another credential naming the same key
            # gets an execution of its own, never this one's recorded results.
            owner = hashlib.sha256(bearer.encode("utf-8")).hexdigest()[:16]
            r = await self.link.create_execution(token, input_, f"mcp-session:{owner}:{key}" if key else None)
        except httpx.HTTPError as e:
            raise GatewayError(types.INTERNAL_ERROR, f"the kernel is unreachable: {type(e).__name__}") from None
        if r.status_code not in (200, 201):
            raise GatewayError(types.INVALID_REQUEST, f"the kernel refused to start this session's execution: "
                               f"{r.status_code} {r.text[:300]}")
        execution = r.json()
        if execution.get("status") in ("completed", "failed", "cancelled"):
            raise GatewayError(types.INVALID_REQUEST, f"session key {key!r} names execution {execution['id']}, "
                               "which has ended: use a new key")
        slot = self.book.slot(execution["id"], self.link)
        slot.attached += 1
        slot.resume_seconds = self.cfg.resume_seconds if key else 0.0
        log.info("%s: session bound to execution %s", self.agent_id, execution["id"])
        return slot

    async def session_ended(self, cs: ClientSession) -> None:
        for s in cs.sessions:
            self.live.discard(s)
        slot = cs.slot
        if slot is None:
            return
        slot.attached -= 1
        slot.idle_since = time.monotonic()
        if slot.attached == 0 and slot.resume_seconds == 0:
            await self.book.end(slot, {"mcp": "session closed"})

    # -- the MCP server ---------------------------------------------------------------------------

    def _server(self) -> Server[Any, Any]:
        gw = self

        class _Server(Server[Any, Any]):
            async def run(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
                cs = ClientSession()
                token = _CURRENT.set(cs)
                try:
                    await super().run(*args, **kwargs)
                finally:
                    _CURRENT.reset(token)
                    await gw.session_ended(cs)

        server: Server[Any, Any] = _Server(f"regent-mcp-{self.agent_id}")

        @server.list_tools()  # type: ignore[untyped-decorator]
        async def list_tools() -> list[types.Tool]:
            await gw._session()
            catalog = await gw._catalog()
            if any(e.state != APPROVED for e in catalog.values()):
                await gw.sync_pins_soon()  # a hidden tool may have been approved since the last refresh
                catalog = gw.catalog
            hidden = gw._hidden()  # presentation only: a call to one still goes to the kernel, which denies it
            return [e.offered() for e in catalog.values() if e.state == APPROVED and e.name not in hidden]

        async def call_tool(req: types.CallToolRequest) -> types.ServerResult:
            return types.ServerResult(await gw.call(req))

        server.request_handlers[types.CallToolRequest] = call_tool
        self._passthrough(server)
        return server

    def _passthrough(self, server: Server[Any, Any]) -> None:
        """resources/* and prompts/* go to the upstreams as they are: not governed (docs/mcp.md)."""
        gw = self

        async def gather(method: str) -> list[Any]:
            out: list[Any] = []
            for up in gw.upstreams:
                with contextlib.suppress(UpstreamError, McpError):
                    out.append((up, await up.passthrough(method)))
            return out

        async def list_resources(_: Any) -> types.ServerResult:
            await gw._session()
            return types.ServerResult(types.ListResourcesResult(
                resources=[r for _, res in await gather("list_resources") for r in res.resources]))

        async def read_resource(req: types.ReadResourceRequest) -> types.ServerResult:
            await gw._session()
            last: Exception | None = None
            for up in gw.upstreams:
                try:
                    return types.ServerResult(await up.passthrough("read_resource", req.params.uri))
                except (UpstreamError, McpError) as e:
                    last = e
            raise GatewayError(types.INVALID_PARAMS, f"no upstream serves {req.params.uri}: {last}")

        async def list_prompts(_: Any) -> types.ServerResult:
            await gw._session()
            return types.ServerResult(types.ListPromptsResult(
                prompts=[p.model_copy(update={"name": f"{up.spec.prefix}_{p.name}"})
                         for up, res in await gather("list_prompts") for p in res.prompts]))

        async def get_prompt(req: types.GetPromptRequest) -> types.ServerResult:
            await gw._session()
            for up in gw.upstreams:
                prefix = up.spec.prefix + "_"
                if req.params.name.startswith(prefix):
                    try:
                        return types.ServerResult(await up.passthrough(
                            "get_prompt", req.params.name[len(prefix):], req.params.arguments))
                    except UpstreamError as e:
                        raise GatewayError(types.INTERNAL_ERROR, str(e)) from None
            raise GatewayError(types.INVALID_PARAMS, f"unknown prompt {req.params.name!r}")

        server.request_handlers[types.ListResourcesRequest] = list_resources
        server.request_handlers[types.ReadResourceRequest] = read_resource
        server.request_handlers[types.ListPromptsRequest] = list_prompts
        server.request_handlers[types.GetPromptRequest] = get_prompt

    def initialization_options(self) -> Any:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))

    # -- tools/call -------------------------------------------------------------------------------

    async def call(self, req: types.CallToolRequest) -> types.CallToolResult:
        _, slot = await self._session()
        name = req.params.name
        entry = (await self._catalog()).get(name)
        if entry is None:
            raise GatewayError(types.INVALID_PARAMS, f"unknown tool {name[:200]!r}")
        if entry.state != APPROVED:
            # Approved since the last refresh (through another replica, the console)? Ask once,
            # in a report sent now (one in flight may have been read before the approval).
            await self.sync_pins_soon(0.0, fresh=True)
            entry = self.catalog.get(name, entry)
        if entry.state != APPROVED:
            return await self._unpinned(slot, entry)
        args = {k: v for k, v in (req.params.arguments or {}).items() if v is not None}  # the SDK's _strip_none
        try:
            size = len(json.dumps(args, ensure_ascii=False).encode("utf-8"))
        except (TypeError, ValueError, RecursionError):
            raise GatewayError(types.INVALID_PARAMS, "arguments are not JSON") from None
        if size > self.cfg.max_args_bytes:
            raise GatewayError(types.INVALID_PARAMS, f"arguments are {size} bytes, over the gateway's "
                               f"{self.cfg.max_args_bytes}")
        problem = _schema_problem(self._validator(entry), args)
        if problem:
            raise GatewayError(types.INVALID_PARAMS, f"arguments do not match {name}'s input schema: {problem}")
        call: Call = self.caller.new_call(entry, args, slot)
        return await self.caller.run(slot, call, self._progress(req))

    def _validator(self, entry: Entry) -> Any:
        """The tool's input-schema validator, built once per definition."""
        if entry.digest not in self._validators:
            schema = entry.tool.inputSchema
            try:
                v = jsonschema.validators.validator_for(schema)(schema) if isinstance(schema, dict) and schema else None
            except (jsonschema.exceptions.SchemaError, TypeError, ValueError):
                v = None
            if len(self._validators) > 4096:
                self._validators.clear()
            self._validators[entry.digest] = v
        return self._validators[entry.digest]

    async def _unpinned(self, slot: Slot, entry: Entry) -> types.CallToolResult:
        if entry.state == CHANGED:
            self.metrics.pin_refusals.labels(self.agent_id, entry.name).inc()
            log.warning("%s: refused %s: definition sha256 %s differs from the pinned %s", self.agent_id,
                        entry.name, entry.digest, entry.pinned)
            await self._note_refusal(slot, entry)
            return error_result(f"regent: tool {entry.name}'s definition changed since it was approved (pinned "
                                f"sha256 {entry.pinned}, now {entry.digest}); calls are refused until an operator "
                                f"approves it (the console's MCP tools page, or regent mcp pins approve --agent "
                                f"{self.agent_id} --tool {entry.name} --sha256 {entry.digest})")
        self.metrics.calls.labels(self.agent_id, entry.upstream.spec.prefix, "unapproved").inc()
        return error_result(f"regent: tool {entry.name} has not been approved yet (sha256 {entry.digest}); an "
                            "operator approves it on the console's MCP tools page or with regent mcp pins approve")

    async def _note_refusal(self, slot: Slot, entry: Entry) -> None:
        """The refusal in the execution's timeline: a `local` step `mcp.definition_changed` failed
        with both hashes (an event the console and the audit trail show)."""
        args = {"tool": entry.name, "pinned": entry.pinned, "sha256": entry.digest}
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            async with slot.submit_lock:
                lease = await slot.wait_lease(self.cfg.lease_wait_seconds)
                if lease is None:
                    return
                r = await self.link.submit(lease, "mcp.definition_changed", args, "safe_to_retry", kind="local")
            dec = r.json()
            if dec.get("decision") == "proceed":
                await self.link.fail_step(lease, dec["step_id"], {"reason": "tool_definition_changed", **args})

    def _progress(self, req: types.CallToolRequest) -> Any:
        meta = req.params.meta
        token = getattr(meta, "progressToken", None) if meta is not None else None
        if token is None:
            return None
        session = self.server.request_context.session
        request_id = str(self.server.request_context.request_id)

        async def send(done: float, total: float, message: str) -> None:
            await session.send_progress_notification(token, done, total, message, related_request_id=request_id)

        return send

    async def close(self) -> None:
        for up in self.upstreams:
            await up.close()


def _schema_problem(validator: Any, args: dict[str, Any]) -> str:
    if validator is None:
        return ""
    try:
        err = next(iter(validator.iter_errors(args)), None)
    except (jsonschema.exceptions.SchemaError, RecursionError, TypeError, ValueError) as e:
        return f"the upstream's schema cannot be checked ({type(e).__name__})"
    return "" if err is None else str(err.message)[:300]


async def _quietly(aw: Any) -> None:
    with contextlib.suppress(Exception):
        await aw
