"""Hostile console forms: what a form may carry (a 5 000-digit integer, JSON nested 10 000 deep, a
NUL in the agent id of the path) is answered with the form and its error (400), never a 500, the
same on SQLite and PostgreSQL, over real HTTP. The playground's args went to `json.loads`, whose
RecursionError and int-digit ValueError escaped; the policy upload passed `a\\x00b` to the store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel import console
from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from tests.conftest import Running, scratch_pg_database
from tests.support import ServerThread

HUGE_INT = "9" * 5000
DEEP = "[" * 10_000 + "]" * 10_000
DEEPER_THAN_STEPS = '{"a":' + "[" * 600 + "]" * 600 + "}"  # a step's args stop at 512 levels


@pytest.fixture
def server(kernel: Kernel) -> Iterator[ServerThread]:
    app = create_app(kernel, dev=True, bearer_token="boot-token")
    console.install(app, dev=True, bearer_token="boot-token")
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture
def session(server: ServerThread) -> Iterator[tuple[httpx.Client, str]]:
    """A console session and its CSRF token, read from a page's form as a browser would."""
    with httpx.Client(base_url=server.url, timeout=30, follow_redirects=False,
                      headers={"Origin": server.url}) as c:
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/console/playground").text)
        assert token is not None
        yield c, token.group(1)


def _form_error(r: httpx.Response, words: str) -> None:
    assert r.status_code == 400, r.text[:300]
    assert r.headers["content-type"].startswith("text/html") and words in r.text, r.text[:2000]


@pytest.mark.parametrize(("args", "words"), [
    (f'{{"n": {HUGE_INT}}}', "more than 4300 digits"),
    (f'{{"n": -{HUGE_INT}}}', "more than 4300 digits"),
    (f'{{"a": {DEEP}}}', "nested deeper than"),
    (DEEPER_THAN_STEPS, "nested deeper than"),
], ids=["5000-digit", "negative-5000-digit", "10000-deep", "600-deep"])
def test_playground_args_no_step_could_carry_are_a_form_error(session: tuple[httpx.Client, str], running: Running,
                                                              args: str, words: str) -> None:
    c, csrf = session
    r = c.post("/console/playground", data={"csrf": csrf, "agent_id": running.agent_id, "kind": "tool_call",
                                            "target": "shell.run", "args": args})
    _form_error(r, words)


@pytest.mark.parametrize("field", ["candidate_data", "candidate_manifest"])
@pytest.mark.parametrize("value", [f'{{"n": {HUGE_INT}}}', f'{{"a": {DEEP}}}'], ids=["5000-digit", "10000-deep"])
def test_a_rego_candidates_json_no_bundle_could_carry_is_a_form_error(session: tuple[httpx.Client, str],
                                                                      running: Running, field: str,
                                                                      value: str) -> None:
    c, csrf = session
    r = c.post("/console/playground", data={
        "csrf": csrf, "agent_id": running.agent_id, "kind": "tool_call", "target": "shell.run", "args": "{}",
        "candidate_kind": "rego", "candidate": "package regent\ndefault allow := true\n", field: value})
    assert r.status_code == 400, r.text[:300]


@pytest.mark.parametrize("agent", ["a%00b", "%ED%A0%80"], ids=["nul", "surrogate-bytes"])
def test_uploading_a_bundle_for_an_agent_id_no_store_can_hold_is_a_400(session: tuple[httpx.Client, str],
                                                                       agent: str) -> None:
    c, csrf = session
    r = c.post(f"/console/policies/{agent}", data={"csrf": csrf, "kind": "yaml", "source": "default_action: allow\n"})
    assert r.status_code in (400, 404), r.text[:300]


@pytest.mark.parametrize("path", ["/console/playground", "/console/playground/replay"])
def test_a_playground_agent_id_no_store_can_hold_is_a_form_error(session: tuple[httpx.Client, str],
                                                                 path: str) -> None:
    # R11 on PostgreSQL: the NUL reached the store, a driver error, a 500 (SQLite matched nothing).
    c, csrf = session
    r = c.post(path, data={"csrf": csrf, "agent_id": "a\x00b", "kind": "tool_call", "target": "t", "args": "{}"})
    assert r.status_code == 400 and "NUL" in r.text, r.text[:300]


def test_the_playground_still_decides_ordinary_args(session: tuple[httpx.Client, str], running: Running) -> None:
    c, csrf = session
    r = c.post("/console/playground", data={"csrf": csrf, "agent_id": running.agent_id, "kind": "tool_call",
                                            "target": "shell.run", "args": '{"n": 12345678901234567890}'})
    assert r.status_code == 200, r.text[:300]


def test_every_console_form_holds_against_regent_serve_on_sqlite(tmp_path: Path) -> None:
    """R11 of `regent chaos`: each state-changing form, signed in, with hostile fields."""
    from reliability import forms

    assert forms.problems(tmp_path, f"sqlite:///{tmp_path}/regent.db") == []


@pytest.mark.postgres
def test_every_console_form_holds_against_regent_serve_on_postgresql(tmp_path: Path) -> None:
    from reliability import forms

    with scratch_pg_database("regent_forms", migrated=False) as url:
        assert forms.problems(tmp_path, url) == []
