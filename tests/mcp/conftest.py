"""Real processes for the MCP gateway: a `regent dev` kernel (SQLite or PostgreSQL), `regent mcp
serve`, and the upstream of upstream_server.py over stdio (the gateway's child) and over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import DEV_KERNEL_ENV, Api, KernelProc, Proc, clean_env, wait_for
from tests.support import free_port

UPSTREAM = Path(__file__).with_name("upstream_server.py")
SECRET = "mcp-agent-secret"
CLIENT_TOKEN = "mcp-client-token-0123456789"

POLICY = """\
    policy:
      default_action: allow
      rules:
        - id: no-deletes
          when: {target: fs_delete_file}
          then: {decision: deny, reason: deletes are not allowed}
        - id: approve-writes
          when: {target: fs_write_file}
          then:
            decision: require_approval
            reason: writes need a human
        - id: stat-limit
          when: {target: fs_stat}
          then:
            decision: allow
            rate_limit: {max_calls: 2, window: 1h, per_what: execution}
        - id: env-parks
          when: {target: fs_env_names}
          then:
            decision: allow
            rate_limit: {max_calls: 1, window: 2s, per_what: execution, max_wait: 15s}
"""


def manifest_text(gw_port: int, http_port: int, effects: Path, stdio_port: int) -> str:
    py = sys.executable
    return f"""\
agents:
  - id: files
    webhook_url: http://127.0.0.1:{gw_port}/webhooks/files
    secret: {SECRET}
{POLICY}    mcp:
      trust_new_tools: true
      at_most_once: ["fs_write_*", "fs_slow_*", "web_write_*", "web_slow_*"]
      lease_wait_seconds: 40
      approval_wait_seconds: 20
      max_args_bytes: 4096
      max_result_bytes: 10000
      upstreams:
        - prefix: fs
          command: {py}
          args: [{UPSTREAM}]
          env: {{EFFECTS: "{effects}"}}
          timeout_seconds: 6
        - prefix: web
          url: http://127.0.0.1:{http_port}/mcp
          headers: {{X-Upstream-Key: upstream-only}}
  - id: local  # served over stdio: its webhook is the stdio gateway's own port
    webhook_url: http://127.0.0.1:{stdio_port}/webhooks/local
    secret: {SECRET}
{POLICY}    mcp:
      trust_new_tools: true
      upstreams:
        - prefix: fs
          command: {py}
          args: [{UPSTREAM}]
          env: {{EFFECTS: "{effects}.local"}}
  - id: guarded
    webhook_url: http://127.0.0.1:{gw_port}/webhooks/guarded
    secret: {SECRET}
    mcp:
      client_token: {CLIENT_TOKEN}
      pins: {{fs_read_file: "{'0' * 64}"}}
      upstreams:
        - prefix: fs
          command: {py}
          args: [{UPSTREAM}]
          env: {{EFFECTS: "{effects}.guarded", VARIANT: changed}}
"""


class GatewayProc(Proc):
    def __init__(self, config: Path, kernel_url: str, port: int, log: Path, pins: Path):
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "kernel", "mcp", "serve", "--config", str(config), "--kernel", kernel_url,
                "--port", str(port), "--pins-file", str(pins)]
        super().__init__(argv, clean_env(REGENT_LOG_LEVEL="warning"), log)
        wait_for(self._healthy, f"regent mcp on {self.url}\n{self.output()}", timeout=60)

    def _healthy(self) -> bool:
        if not self.alive():
            raise AssertionError(f"regent mcp exited early:\n{self.output()}")
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


@dataclass
class Env:
    kernel: KernelProc
    api: Api
    gateway: GatewayProc
    tmp: Path
    config: Path
    gw_port: int
    effects: Path
    http_effects: Path
    pins: Path
    stdio_port: int

    def effect_lines(self, path: Path | None = None) -> list[dict[str, Any]]:
        p = path or self.effects
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def restart_gateway(self) -> GatewayProc:
        self.gateway = GatewayProc(self.config, self.kernel.url, self.gw_port, self.tmp / "gateway.out", self.pins)
        return self.gateway

    def metrics(self) -> str:
        return httpx.get(f"{self.gateway.url}/metrics", timeout=5).text

    def executions(self, agent: str = "files") -> list[dict[str, Any]]:
        r = self.api.http.get("/v0/executions", params={"agent_id": agent, "limit": 200})
        return list(r.json()["executions"])


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp(f"mcp-{request.param}")
    with contextlib.ExitStack() as stack:
        db_url = (stack.enter_context(scratch_pg_database("regent_mcp")) if request.param == "postgres"
                  else f"sqlite:///{tmp}/regent.db")
        gw_port, http_port, stdio_port = free_port(), free_port(), free_port()
        effects, http_effects = tmp / "effects", tmp / "http-effects"
        config = tmp / "regent.yaml"
        config.write_text(manifest_text(gw_port, http_port, effects, stdio_port))
        upstream = Proc([sys.executable, str(UPSTREAM), "--http", str(http_port)],
                        clean_env(EFFECTS=str(http_effects)), tmp / "http-upstream.out")
        stack.callback(upstream.stop, signal.SIGKILL)
        wait_for(lambda: _listening(http_port), f"the HTTP upstream\n{upstream.output()}", timeout=60)
        # Attempts are generous: a gateway restarted on a loaded machine can take many seconds to
        # listen, and each refused delivery meanwhile is an attempt.
        kernel = KernelProc("dev", free_port(), db_url, config, tmp / "kernel.out",
                            **{**DEV_KERNEL_ENV, "REGENT_DISPATCH_MAX_ATTEMPTS": "200"})
        stack.callback(kernel.stop_gracefully)
        gateway = GatewayProc(config, kernel.url, gw_port, tmp / "gateway.out", tmp / "pins.json")
        e = Env(kernel, Api(kernel.url), gateway, tmp, config, gw_port, effects, http_effects, tmp / "pins.json",
                stdio_port)
        stack.callback(lambda: e.gateway.stop(signal.SIGKILL))
        stack.callback(e.api.close)
        yield e


def _listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
        return True
    except httpx.HTTPError:
        return False


@contextlib.asynccontextmanager
async def mcp_session(url: str, *, token: str | None = None, key: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if key:
        headers["X-Regent-Session-Key"] = key
    async with (httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as http,
                streamable_http_client(url, http_client=http) as (read, write, _),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def text(result: Any) -> str:
    return "\n".join(b.text for b in result.content if getattr(b, "type", "") == "text")
