"""`mcp.hide_denied_tools` (docs/mcp.md, "Hiding denied tools"), end to end: a `regent dev` kernel
(SQLite or PostgreSQL), `regent mcp serve` and the stdio upstream, read with the official client.

tools/list leaves out the tools the agent's bundle denies whatever the arguments; a tool denied
only for some arguments stays listed; a call to a hidden tool is still a step the kernel denies
and records; a policy change that hides a tool reaches a connected client as tools/list_changed."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import scratch_pg_database
from tests.e2e.conftest import DEV_KERNEL_ENV, Api, KernelProc, wait_for
from tests.mcp.conftest import UPSTREAM, GatewayProc, mcp_session, run, text
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SECRET = "mcp-agent-secret"
# fs_delete_file: denied whatever the arguments. fs_write_file: denied only under /etc (the other
# paths fall through to the default allow), so never hidden.
POLICY = """\
default_action: allow
rules:
  - id: no-deletes
    when: {target: fs_delete_file}
    then: {decision: deny, reason: deletes are not allowed}
  - id: no-etc-writes
    when:
      target: fs_write_file
      arguments:
        path: {regex: "^/etc"}
    then: {decision: deny}
"""
# The change a test activates: reads are denied outright too.
NO_READS = POLICY + """\
  - id: no-reads
    when: {target: fs_read_file}
    then: {decision: deny}
"""


def _agent(name: str, gw_port: int, effects: Path, hide: bool) -> str:
    policy = "".join(f"      {line}\n" for line in POLICY.splitlines())
    return f"""\
  - id: {name}
    webhook_url: http://127.0.0.1:{gw_port}/webhooks/{name}
    secret: {SECRET}
    policy:
{policy}    mcp:
      trust_new_tools: true
      hide_denied_tools: {"true" if hide else "false"}
      pins_refresh_seconds: 1
      upstreams:
        - prefix: fs
          command: {sys.executable}
          args: [{UPSTREAM}]
          env: {{EFFECTS: "{effects}.{name}"}}
"""


@dataclass
class HideEnv:
    kernel: KernelProc
    api: Api
    gateway: GatewayProc
    effects: Path

    def url(self, agent: str) -> str:
        return f"{self.gateway.url}/mcp/{agent}"

    def effect_lines(self, agent: str) -> list[str]:
        p = Path(f"{self.effects}.{agent}")
        return p.read_text().splitlines() if p.exists() else []


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HideEnv]:
    tmp = tmp_path_factory.mktemp(f"mcp-hide-{request.param}")
    with contextlib.ExitStack() as stack:
        db_url = (stack.enter_context(scratch_pg_database("regent_mcp_hide")) if request.param == "postgres"
                  else f"sqlite:///{tmp}/regent.db")
        gw_port, effects = free_port(), tmp / "effects"
        config = tmp / "regent.yaml"
        config.write_text("agents:\n" + "".join(_agent(name, gw_port, effects, hide) for name, hide in
                                                (("hider", True), ("shower", False), ("changer", True))))
        kernel = KernelProc("dev", free_port(), db_url, config, tmp / "kernel.out", 60.0,
                            **{**DEV_KERNEL_ENV, "REGENT_DISPATCH_MAX_ATTEMPTS": "200"})
        stack.callback(kernel.stop_gracefully)
        gateway = GatewayProc(config, kernel.url, gw_port, tmp / "gateway.out", tmp / "pins.json")
        stack.callback(gateway.stop, signal.SIGKILL)
        api = Api(kernel.url)
        stack.callback(api.close)
        yield HideEnv(kernel, api, gateway, effects)


def _names(env: HideEnv, agent: str) -> set[str]:
    async def go() -> set[str]:
        async with mcp_session(env.url(agent)) as s:
            return {t.name for t in (await s.list_tools()).tools}

    return set(run(go()))


def test_the_kernel_reports_which_tools_are_denied_whatever_the_arguments(env: HideEnv) -> None:
    _names(env, "shower")  # the gateway has listed the upstream's tools; its report may still be on the way

    def reported() -> dict[str, bool] | None:
        answer = env.api.http.get("/v0/mcp/shower/tools").json()
        got = {t["tool"]: t["denied_always"] for t in answer["tools"]}
        return got if {"fs_delete_file", "fs_write_file", "fs_read_file"} <= set(got) else None

    denied = wait_for(reported, "the gateway's report of the upstream's tools", timeout=20)
    assert denied["fs_delete_file"] is True
    assert denied["fs_write_file"] is False  # denied only for some paths
    assert denied["fs_read_file"] is False


def test_hide_denied_tools_leaves_out_only_the_tools_denied_whatever_the_arguments(env: HideEnv) -> None:
    hidden = _names(env, "hider")
    assert "fs_delete_file" not in hidden
    assert {"fs_write_file", "fs_read_file"} <= hidden
    shown = _names(env, "shower")  # hide_denied_tools: false
    assert {"fs_delete_file", "fs_write_file", "fs_read_file"} <= shown


def test_a_call_to_a_hidden_tool_is_still_a_step_the_kernel_denies(env: HideEnv) -> None:
    async def go() -> Any:
        async with mcp_session(env.url("hider")) as s:
            assert "fs_delete_file" not in {t.name for t in (await s.list_tools()).tools}
            return await s.call_tool("fs_delete_file", {"path": "a.txt"})

    before = len(env.effect_lines("hider"))
    result = run(go())
    assert result.isError
    assert text(result) == "rebuno_refusal: denied reason=deletes are not allowed"
    assert env.effect_lines("hider")[before:] == []
    r = env.api.http.get("/v0/executions", params={"agent_id": "hider", "limit": 1})
    eid = r.json()["executions"][0]["id"]
    steps = wait_for(lambda: [s for s in env.api.steps(eid) if s["target"] == "fs_delete_file"],
                     "the denied step", timeout=20)
    assert steps[0]["status"] == "denied" and steps[0]["error"]["rule_id"] == "no-deletes"


def test_a_policy_change_that_hides_a_tool_sends_tools_list_changed(env: HideEnv) -> None:
    async def go() -> tuple[set[str], set[str]]:
        changed = asyncio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ServerNotification) and \
                    isinstance(message.root, types.ToolListChangedNotification):
                changed.set()

        async with (streamable_http_client(env.url("changer")) as (read, write, _),
                    ClientSession(read, write, message_handler=on_message) as s):
            await s.initialize()
            before = {t.name for t in (await s.list_tools()).tools}
            r = env.api.http.post("/v0/policies/changer", json={"bundle": NO_READS, "kind": "yaml"})
            assert r.status_code == 204, r.text
            await asyncio.wait_for(changed.wait(), 30)  # seen on the next refresh (pins_refresh_seconds: 1)
            return before, {t.name for t in (await s.list_tools()).tools}

    before, after = run(go())
    assert "fs_read_file" in before and "fs_delete_file" not in before
    assert "fs_read_file" not in after and "fs_delete_file" not in after and "fs_write_file" in after
