"""The MCP tools page in a real Chromium under `regent dev`: each tool the agent's bundle denies
whatever the arguments is marked "denied by policy", and "(hidden)" where the agent's manifest sets
`mcp.hide_denied_tools` (docs/console.md, "MCP tools"); the API's `denied_always` is the oracle."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.conftest import ConsoleKernel, console_kernel, shot
from tests.e2e.conftest import SECRET
from tests.support import AgentClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# bundles/shell.yaml: default deny, rules for shell_exec only. So fs_read_file is denied whatever
# the arguments, shell_exec is not (read-only commands are allowed, others need approval).
UPSTREAM = f"{{prefix: fs, command: {sys.executable}}}"
MCP = {"hider": f"{{hide_denied_tools: true, upstreams: [{UPSTREAM}]}}",
       "shower": f"{{hide_denied_tools: false, upstreams: [{UPSTREAM}]}}"}


def tool(name: str, upstream: str, description: str) -> dict[str, Any]:
    return {"tool": name, "upstream": upstream,
            "definition": {"name": name.split("_", 1)[1], "description": description, "inputSchema": {}}}


TOOLS = [tool("fs_read_file", "fs", "Read a file's text."), tool("shell_exec", "shell", "Run a shell command.")]


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleKernel]:
    with console_kernel(tmp_path_factory.mktemp("console-mcp"), agent_ids=("hider", "shower"), mcp=MCP) as (k, _):
        for agent in MCP:
            with AgentClient(k.url, agent, SECRET) as a:  # a gateway's report, signed as the agent
                r = a.request("POST", f"/v0/mcp/{agent}/tools", {"tools": TOOLS, "trust_new_tools": True},
                              lease=False)
            assert r.status_code == 200, r.text
        yield k


def _denied_always(ck: ConsoleKernel, agent: str) -> dict[str, bool]:
    tools = ck.api.http.get(f"/v0/mcp/{agent}/tools").json()["tools"]
    return {t["tool"]: t["denied_always"] for t in tools}


@pytest.mark.parametrize(("agent", "badge"), [("hider", "denied by policy (hidden)"), ("shower", "denied by policy")])
def test_the_mcp_tools_page_marks_the_tools_the_bundle_always_denies(ck: ConsoleKernel, page: Any, agent: str,
                                                                      badge: str) -> None:
    assert _denied_always(ck, agent) == {"fs_read_file": True, "shell_exec": False}
    page.goto(f"{ck.url}/console/mcp?agent_id={agent}")
    page.wait_for_selector("#mcp-tools")
    assert "Policy" in page.locator("#mcp-tools thead").inner_text()
    denied = page.locator("tr.tool-row", has_text="fs_read_file")
    listed = page.locator("tr.tool-row", has_text="shell_exec")
    assert denied.get_attribute("data-denied-always") == "true"
    assert denied.locator("td.policy").inner_text() == badge
    assert denied.locator("td.policy .denied-always").is_visible()
    assert listed.get_attribute("data-denied-always") == "false"
    assert listed.locator("td.policy").inner_text() == ""
    assert (denied.get_attribute("data-state"), listed.get_attribute("data-state")) == ("approved", "approved")
    shot(page, f"mcp-tools-denied-{agent}")
