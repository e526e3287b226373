"""The decisions audit: search the durable decision record (agent, decision, rule, target, bundle,
time range), a chart of decisions over time by outcome drawn on the server as SVG, and the
filtered set exported as JSON lines or CSV, streamed page by page."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from kernel.console.policies import source_files
from kernel.console.web import (
    SECURITY_HEADERS,
    ConsoleRoute,
    finish,
    kernel_of,
    page,
    require,
    templates,
    time_field,
    viewer,
)
from kernel.core import agents, audit, policies, timeline
from kernel.domain import DecisionOutcome
from kernel.errors import ValidationError, invalid
from kernel.lane import call

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
SCOPE = "decisions:read"
PAGE_SIZE = 50
# The shortcuts the decision filter offers besides the outcomes: kernel rule ids an auditor looks for.
RULE_SHORTCUTS = {"eval-error": "eval-error", "bundle-error": "bundle-error"}
# What the v0 API answered the agent for an outcome whose name differs (rebuno-v0 §5): the search
# says so, for an auditor who looks for the `blocked` answer an agent logged.
WIRE_ANSWERS = {"awaiting_approval": "API: blocked", "rate_limited": "API: rate_limited or blocked"}
FIELDS = ("agent_id", "decision", "rule_id", "target", "policy_hash", "execution_id", "from", "to")  # the search form's
CSV_COLUMNS = ("decided_at", "agent_id", "execution_id", "step_id", "kind", "target", "decision", "rule_id",
               "reason", "policy_kind", "policy_revision", "policy_hash", "decided_by", "credential", "event_seq")


async def query_of(request: Request, limit: int = PAGE_SIZE,
                   cursor: bool = True) -> tuple[audit.DecisionQuery, dict[str, str]]:
    """The search form's fields → the core's query (and the fields as given, to refill the form).
    The bundle field takes a revision name or a policy hash."""
    query, fields = _query(request, limit, cursor)
    if query.policy_hash is not None:
        h = await call(policies.policy_hash_of, kernel_of(request), query.policy_hash, query.agent_id)
        query = audit.DecisionQuery(**{**_fields(query), "policy_hash": h})
    return query, fields


def _query(request: Request, limit: int, cursor: bool) -> tuple[audit.DecisionQuery, dict[str, str]]:
    q = request.query_params
    fields = {key: q.get(key, "").strip() for key in FIELDS}
    for key, value in fields.items():
        if len(value) > 1024:
            raise invalid(f"{key} is too long")
    decision, rule = fields["decision"] or None, fields["rule_id"] or None
    if fields["decision"] in RULE_SHORTCUTS:
        decision, rule = None, RULE_SHORTCUTS[fields["decision"]]
    return audit.DecisionQuery(
        agent_id=fields["agent_id"] or None, decision=decision, rule_id=rule, target=fields["target"] or None,
        policy_hash=fields["policy_hash"] or None, execution_id=fields["execution_id"] or None,
        since=time_field(fields["from"], "from"), until=time_field(fields["to"], "to"),
        cursor=(q.get("cursor") or None) if cursor else None, limit=limit,
    ), fields


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the chart draws one outcome: a colour from the Okabe–Ito palette (told apart with
    the common colour-vision deficiencies) and a fill pattern of its own, so no two outcomes
    differ by colour alone; the legend shows the same swatches."""

    name: str
    colour: str
    pattern: str  # solid | diagonal | dots | horizontal | vertical | cross | backslash


OUTCOMES = (
    Outcome("allowed", "#009e73", "solid"),
    Outcome("denied", "#d55e00", "diagonal"),
    Outcome("awaiting_approval", "#e69f00", "dots"),
    Outcome("rate_limited", "#cc79a7", "horizontal"),
    Outcome("approval_granted", "#56b4e9", "vertical"),
    Outcome("approval_denied", "#0072b2", "cross"),
    Outcome("approval_expired", "#7f7f7f", "backslash"),
)
_ORDER = {o.name: i for i, o in enumerate(OUTCOMES)}


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    height: float
    outcome: str
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bar_width: float
    bars: list[Bar]
    ticks: list[tuple[float, str]]  # x, label
    max_count: int
    total: int
    span: str
    per: str  # what one bar covers, for the legend
    outcomes: tuple[Outcome, ...] = OUTCOMES


def _per(width: timedelta) -> str:
    minutes = int(width.total_seconds() // 60)
    n, unit = (minutes, "minute") if minutes < 60 else (minutes // 60, "hour") if minutes < 1440 else (minutes // 1440, "day")
    return unit if n == 1 else f"{n} {unit}s"


def chart(counts: audit.DecisionCounts) -> Chart:
    """Stacked bars, one per time bucket, one colour and pattern per outcome (numbers only:
    nothing a visitor typed reaches the SVG except through the escaped title text)."""
    width, height, left, bottom, top_pad = 960, 200, 40, 22, 26  # top_pad: the caption's line
    n = len(counts.buckets)
    per = [sum(b.values()) for b in counts.buckets]
    top = max(per, default=0) or 1
    slot = (width - left) / max(n, 1)
    bars: list[Bar] = []
    stamp = "%Y-%m-%d %H:%M" if counts.width < timedelta(days=1) else "%Y-%m-%d"
    for i, bucket in enumerate(counts.buckets):
        y = float(height - bottom)
        start, end = counts.edges[i], counts.edges[i + 1]
        for outcome in sorted(bucket, key=lambda o: _ORDER.get(o, 99)):
            h = (height - bottom - top_pad) * bucket[outcome] / top
            y -= h
            bars.append(Bar(left + i * slot + 1, y, h, outcome if outcome in _ORDER else "approval_expired",
                            f"{start:{stamp}} – {end:{stamp}} UTC: {bucket[outcome]} {outcome}"))
    label = "%m-%d %H:%M" if counts.width < timedelta(days=1) else "%Y-%m-%d"
    ticks = [(left + i * slot, f"{counts.edges[i]:{label}}") for i in range(0, n, max(n // 6, 1))]
    span = f"{counts.edges[0]:%Y-%m-%d %H:%M} – {counts.edges[-1]:%Y-%m-%d %H:%M} UTC"
    return Chart(width, height, max(slot - 2, 1), bars, ticks, top, sum(per), span, _per(counts.width))


def window(query: audit.DecisionQuery, now: datetime) -> tuple[datetime, datetime]:
    """The time window the page, its chart and its exports all cover: the search's from/to;
    from alone runs to now (the second after it, so what was decided this instant is in), to
    alone reaches 24 hours back; neither is the last 24 whole hours."""
    since, until = query.since, query.until
    if since is None and until is None:
        return audit.default_range(now)
    if since is None:
        assert until is not None
        return until - timedelta(hours=24), until
    return since, until if until is not None else _pin(now, now)


def _windowed(query: audit.DecisionQuery, since: datetime, until: datetime) -> audit.DecisionQuery:
    return audit.DecisionQuery(**{**_fields(query), "since": since, "until": until})


def _pin(until: datetime, now: datetime) -> datetime:
    """A window's end as an export keeps it: no later than the whole second after now (so what
    was decided up to the moment the page was drawn is in, and what comes later is not)."""
    return min(until, now.replace(microsecond=0) + timedelta(seconds=1))


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


@router.get("/console/audit")
async def audit_page(request: Request) -> Response:
    v = await viewer(request)
    require(v, SCOPE)
    k = kernel_of(request)
    # A search the page cannot run (a bad time, an unknown or ambiguous bundle) is said above the
    # form, which keeps what was typed, instead of a page without the form.
    error, status = "", 200
    now = k.clock.now()
    span: tuple[datetime, datetime] | None = None
    try:
        query, fields = await query_of(request)
        span = window(query, now)
        result = await call(audit.list_decisions, k, _windowed(query, *span))
    except ValidationError as exc:
        error, status = exc.message.removeprefix("validation error: "), 400
        fields = {key: request.query_params.get(key, "").strip()[:1024] for key in FIELDS}
        result = audit.DecisionPage()
    known = await call(agents.list_agents, k)
    search = {key: value for key, value in fields.items() if value}
    export = urlencode(search)
    # The exports get the window pinned as the page drew it (its end no later than the second
    # after now), so the file holds what this page lists and charts, whenever it is downloaded.
    pinned = urlencode({**search, "from": _stamp(span[0]), "to": _stamp(_pin(span[1], now))}) if span else export
    return page(request, v, "audit.html", status=status, section="audit", result=result, fields=fields,
                agents=[a.id for a in known], outcomes=[o.value for o in DecisionOutcome],
                shortcuts=list(RULE_SHORTCUTS), export=export, pinned=pinned, span=span,
                default_window=not (fields["from"] or fields["to"]), outcome_styles=OUTCOMES,
                wire=WIRE_ANSWERS, timeline_page=timeline.TIMELINE_EVENTS, error=error)


@router.get("/console/audit/chart.svg")
async def chart_svg(request: Request) -> Response:
    """The chart, drawn on the server; a separate request (the page's <img>), so the search's
    page does not wait for it. Closed hours come from the hourly rollup (core.audit)."""
    v = await viewer(request)
    require(v, SCOPE)
    query, _ = await query_of(request, cursor=False)
    k = kernel_of(request)
    since, until = window(query, k.clock.now())
    counts = await call(audit.count_decisions, k, query, since, until)
    svg = templates.get_template("_chart.svg").render(chart=chart(counts))
    return finish(request, Response(svg, media_type="image/svg+xml"))


@dataclass(slots=True)
class Export:
    """One export: what it covers (said in the file's first line) and the rows, streamed page by
    page on the keyset cursor until the window is exhausted — never cut at a row count."""

    about: dict[str, Any]
    first: audit.DecisionPage
    query: audit.DecisionQuery
    rows: int = 0


async def _export(request: Request) -> Export:
    """The export's window and first page. The window is the page's (`window`), its end pinned
    (`_pin`) when it lies ahead, so rows decided while the file streams are not half in it. The
    first page is read here, before the response starts, so a search the store refuses (an
    unknown decision, a bad cursor) is a 400 with its message rather than a stream cut off
    after its headers."""
    k = kernel_of(request)
    query, fields = await query_of(request, limit=audit.MAX_PAGE, cursor=False)
    now = k.clock.now()
    since, until = window(query, now)
    until = _pin(until, now)
    query = _windowed(query, since, until)
    first = await call(audit.list_decisions, k, query)
    about = {"kind": "regent.decisions", "from": _stamp(since), "to": _stamp(until),
             "filters": {key: value for key, value in fields.items() if value and key not in ("from", "to")},
             "order": "newest first", "generated_at": _stamp(now)}
    return Export(about, first, query)


async def _records(request: Request, ex: Export) -> AsyncIterator[dict[str, Any]]:
    k = kernel_of(request)
    result = ex.first
    while True:
        for r in result.decisions:
            ex.rows += 1
            yield audit.decision_json(r)
        if not result.next_cursor:
            return
        q = audit.DecisionQuery(**{**_fields(ex.query), "cursor": result.next_cursor})
        result = await call(audit.list_decisions, k, q)


def _fields(q: audit.DecisionQuery) -> dict[str, Any]:
    return {name: getattr(q, name) for name in q.__dataclass_fields__}


def _export_headers(name: str) -> dict[str, str]:
    return {**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}


def _line(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@router.get("/console/audit/export.jsonl")
async def export_jsonl(request: Request) -> Response:
    """JSON lines: `{"regent_export": {...what it covers}}`, one decision record per line, then
    `{"regent_export_end": {"rows": N, "complete": true}}` (a file without it was cut short)."""
    v = await viewer(request)
    require(v, SCOPE)
    ex = await _export(request)

    async def lines() -> AsyncIterator[bytes]:
        yield _line({"regent_export": ex.about})
        async for row in _records(request, ex):
            yield _line(row)
        yield _line({"regent_export_end": {"rows": ex.rows, "complete": True}})

    return StreamingResponse(lines(), media_type="application/x-ndjson", headers=_export_headers("decisions.jsonl"))


def _csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    # A cell a spreadsheet would run as a formula is quoted as text (CSV injection).
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _comment(about: dict[str, Any]) -> str:
    # The filters as JSON: a value holding a line break cannot start a line of its own.
    filters = json.dumps(about["filters"], ensure_ascii=False, sort_keys=True) if about["filters"] else "none"
    return (f"# regent decisions export: decided_at from {about['from']} (inclusive) to {about['to']} (exclusive), UTC;"
            f" filters: {filters}; {about['order']}; generated at {about['generated_at']}\r\n")


@router.get("/console/audit/export.csv")
async def export_csv(request: Request) -> Response:
    """CSV: a `#` line saying what the file covers, the header, a row per decision, and a last
    `# end of export: N rows, complete` line (a file without it was cut short)."""
    v = await viewer(request)
    require(v, SCOPE)
    ex = await _export(request)

    async def lines() -> AsyncIterator[bytes]:
        buf = io.StringIO()
        buf.write(_comment(ex.about))
        w = csv.writer(buf)
        w.writerow(CSV_COLUMNS)
        async for row in _records(request, ex):
            w.writerow([_csv_cell(row.get(c)) for c in CSV_COLUMNS])
            if buf.tell() > 64 * 1024:
                yield buf.getvalue().encode()
                buf.seek(0)
                buf.truncate()
        buf.write(f"# end of export: {ex.rows} rows, complete\r\n")
        yield buf.getvalue().encode()

    return StreamingResponse(lines(), media_type="text/csv; charset=utf-8", headers=_export_headers("decisions.csv"))


@router.get("/console/audit/bundle/{agent_id}/{policy_hash}")
async def bundle_page(agent_id: str, policy_hash: str, request: Request) -> Response:
    """The exact bundle behind a recorded `policy_hash` (the API's GET
    /v0/policies/{agent}/revisions/{hash}), for an auditor as for who writes policy."""
    v = await viewer(request)
    require(v, any_of=(SCOPE, "policies:write"))
    k = kernel_of(request)
    r = await call(policies.revision_by_hash, k, agent_id, policy_hash)
    active = await call(policies.list_revisions, k, agent_id)
    return page(request, v, "bundle.html", section="audit", r=r, files=source_files(r),
                stored=[x for x in active if x.content_hash == r.content_hash])
