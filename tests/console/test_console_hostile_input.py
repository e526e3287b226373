"""Hostile query strings on the console's pages: a 400 (or the page, ignoring a value it cannot
use), never a 500 or a cut stream, the same on SQLite and PostgreSQL, over real HTTP. Found by a
probe of 901 requests per store (NUL, lone surrogates, superscript digits, huge numbers)."""

from __future__ import annotations

import csv
import io
import json
import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from kernel import console
from kernel.api.app import create_app
from kernel.core import audit
from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

NUL = "%00"
SUPERSCRIPT_TWO = "%C2%B2"  # "²": str.isdigit() says yes, int() says no


@pytest.fixture
def server(kernel: Kernel) -> Iterator[ServerThread]:
    """The API and the console, as `regent dev` serves them (the console's anonymous admin)."""
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    console.install(app, dev=True, bearer_token="boot-token")
    with ServerThread(app) as srv:
        yield srv


def _get(server: ServerThread, path: str) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        return c.get(path)


@pytest.mark.parametrize("field", ["agent_id", "rule_id", "target", "policy_hash", "execution_id"])
@pytest.mark.parametrize("page", ["/console/audit", "/console/audit/chart.svg", "/console/audit/export.jsonl",
                                  "/console/audit/export.csv"])
def test_a_nul_in_an_audit_filter_is_a_400(server: ServerThread, page: str, field: str) -> None:
    r = _get(server, f"{page}?{field}=a{NUL}b")
    assert r.status_code == 400, r.text[:300]
    assert "NUL" in r.text


def test_a_nul_in_the_executions_filter_is_a_400(server: ServerThread) -> None:
    r = _get(server, f"/console/executions?agent_id={NUL}")
    assert r.status_code == 400 and "NUL" in r.text, r.text[:300]


@pytest.mark.parametrize("query", [f"agent_id={NUL}", f"target=a{NUL}", f"rule_id={NUL}", "after=not-a-cursor",
                                   "before=" + "A" * 60])
def test_a_filter_or_cursor_the_inbox_cannot_use_is_a_400_above_the_inbox(server: ServerThread, query: str) -> None:
    r = _get(server, f"/console/approvals?{query}")
    assert r.status_code == 400 and 'id="decide-error"' in r.text and 'id="inbox"' in r.text, r.text[:300]


@pytest.mark.parametrize("query", ["q=not-hex", "q=" + "0" * 37, "newer=nope", f"from={NUL}"])
def test_a_search_the_executions_list_cannot_run_is_a_400_above_the_form(server: ServerThread, query: str) -> None:
    r = _get(server, f"/console/executions?{query}")
    assert r.status_code == 400 and 'id="search-error"' in r.text and 'id="executions-search"' in r.text, r.text[:300]


@pytest.mark.parametrize("export", ["export.jsonl", "export.csv"])
def test_an_export_the_search_refuses_is_a_400_before_the_stream_starts(server: ServerThread, export: str) -> None:
    # Before: the unknown decision was found while streaming, after the 200's headers, and the
    # client saw the connection cut mid-body.
    r = _get(server, f"/console/audit/{export}?decision=nonsense")
    assert r.status_code == 400 and "decision must be one of" in r.text, r.text[:300]


def test_an_export_still_streams_every_matching_row(server: ServerThread, running: Running,
                                                   agent_client: AgentClient) -> None:
    # The first page is now read before the response starts and the rest while it streams: more
    # rows than one page (MAX_PAGE) come out whole, in the order of /v0/decisions.
    n = audit.MAX_PAGE + 5
    eid, did, att = running.start()
    agent_client.lease(did, att)
    for i in range(n):
        assert agent_client.submit(eid, "shell.run", {"i": i}).json()["decision"] == "proceed"
    jsonl = _get(server, f"/console/audit/export.jsonl?execution_id={eid}")
    assert jsonl.status_code == 200, jsonl.text[:300]
    _, *rows, end = [json.loads(line) for line in jsonl.text.splitlines()]  # between its head and end lines
    api = httpx.get(f"{server.url}/v0/decisions", params={"execution_id": eid, "limit": 3}).json()["decisions"]
    assert len(rows) == n and [r["id"] for r in rows[:3]] == [r["id"] for r in api]
    assert end == {"regent_export_end": {"rows": n, "complete": True}}
    table = _get(server, f"/console/audit/export.csv?execution_id={eid}")
    lines = table.text.splitlines()
    assert lines[0].startswith("# regent decisions export") and lines[-1] == f"# end of export: {n} rows, complete"
    assert table.status_code == 200 and len(list(csv.reader(io.StringIO("\n".join(lines[1:-1]))))) == n + 1  # with its header


@pytest.mark.parametrize("query", [f"after_seq={SUPERSCRIPT_TWO}", "after_seq=" + "9" * 40,
                                   f"after_seq={SUPERSCRIPT_TWO}&seen={SUPERSCRIPT_TWO}"])
def test_a_timeline_ignores_an_after_seq_that_is_not_a_plain_number(server: ServerThread, running: Running,
                                                                      query: str) -> None:
    eid, _, _ = running.start()
    for path in (f"/console/executions/{eid}", f"/console/executions/{eid}/live"):
        r = _get(server, f"{path}?{query}")
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        assert eid in r.text or r.headers.get("X-Regent-Seq")


def test_a_superscript_in_a_revision_comparison_is_ignored(server: ServerThread, running: Running) -> None:
    r = _get(server, f"/console/policies?agent_id={running.agent_id}&from={SUPERSCRIPT_TWO}&to=1"
                     f"&stored={SUPERSCRIPT_TWO}")
    assert r.status_code == 200, r.text[:300]
    assert "Stored revision" not in r.text


def test_an_unknown_execution_is_a_404_not_a_500(server: ServerThread) -> None:
    r = _get(server, f"/console/executions/{uuid.uuid4()}?after_seq={SUPERSCRIPT_TWO}")
    assert r.status_code == 404, r.text[:300]


def _form(server: ServerThread) -> tuple[httpx.Client, str]:
    """A console session and its CSRF token, read from a page's form as a browser would."""
    c = httpx.Client(base_url=server.url, timeout=10, follow_redirects=False, headers={"Origin": server.url})
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/console/playground").text)
    assert token is not None
    return c, token.group(1)


@pytest.mark.parametrize("path", [f"/console/policies/shell/revisions/{2**70}/activate",
                                  "/console/policies/shell/revisions/999999999999999999999999999999/activate",
                                  "/console/policies/a%00b/revisions/1/activate"],
                         ids=["seq-2^70", "seq-30-digits", "agent-nul"])
def test_re_activating_a_revision_no_store_could_hold_is_a_400(server: ServerThread, running: Running,
                                                                path: str) -> None:
    # Before: the console's route passed the seq (or the NUL) to the store, a driver error, a 500.
    c, csrf = _form(server)
    try:
        r = c.post(path, data={"csrf": csrf})
    finally:
        c.close()
    assert r.status_code == 400, r.text[:300]


@pytest.mark.parametrize("query", [f"tool=a{NUL}b&sha256=" + "0" * 64, "tool=" + "x" * 201, "tool=&sha256=",
                                   "tool=a%0Ab"],
                         ids=["tool-nul", "tool-long", "tool-empty", "tool-newline"])
@pytest.mark.parametrize("agent", ["shell", "a%00b"], ids=["agent", "agent-nul"])
def test_an_mcp_approval_page_for_a_tool_name_no_store_could_hold_is_a_400(server: ServerThread, query: str,
                                                                            agent: str) -> None:
    r = _get(server, f"/console/mcp/{agent}/approve?{query}")
    assert r.status_code == 400, r.text[:300]


def test_an_mcp_approval_post_for_a_hostile_tool_name_approves_nothing_and_is_a_400(server: ServerThread,
                                                                                     running: Running) -> None:
    c, csrf = _form(server)
    try:
        r = c.post("/console/mcp/shell/approve", data={"csrf": csrf, "tool": "a\x00b", "sha256": "0" * 64,
                                                       "confirm": "yes"})
    finally:
        c.close()
    assert r.status_code == 400, r.text[:300]


def test_the_mcp_tools_page_of_an_unknown_agent_is_a_404_and_a_nul_a_400(server: ServerThread) -> None:
    assert _get(server, "/console/mcp?agent_id=nobody").status_code == 404
    assert _get(server, f"/console/mcp?agent_id=a{NUL}").status_code == 400
