"""Hostile values at rest: each one stored through the API (execution input and output, step args,
results and errors, an approval's args and rationale, agent metadata, stream data), then every read
surface walked over real HTTP against `regent serve` (API GETs, console pages as a signed-in user,
audit exports, the event stream, the decision-log file, webhook deliveries): no 5xx, no cut answer,
values read back exactly, no traceback in the kernel's log. On SQLite and PostgreSQL.

Before the console's rendering escaped lone surrogates, one execution with `"\\ud800"` as its input
made /console/executions (and its timeline) a 500 for every user."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability import atrest
from tests.conftest import scratch_pg_database


def test_every_read_surface_renders_every_hostile_value_on_sqlite(tmp_path: Path) -> None:
    assert atrest.problems(tmp_path, f"sqlite:///{tmp_path}/regent.db") == []


@pytest.mark.postgres
def test_every_read_surface_renders_every_hostile_value_on_postgresql(tmp_path: Path) -> None:
    with scratch_pg_database("regent_atrest", migrated=False) as url:
        assert atrest.problems(tmp_path, url) == []


def test_the_console_shows_a_value_nested_past_the_encoders_depth_by_its_size() -> None:
    from kernel.console.web import templates

    deep: object = "\ud800"
    for _ in range(5000):
        deep = [deep]
    pretty = templates.filters["pretty"]
    assert pretty(deep).startswith("(a JSON value nested too deeply")
    assert pretty({"k": "\ud800\x00"}) == '{\n  "k": "\\ud800\\u0000"\n}'


def test_every_printed_value_shows_a_lone_surrogate_as_its_escape_and_keeps_its_escaping() -> None:
    import markupsafe

    from kernel.console.web import templates

    page = templates.from_string("{{ a }}|{{ b }}|{{ c|safe }}").render(
        a="x\ud800<", b=markupsafe.Markup("<b>\ud800</b>"), c="<i>\udfff</i>")
    assert page == "x\\ud800&lt;|<b>\\ud800</b>|<i>\\udfff</i>"
    page.encode("utf-8")  # what failed before: the page could not be encoded
