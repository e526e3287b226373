"""`regent dev --mcp`: the MCP gateway served by the kernel's own process (kernel/mcp/inkernel.py),
on SQLite and PostgreSQL, with the official `mcp` client and real upstreams: the same answers as
the separate gateway, steps recorded without HTTP, and replay after the kernel is killed mid-call."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import DEV_KERNEL_ENV, Api, KernelProc, Proc, clean_env, wait_for
from tests.mcp.conftest import UPSTREAM, _listening, manifest_text, mcp_session, run, text
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

KERNEL_ENV = {**DEV_KERNEL_ENV, "REGENT_DISPATCH_MAX_ATTEMPTS": "200", "REGENT_MCP_IN_KERNEL": "1"}


@dataclass
class Env:
    kernel: KernelProc
    api: Api
    port: int
    db_url: str
    config: Path
    tmp: Path
    http_effects: Path

    @property
    def url(self) -> str:
        return f"{self.kernel.url}/mcp-gateway/mcp/files"

    def effects(self, path: Path | None = None) -> list[str]:
        import json

        p = path or self.http_effects
        return [json.loads(x)["tool"] for x in p.read_text().splitlines()] if p.exists() else []

    def restart(self) -> None:
        self.kernel = KernelProc("dev", self.port, self.db_url, self.config, self.tmp / "kernel-2.out", **KERNEL_ENV)
        self.api.close()
        self.api = Api(self.kernel.url)

    def executions(self) -> list[dict[str, Any]]:
        return list(self.api.http.get("/v0/executions", params={"agent_id": "files", "limit": 200}).json()["executions"])


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp(f"mcp-in-kernel-{request.param}")
    with contextlib.ExitStack() as stack:
        db_url = (stack.enter_context(scratch_pg_database("regent_mcpk")) if request.param == "postgres"
                  else f"sqlite:///{tmp}/regent.db")
        port, http_port = free_port(), free_port()
        config = tmp / "regent.yaml"
        # The manifest of the separate-gateway tests, with every webhook on the kernel's own port.
        text_ = manifest_text(port, http_port, tmp / "effects", free_port())
        config.write_text(text_.replace(f"127.0.0.1:{port}/webhooks/", f"127.0.0.1:{port}/mcp-gateway/webhooks/"))
        http_effects = tmp / "http-effects"
        upstream = Proc([sys.executable, str(UPSTREAM), "--http", str(http_port)],
                        clean_env(EFFECTS=str(http_effects)), tmp / "http-upstream.out")
        stack.callback(upstream.stop, signal.SIGKILL)
        wait_for(lambda: _listening(http_port), f"the HTTP upstream\n{upstream.output()}", timeout=60)
        kernel = KernelProc("dev", port, db_url, config, tmp / "kernel.out", **KERNEL_ENV)
        e = Env(kernel, Api(kernel.url), port, db_url, config, tmp, http_effects)
        stack.callback(lambda: e.kernel.stop(signal.SIGKILL))
        stack.callback(lambda: e.api.close())
        yield e


def test_calls_are_governed_and_recorded_as_by_the_separate_gateway(env: Env) -> None:
    async def go() -> tuple[Any, Any, Any]:
        async with mcp_session(env.url) as s:
            stat = await s.call_tool("web_stat", {"path": "a.txt"})
            denied = await s.call_tool("fs_delete_file", {"path": "a.txt"})
            decide = asyncio.create_task(_grant(env))
            write = await s.call_tool("fs_write_file", {"path": "w.txt", "content": "yes"})
            await decide
            return stat, denied, write

    stat, denied, write = run(go())
    assert not stat.isError and stat.structuredContent == {"path": "a.txt", "size": 0, "exists": False}
    assert denied.isError and text(denied) == "rebuno_refusal: denied reason=deletes are not allowed"
    assert not write.isError and text(write) == "wrote 3 characters to w.txt"
    execution = env.executions()[0]
    done = env.api.wait_status(execution["id"], "completed")
    assert done["input"] == {"mcp": {"transport": "http"}}
    by = {s["target"]: s for s in env.api.steps(execution["id"])}
    assert by["web_stat"]["status"] == "succeeded" and by["web_stat"]["result"] == stat.structuredContent
    assert by["fs_delete_file"]["status"] == "denied"
    assert by["fs_write_file"]["status"] == "succeeded" and by["fs_write_file"]["idempotency"] == "at_most_once"
    assert env.effects(env.tmp / "effects").count("write_file") == 1
    # The kernel's own decision metrics count the in-process submissions as they count the routes'.
    metrics = httpx.get(f"{env.kernel.url}/metrics", timeout=10).text
    assert 'decision="denied"' in metrics and 'regent_mcp_calls_total{agent="files",decision="proceed",upstream="web"}' \
        in httpx.get(f"{env.kernel.url}/mcp-gateway/metrics", timeout=10).text


async def _grant(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.kernel.url, timeout=10) as h:
        for _ in range(400):
            pending = (await h.get("/v0/approvals")).json()
            if pending:
                r = await h.post(f"/v0/approvals/{pending[0]['id']}/grant", json={"decided_by": "ops"})
                assert r.status_code == 204, r.text
                return
            await asyncio.sleep(0.05)
    raise AssertionError("no approval was requested")


def _inline_calls(env: Env) -> int:
    """regent_lane_inline: step calls the kernel ran on its event loop (kernel/lane.py `call_hot`)."""
    for line in httpx.get(f"{env.kernel.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("regent_lane_inline_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no regent_lane_inline_total in /metrics")


def test_with_a_client_s_event_stream_open_a_lone_call_s_step_runs_on_the_event_loop(env: Env) -> None:
    """An MCP client holds its GET stream open for the whole session; the gateway counts it as
    held open (kernel/mcp/inkernel.py `_Waiting`), so the kernel is still idle between calls and
    the call's own submit and outcome run on the loop instead of the lane (SQLite only)."""
    if not env.db_url.startswith("sqlite"):
        pytest.skip("the event loop runs step calls on SQLite only (REGENT_SQLITE_INLINE_IDLE_CALLS)")

    async def go() -> int:
        async with mcp_session(env.url) as s:
            first = await s.call_tool("web_stat", {"path": "inline-0"})
            assert not first.isError, text(first)
            # The client's GET stream is open by now, the first outcome recorded, and the pause is
            # over that a slow first call (over 10 ms: a cold start) puts on the loop (kernel/lane.py).
            await asyncio.sleep(1.2)
            before = await asyncio.to_thread(_inline_calls, env)
            for i in range(1, 6):
                r = await s.call_tool("web_stat", {"path": f"inline-{i}"})
                assert not r.isError, text(r)
            await asyncio.sleep(0.5)  # the last outcome is recorded while the answer goes back
            return await asyncio.to_thread(_inline_calls, env) - before

    ran = run(go())
    # Five calls: five submits on the loop, their outcomes on the lane (recorded while the answer
    # goes back: kernel/mcp/calls.py `_record_aside`). Held up by the stream, none ran on the loop;
    # a slow disk (a call over 10 ms pauses the loop's calls for a second) or a dispatcher poll on
    # the lane at the wrong moment may send some of them to the lane.
    assert ran >= 1, ran


def test_after_the_kernel_is_killed_mid_call_a_reconnecting_client_replays_and_no_effect_repeats(env: Env) -> None:
    """kill -9 of the kernel (and so of its gateway) while an at_most_once write runs upstream; the
    kernel restarted on the same store, the same session key: the finished write replays its
    recorded result, the interrupted one is refused as indeterminate, the upstream sees neither again."""
    key = "in-kernel-kill-9"
    started = threading.Event()

    async def first() -> None:
        async with mcp_session(env.url, key=key) as s:
            done = await s.call_tool("web_write_file", {"path": "k.txt", "content": "once"})
            assert not done.isError, text(done)
            started.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(s.call_tool("web_slow_write", {"path": "k2.txt", "seconds": 3}), 8)

    def killer() -> None:
        wait_for(lambda: "slow_write.start" in env.effects(), "the slow write to start upstream", timeout=60)
        env.kernel.stop(signal.SIGKILL)
        env.restart()

    before = len(env.effects())
    t = threading.Thread(target=killer)
    t.start()
    with contextlib.suppress(BaseException):
        run(first())
    t.join(90)
    assert started.is_set()

    async def second() -> tuple[Any, Any]:
        async with mcp_session(env.url, key=key) as s:
            write = await s.call_tool("web_write_file", {"path": "k.txt", "content": "once"})
            slow = await s.call_tool("web_slow_write", {"path": "k2.txt", "seconds": 3})
            return write, slow

    write, slow = run(second())
    assert not write.isError and write.structuredContent == {"result": "wrote 4 characters to k.txt"}
    assert slow.isError and "outcome unknown" in text(slow)
    upstream = env.effects()[before:]
    assert upstream.count("write_file") == 1 and upstream.count("slow_write.start") == 1, upstream
    eid = next(e["id"] for e in env.executions() if e["input"].get("mcp", {}).get("session_key") == key)
    by = collections.Counter((s["target"], s["status"]) for s in env.api.steps(eid))
    assert by[("web_write_file", "succeeded")] == 1 and by[("web_slow_write", "failed")] == 1, by


def test_the_flag_without_an_mcp_agent_is_refused_at_start(tmp_path: Path) -> None:
    config = tmp_path / "regent.yaml"
    config.write_text("agents:\n  - id: plain\n    webhook_url: http://127.0.0.1:9/w\n    secret: s3cret-s3cret\n")
    import subprocess

    r = subprocess.run([sys.executable, "-m", "kernel", "dev", "--mcp", "--port", str(free_port()), "--db-url",
                        f"sqlite:///{tmp_path}/r.db", "--config", str(config)], capture_output=True, text=True,
                       timeout=60, env=clean_env())
    assert r.returncode != 0
    assert "has none" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr
