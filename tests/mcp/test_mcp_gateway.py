"""The official `mcp` client ↔ `regent mcp` ↔ real upstream MCP servers (stdio and streamable
HTTP), on SQLite and PostgreSQL: every decision a tools/call can meet, and the failures."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import httpx
import pytest
from mcp import McpError
from rebuno.errors import PolicyError, RateLimited, raise_for_refusal

from tests.e2e.conftest import wait_for
from tests.mcp.conftest import Env, mcp_session, run, text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def url(env: Env, agent: str = "files") -> str:
    return f"{env.gateway.url}/mcp/{agent}"


def settled_steps(env: Env, eid: str) -> list[dict[str, Any]]:
    """The execution's steps once none is still `executing`: the gateway records an outcome while
    it answers the call (docs/mcp.md), so the record may land just after."""
    return list(wait_for(lambda: (steps := env.api.steps(eid)) and
                         all(s["status"] != "executing" for s in steps) and steps,
                         f"the steps of {eid} to settle", timeout=20))


def newest_steps(env: Env, agent: str = "files") -> list[dict[str, Any]]:
    """The steps of the agent's newest execution, settled."""
    return settled_steps(env, env.executions(agent)[0]["id"])


def test_tools_are_listed_under_the_sdk_names_and_an_allowed_call_runs_once_and_is_recorded(env: Env) -> None:
    async def go() -> tuple[Any, Any, Any, Any]:
        async with mcp_session(url(env)) as s:
            tools = (await s.list_tools()).tools
            read = await s.call_tool("fs_read_file", {"path": "a.txt"})
            stat = await s.call_tool("web_stat", {"path": "a.txt"})
            return tools, read, stat, env.executions()[0]

    before = len(env.effect_lines())
    tools, read, stat, execution = run(go())
    names = {t.name for t in tools}
    assert {"fs_read_file", "fs_write_file", "fs_delete_file", "web_read_file", "web_stat"} <= names
    schema = next(t for t in tools if t.name == "fs_write_file").inputSchema
    assert set(schema["required"]) == {"path", "content"}
    assert not read.isError and "(no file a.txt)" in text(read)
    assert stat.structuredContent == {"path": "a.txt", "size": 0, "exists": False}
    assert [e["tool"] for e in env.effect_lines()[before:]] == ["read_file"]
    # The gateway answers while it records (docs/mcp.md); the execution completes once every record
    # is written, so the steps are read after that.
    done = env.api.wait_status(execution["id"], "completed")
    steps = env.api.steps(execution["id"])
    by_target = {s["target"]: s for s in steps}
    assert by_target["fs_read_file"]["status"] == "succeeded"
    assert by_target["fs_read_file"]["args"] == {"path": "a.txt"}
    assert by_target["fs_read_file"]["kind"] == "tool_call"
    # FastMCP answers a string tool with structured content {"result": …}: the SDK's flattening keeps it.
    assert by_target["fs_read_file"]["result"] == {"result": "(no file a.txt)"}
    assert by_target["web_stat"]["result"] == {"path": "a.txt", "size": 0, "exists": False}
    # The session ended: its execution is complete, and the console's timeline reads it like any other.
    assert done["input"] == {"mcp": {"transport": "http"}}
    page = httpx.get(f"{env.kernel.url}/console/executions/{execution['id']}", timeout=30)
    assert page.status_code == 200 and "fs_read_file" in page.text and "web_stat" in page.text
    assert 'regent_mcp_calls_total{agent="files",decision="proceed",upstream="fs"}' in env.metrics()


def test_a_denied_call_answers_the_sdk_refusal_and_never_reaches_the_upstream(env: Env) -> None:
    async def go() -> Any:
        async with mcp_session(url(env)) as s:
            return await s.call_tool("fs_delete_file", {"path": "a.txt"})

    before = len(env.effect_lines())
    result = run(go())
    assert result.isError
    assert text(result) == "rebuno_refusal: denied reason=deletes are not allowed"
    with pytest.raises(PolicyError, match="deletes are not allowed"):
        raise_for_refusal(Exception(text(result)))
    assert env.effect_lines()[before:] == []
    step = next(s for s in newest_steps(env) if s["target"] == "fs_delete_file")
    assert step["status"] == "denied" and step["error"]["rule_id"] == "no-deletes"
    assert 'decision="denied"' in env.metrics()


async def _decide(env: Env, decision: str, rationale: str = "") -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=env.kernel.url, timeout=10) as h:
        for _ in range(400):
            pending = (await h.get("/v0/approvals")).json()
            if pending:
                a = pending[0]
                r = await h.post(f"/v0/approvals/{a['id']}/{decision}", json={"decided_by": "ops", "rationale": rationale})
                assert r.status_code == 204, r.text
                return dict(a)
            await asyncio.sleep(0.05)
    raise AssertionError("no approval was requested")


def test_a_write_waits_for_its_approval_with_progress_and_runs_once_granted_or_is_refused_once_denied(env: Env) -> None:
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def go() -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
        async with mcp_session(url(env)) as s:
            decide = asyncio.create_task(_decide(env, "grant"))
            granted = await s.call_tool("fs_write_file", {"path": "w.txt", "content": "yes"},
                                        progress_callback=on_progress)
            a1 = await decide
            decide = asyncio.create_task(_decide(env, "deny", "not today"))
            denied = await s.call_tool("fs_write_file", {"path": "w.txt", "content": "no"})
            a2 = await decide
            return granted, denied, a1, a2

    before = len(env.effect_lines())
    granted, denied, a1, a2 = run(go())
    assert a2["args"] == {"path": "w.txt", "content": "no"}
    assert not granted.isError and text(granted) == "wrote 3 characters to w.txt"
    assert a1["target"] == "fs_write_file" and a1["args"] == {"path": "w.txt", "content": "yes"}
    assert any(m.startswith(f"waiting for approval {a1['id']}") for m in progress), progress
    assert denied.isError and text(denied) == "rebuno_refusal: denied reason=not today"
    writes = [e["args"] for e in env.effect_lines()[before:] if e["tool"] == "write_file"]
    assert writes == [{"path": "w.txt", "content": "yes"}]
    steps = {s["args"]["content"]: s for s in newest_steps(env) if s["target"] == "fs_write_file"}
    assert steps["yes"]["status"] == "succeeded" and steps["yes"]["idempotency"] == "at_most_once"
    assert steps["no"]["status"] == "denied"


def test_a_call_still_awaiting_approval_past_the_bound_answers_pending_naming_the_approval(env: Env) -> None:
    async def go() -> tuple[Any, Any]:
        async with mcp_session(url(env), key="pending-approval") as s:
            first = await s.call_tool("fs_write_file", {"path": "p.txt", "content": "later"})
            pending = (await httpx.AsyncClient(base_url=env.kernel.url).get("/v0/approvals")).json()
            assert len(pending) == 1
            decide = asyncio.create_task(_decide(env, "grant"))
            again = await s.call_tool("fs_write_file", {"path": "p.txt", "content": "later"})
            await decide
            return first, again

    # approval_wait_seconds is 20 in the test manifest: the first call gives up and says so.
    first, again = run(go())
    assert first.isError and text(first).startswith("rebuno_refusal: blocked reason=approval_pending")
    assert "approval " in text(first) and "is pending" in text(first)
    assert not again.isError and text(again) == "wrote 5 characters to p.txt"
    writes = [s for s in newest_steps(env) if s["target"] == "fs_write_file"]
    assert len(writes) == 1 and writes[0]["status"] == "succeeded"  # the retry was the same step


def test_a_rate_limited_call_answers_the_refusal_with_a_retry_hint(env: Env) -> None:
    async def go() -> list[Any]:
        async with mcp_session(url(env)) as s:
            return [await s.call_tool("fs_stat", {"path": str(i)}) for i in range(3)]

    results = run(go())
    assert [r.isError for r in results] == [False, False, True]
    assert text(results[2]).startswith("rebuno_refusal: rate_limited reason=rate_limit_exceeded; retry")
    with pytest.raises(RateLimited):
        raise_for_refusal(Exception(text(results[2])))
    assert 'decision="rate_limited"' in env.metrics()


def test_an_upstream_that_crashes_fails_the_step_and_the_next_call_reaches_a_fresh_upstream(env: Env) -> None:
    async def go() -> tuple[Any, Any]:
        async with mcp_session(url(env)) as s:
            crashed = await s.call_tool("fs_crash", {})
            after = await s.call_tool("fs_read_file", {"path": "after-crash"})
            return crashed, after

    crashed, after = run(go())
    assert crashed.isError and "upstream fs" in text(crashed)
    assert not after.isError and "(no file after-crash)" in text(after)
    steps = {s["target"]: s for s in newest_steps(env)}
    assert steps["fs_crash"]["status"] == "failed"
    assert steps["fs_crash"]["error"]["reason"] == "upstream_unavailable"
    pids = {e["pid"] for e in env.effect_lines() if e["tool"] in ("crash", "read_file")}
    assert len(pids) >= 2  # the upstream was started again
    assert 'regent_mcp_upstream_errors_total{agent="files",kind="unavailable",upstream="fs"}' in env.metrics()


def test_an_upstream_that_hangs_times_out_and_the_step_fails(env: Env) -> None:
    async def go() -> Any:
        async with mcp_session(url(env)) as s:
            return await s.call_tool("fs_slow_write", {"path": "hang", "seconds": 60})

    result = run(go())
    assert result.isError and "did not answer within 6s" in text(result)
    step = next(s for s in newest_steps(env) if s["target"] == "fs_slow_write")
    assert step["status"] == "failed" and step["error"]["reason"] == "upstream_timeout"


def test_hostile_arguments_get_json_rpc_errors_and_the_gateway_keeps_serving(env: Env) -> None:
    deep: Any = "x"
    for _ in range(200):  # as deep as the client's own serializer sends (deeper: below, raw)
        deep = [deep]
    hostile: list[tuple[str, Any]] = [
        ("no_such_tool", {}),
        ("fs_read_file", {"path": 3}),  # the schema says string
        ("fs_read_file", {}),  # missing a required argument
        ("fs_write_file", {"path": "big", "content": "x" * 10_000}),  # over max_args_bytes
        ("fs_read_file", {"path": deep}),
        ("../fs_read_file", {"path": "a"}),
        ("fs_read_file\u0000", {"path": "a"}),
    ]

    async def go() -> tuple[list[str], Any, Any]:
        errors = []
        async with mcp_session(url(env)) as s:
            for name, args in hostile:
                try:
                    await s.call_tool(name, args)
                    errors.append("no error")
                except McpError as e:
                    errors.append(str(e))
            big = await s.call_tool("fs_big", {"n": 50_000})  # a result over max_result_bytes
            fine = await s.call_tool("fs_read_file", {"path": "still-fine"})
        return errors, big, fine

    before = len(env.effect_lines())
    errors, big, fine = run(go())
    assert "no error" not in errors, errors
    assert errors[0].startswith("unknown tool") and "input schema" in errors[1] and "input schema" in errors[2]
    assert "over the gateway's 4096" in errors[3]
    assert big.isError and "over the gateway's 10000" in text(big)
    assert not fine.isError
    assert [e["tool"] for e in env.effect_lines()[before:]] == ["big", "read_file"]
    step = next(s for s in newest_steps(env) if s["target"] == "fs_big")
    assert step["status"] == "failed" and step["error"]["reason"] == "result_too_large"

    # Raw bodies no client library would send: nested 100 000 deep, not JSON, a 5 MB body.
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
    with httpx.Client(timeout=30) as h:
        r = h.post(url(env), json=init, headers=accept)
        sid = r.headers["mcp-session-id"]
        session = {**accept, "mcp-session-id": sid}
        h.post(url(env), json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        nested = '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fs_read_file","arguments":{"path":' \
            + "[" * 100_000 + "]" * 100_000 + "}}}"
        for body in (nested, "{not json", '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fs_read_file",'
                     '"arguments":{"path":"' + "x" * 5_000_000 + '"}}}'):
            r = h.post(url(env), content=body.encode(), headers=session)
            assert r.status_code in (200, 400, 413), r.text[:300]
            assert r.status_code != 200 or '"error"' in r.text, r.text[:300]
    assert httpx.get(f"{env.gateway.url}/health", timeout=5).status_code == 200
    assert env.gateway.alive()


def test_a_client_needs_the_agent_token_and_no_gateway_secret_reaches_the_upstream(env: Env) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}):
        r = httpx.post(url(env, "guarded"), json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
                       headers={**headers, "Accept": "application/json, text/event-stream"}, timeout=10)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"

    async def go() -> Any:
        async with mcp_session(url(env)) as s:
            return await s.call_tool("fs_env_names", {})

    names = text(run(go())).split()
    assert "EFFECTS" in names
    assert not [n for n in names if n.startswith(("REGENT", "REBUNO"))], names


def test_a_changed_definition_is_hidden_and_refused_until_approved_and_new_tools_wait_for_approval(env: Env) -> None:
    from tests.mcp.conftest import CLIENT_TOKEN

    # The gateway reports what its upstreams offer to the kernel, which holds the pins.
    def reported() -> dict[str, Any] | None:
        tools = env.api.http.get("/v0/mcp/guarded/tools").json().get("tools", [])
        states = {t["tool"]: t for t in tools}
        return states if "fs_write_file" in states else None

    states = wait_for(reported, "the gateway's report of guarded's tools")
    assert states["fs_read_file"]["state"] == "changed"  # the manifest pinned another definition
    assert states["fs_read_file"]["approved_via"] == "manifest"
    assert states["fs_write_file"]["state"] == "new"  # trust_new_tools is off for this agent

    async def listed_and_called() -> tuple[set[str], Any]:
        async with mcp_session(url(env, "guarded"), token=CLIENT_TOKEN) as s:
            names = {t.name for t in (await s.list_tools()).tools}
            return names, await s.call_tool("fs_read_file", {"path": "x"})

    before = len(env.effect_lines(env.effects.with_name("effects.guarded")))
    names, refused = run(listed_and_called())
    assert "fs_read_file" not in names and "fs_write_file" not in names
    assert refused.isError and "definition changed since it was approved" in text(refused)
    assert states["fs_read_file"]["sha256"] in text(refused)
    assert len(env.effect_lines(env.effects.with_name("effects.guarded"))) == before
    assert 'regent_mcp_pin_refusals_total{agent="guarded",tool="fs_read_file"} 1.0' in env.metrics()
    eid = env.executions("guarded")[0]["id"]
    noted = wait_for(lambda: [s for s in env.api.steps(eid) if s["target"] == "mcp.definition_changed"],
                     "the refusal in the execution's timeline")
    assert noted[0]["error"]["reason"] == "tool_definition_changed"

    for tool in ("fs_read_file", "fs_write_file"):
        r = env.api.http.post("/v0/mcp/guarded/tools/approve", json={"tool": tool, "sha256": states[tool]["sha256"]})
        assert r.status_code == 200, r.text
    bad = env.api.http.post("/v0/mcp/guarded/tools/approve", json={"tool": "fs_big", "sha256": "0" * 64})
    assert bad.status_code == 409  # not the definition offered: no approving what no one has seen

    async def called_and_listed() -> tuple[set[str], Any]:
        async with mcp_session(url(env, "guarded"), token=CLIENT_TOKEN) as s:
            # The call re-reads the approvals (it would be refused otherwise); the list then has them.
            called = await s.call_tool("fs_read_file", {"path": "x"})
            return {t.name for t in (await s.list_tools()).tools}, called

    names, allowed = run(called_and_listed())
    assert {"fs_read_file", "fs_write_file"} <= names and not allowed.isError, text(allowed)
    pinned = collections.Counter(t["state"] for t in env.api.http.get("/v0/mcp/guarded/tools").json()["tools"])
    assert pinned["approved"] == 2


def test_after_the_gateway_is_killed_mid_call_a_reconnecting_client_replays_and_no_effect_repeats(env: Env) -> None:
    """kill -9 while an at_most_once write runs upstream; a new gateway, the same session key: the
    finished write replays its recorded result and the interrupted one is refused as
    indeterminate; the upstream sees neither again."""
    import signal
    import threading

    key = "kill-9-session"
    started = threading.Event()

    async def first() -> None:
        async with mcp_session(url(env), key=key) as s:
            done = await s.call_tool("web_write_file", {"path": "k.txt", "content": "once"})
            assert not done.isError, text(done)
            read = await s.call_tool("web_read_file", {"path": "k.txt"})
            assert text(read) == "once"
            started.set()
            # Killed under us: the client's request never gets an answer, so stop waiting for it.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(s.call_tool("web_slow_write", {"path": "k2.txt", "seconds": 3}), 8)

    def killer() -> None:
        wait_for(lambda: any(e["tool"] == "slow_write.start" for e in env.effect_lines(env.http_effects)),
                 "the slow write to start upstream", timeout=60)
        env.gateway.stop(signal.SIGKILL)
        env.restart_gateway()  # the kernel re-delivers the execution to the new gateway once the lease lapses

    before = len(env.effect_lines(env.http_effects))
    t = threading.Thread(target=killer)
    t.start()
    with contextlib.suppress(BaseException):  # the connection dies under the client, however it says so
        run(first())
    t.join(60)
    assert started.is_set()
    eid = next(e["id"] for e in env.executions() if e["input"].get("mcp", {}).get("session_key") == key)

    async def second() -> tuple[Any, Any, Any]:
        async with mcp_session(url(env), key=key) as s:
            write = await s.call_tool("web_write_file", {"path": "k.txt", "content": "once"})
            read = await s.call_tool("web_read_file", {"path": "k.txt"})
            slow = await s.call_tool("web_slow_write", {"path": "k2.txt", "seconds": 3})
            return write, read, slow

    write, read, slow = run(second())
    # The recorded (flattened) results: structured content, its JSON as the text.
    assert not write.isError and write.structuredContent == {"result": "wrote 4 characters to k.txt"}
    assert read.structuredContent == {"result": "once"}
    assert slow.isError and "outcome unknown" in text(slow)
    upstream = [e["tool"] for e in env.effect_lines(env.http_effects)[before:]]
    # The first gateway ran each once; the second replayed the write and the read, ran nothing.
    assert upstream.count("write_file") == 1 and upstream.count("slow_write.start") == 1, upstream
    assert upstream.count("read_file") == 1, upstream
    assert env.executions()[0]["id"] == eid or any(e["id"] == eid for e in env.executions())
    steps = settled_steps(env, eid)
    by = collections.Counter((s["target"], s["status"]) for s in steps)
    assert by[("web_write_file", "succeeded")] == 1 and by[("web_slow_write", "failed")] == 1, by
    assert 'decision="replay"' in env.metrics()


def test_a_client_that_launches_the_gateway_over_stdio_is_governed_the_same(env: Env) -> None:
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from tests.e2e.conftest import clean_env

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernel", "mcp", "serve", "--stdio", "--agent", "local", "--config", str(env.config),
              "--kernel", env.kernel.url, "--port", str(env.stdio_port), "--pins-file", str(env.pins)],
        env=clean_env(REGENT_LOG_LEVEL="warning"), cwd=str(env.tmp))

    async def go() -> tuple[set[str], Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            ok = await s.call_tool("fs_read_file", {"path": "stdio"})
            denied = await s.call_tool("fs_delete_file", {"path": "stdio"})
            return names, ok, denied

    names, ok, denied = run(go())
    assert "fs_read_file" in names and not ok.isError
    assert text(denied) == "rebuno_refusal: denied reason=deletes are not allowed"
    stdio_runs = [e for e in env.executions("local") if e["input"] == {"mcp": {"transport": "stdio"}}]
    assert stdio_runs
    steps = settled_steps(env, stdio_runs[0]["id"])
    assert {(s["target"], s["status"]) for s in steps} == {("fs_read_file", "succeeded"), ("fs_delete_file", "denied")}


def test_an_upstream_list_change_reaches_the_client_and_the_new_tool_is_offered(env: Env) -> None:
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamable_http_client

    async def go() -> tuple[set[str], Any]:
        changed = asyncio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ServerNotification) and \
                    isinstance(message.root, types.ToolListChangedNotification):
                changed.set()

        async with (streamable_http_client(url(env)) as (read, write, _),
                    ClientSession(read, write, message_handler=on_message) as s):
            await s.initialize()
            await s.list_tools()
            added = await s.call_tool("fs_add_tool", {"name": "extra_one"})
            assert not added.isError, text(added)
            await asyncio.wait_for(changed.wait(), 30)
            names = {t.name for t in (await s.list_tools()).tools}
            return names, await s.call_tool("fs_extra_one", {})

    names, result = run(go())
    assert "fs_extra_one" in names  # trust_new_tools: pinned as first seen
    assert not result.isError and "extra extra_one" in text(result)


def test_a_call_parked_by_a_rate_limit_waits_for_the_redelivery_and_then_runs(env: Env) -> None:
    async def go() -> list[Any]:
        async with mcp_session(url(env)) as s:
            return [await s.call_tool("fs_env_names", {}) for _ in range(2)]

    before = len(env.effect_lines())
    first, second = run(go())
    assert not first.isError and not second.isError, text(second)
    assert [e["tool"] for e in env.effect_lines()[before:]] == ["env_names", "env_names"]
    eid = env.executions()[0]["id"]
    types = env.api.types(eid)
    assert "step.rate_limited" in types and types.count("dispatch.queued") >= 2  # parked, then delivered again


def test_a_client_may_present_a_kernel_api_key_and_needs_executions_write(env: Env) -> None:
    keys = {}
    for name, scopes in (("mcp-writer", ["executions:write"]), ("mcp-other", ["executions:write"]),
                         ("mcp-reader", ["executions:read"])):
        r = env.api.http.post("/v0/api-keys", json={"name": name, "scopes": scopes})
        assert r.status_code == 201, r.text
        keys[name] = r.json()["token"]

    async def call(token: str) -> Any:
        async with mcp_session(url(env), token=token) as s:
            return await s.call_tool("fs_read_file", {"path": "keyed"})

    assert not run(call(keys["mcp-writer"])).isError

    async def keyed(token: str) -> str:
        async with mcp_session(url(env), token=token, key="shared-key") as s:
            await s.call_tool("fs_read_file", {"path": "keyed"})
        return str(next(e["id"] for e in env.executions() if e["input"]["mcp"].get("session_key") == "shared-key"
                        and e["id"] not in seen))

    seen: set[str] = set()
    mine = run(keyed(keys["mcp-writer"]))
    seen.add(mine)
    assert run(keyed(keys["mcp-other"])) != mine  # the same key under another credential: its own execution
    assert "refused to start this session's execution: 403" in _raised(call(keys["mcp-reader"]))
    assert "refused to start this session's execution: 401" in _raised(call("rbk_not.a-real-key"))


def _raised(coro: Any) -> str:
    """The messages of the McpErrors a session raised (the client's task groups wrap them)."""
    try:
        run(coro)
    except BaseException as e:
        found: list[str] = []

        def walk(x: BaseException) -> None:
            if isinstance(x, McpError):
                found.append(str(x))
            for inner in getattr(x, "exceptions", ()):
                walk(inner)
        walk(e)
        return " | ".join(found)
    return "no error"


def test_the_webhook_takes_only_the_kernels_signed_deliveries(env: Env) -> None:
    from tests.e2e.conftest import sign_webhook
    from tests.mcp.conftest import SECRET

    hook = f"{env.gateway.url}/webhooks/files"
    body = b'{"execution_id":"x","dispatch_id":"y","dispatch_attempt":1,"lease_timeout_seconds":5}'
    assert httpx.post(hook, content=body, headers={"Rebuno-Signature": "sha256=00"}).status_code == 401
    assert httpx.post(hook, content=body).status_code == 401
    for bad in (b"{", b"[]", b'{"execution_id":"x"}', b'{"execution_id":"x","dispatch_id":"y","dispatch_attempt":"z"}'):
        r = httpx.post(hook, content=bad, headers={"Rebuno-Signature": sign_webhook(SECRET, bad)})
        assert r.status_code == 400, (bad, r.text)
    big = b"x" * 100_000
    assert httpx.post(hook, content=big, headers={"Rebuno-Signature": sign_webhook(SECRET, big)}).status_code == 401
    assert httpx.post(f"{env.gateway.url}/webhooks/nobody", content=body).status_code == 404
    assert env.gateway.alive()


def test_a_stdio_client_can_relay_to_the_running_http_gateway(env: Env) -> None:
    """`--stdio --gateway URL`: no webhook of its own; the HTTP gateway governs the calls."""
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from tests.e2e.conftest import clean_env

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernel", "mcp", "serve", "--stdio", "--agent", "files", "--gateway", env.gateway.url,
              "--session-key", "relayed"],
        env=clean_env(REGENT_LOG_LEVEL="warning"), cwd=str(env.tmp))

    async def go() -> tuple[set[str], Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            return names, await s.call_tool("fs_delete_file", {"path": "relay"})

    names, result = run(go())
    assert {"fs_read_file", "web_read_file"} <= names
    assert result.isError and text(result) == "rebuno_refusal: denied reason=deletes are not allowed"
    keyed = [e for e in env.executions() if e["input"]["mcp"].get("session_key") == "relayed"]
    assert len(keyed) == 1 and keyed[0]["input"]["mcp"]["transport"] == "http"
    assert [(s["target"], s["status"]) for s in env.api.steps(keyed[0]["id"])] == [("fs_delete_file", "denied")]


def test_a_call_is_answered_with_one_json_body_unless_it_asked_for_progress(env: Env) -> None:
    """JSON is the cheaper answer (kernel/mcp/answers.py); SSE is kept for a request carrying a
    progress token, so a call waiting on an approver can report progress (the approval test)."""
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}

    def call(n: int, meta: dict[str, Any] | None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": "fs_read_file", "arguments": {"path": f"shape-{n}.txt"}}
        if meta is not None:
            params["_meta"] = meta
        return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}

    with httpx.Client(timeout=60) as h:
        r = h.post(url(env), json=init, headers=accept)
        assert r.status_code == 200, r.text[:300]
        session = {**accept, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        h.post(url(env), json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        plain = h.post(url(env), json=call(2, None), headers=session)
        streamed = h.post(url(env), json=call(3, {"progressToken": "p-3"}), headers=session)
        json_only = h.post(url(env), json=call(4, {"progressToken": "p-4"}),
                           headers={**session, "Accept": "application/json"})
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("application/json")
    body = plain.json()
    assert body["id"] == 2 and "(no file shape-2.txt)" in body["result"]["content"][0]["text"]
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert '"id":3' in streamed.text and "(no file shape-3.txt)" in streamed.text
    # A client that reads no SSE is answered in JSON even when it asks for progress.
    assert json_only.status_code == 200 and json_only.json()["id"] == 4
