"""Policies: per agent, the active bundle's source with line numbers, its revision history (who
stored and who last activated each revision, and when) with a diff between two revisions,
re-activation, upload through the load gate, and the shadow bundle's report with its promotion
behind a confirmation page (docs/policy-rollout.md)."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response

from kernel.console.web import ConsoleRoute, form, kernel_of, page, redirect, require, viewer
from kernel.core import agents, policies, shadow
from kernel.core.policies import Actor, PolicyRevision
from kernel.errors import NotFound, ValidationError, invalid
from kernel.ids import whole_number
from kernel.lane import call
from kernel.text import check_text

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
_LINE = re.compile(r"\bline (\d+)(?::(\d+))?: ")


@dataclass(frozen=True, slots=True)
class SourceFile:
    name: str
    lines: list[str]


def source_files(r: PolicyRevision) -> list[SourceFile]:
    """The files of a revision as a reader sees them: the YAML text, or each Rego module, then
    data.json and the manifest."""
    if r.kind != "rego":
        return [SourceFile("bundle.yaml", r.content.splitlines())]
    b = json.loads(r.content)
    out = [SourceFile(path, str(src).splitlines()) for path, src in sorted((b.get("modules") or {}).items())]
    out.append(SourceFile("data.json", json.dumps(b.get("data") or {}, indent=2, sort_keys=True).splitlines()))
    out.append(SourceFile(".manifest", json.dumps(b.get("manifest") or {}, indent=2, sort_keys=True).splitlines()))
    return out


def diff(old: PolicyRevision, new: PolicyRevision) -> list[str]:
    a = [f"{f.name}: {line}" if old.kind == "rego" else line for f in source_files(old) for line in f.lines]
    b = [f"{f.name}: {line}" if new.kind == "rego" else line for f in source_files(new) for line in f.lines]
    return list(difflib.unified_diff(a, b, f"revision {old.seq}", f"revision {new.seq}", lineterm="", n=3))


def gate_errors(message: str, filename: str) -> list[str]:
    """The load gate's message as one `file:line: problem` per line (YAML messages say
    `line N:` without the file, which is the uploaded one)."""
    text = message.removeprefix("validation error: ").removeprefix("invalid policy bundle: ")
    out = []
    for line in text.splitlines() or [text]:
        m = _LINE.search(line)
        if m and not re.search(r"\S+:\d+", line[: m.start()]):
            where = f"{filename}:{m.group(1)}" + (f":{m.group(2)}" if m.group(2) else "")
            line = f"{where}: {line[: m.start()]}{line[m.end():]}"
        out.append(line.strip())
    return out


def _overview(k: Any, agent_id: str | None) -> dict[str, Any]:
    known = [a.id for a in agents.list_agents(k)]
    chosen = agent_id or (known[0] if known else None)
    if chosen is not None and chosen not in known:
        raise NotFound(f"agent {chosen!r} not found")
    revisions = policies.list_revisions(k, chosen) if chosen else []
    active = next((r for r in revisions if r.active), None)
    report = None
    if chosen is not None:
        try:
            report = shadow.shadow_report(k, chosen, samples=10, top=5)
        except NotFound:
            report = None  # no shadow was ever set for this agent
    pulled = k.pulled_bundles.get(chosen) if chosen is not None else None
    return {"agents": known, "agent_id": chosen, "revisions": list(reversed(revisions)), "active": active,
            "shadow": report, "pulled_from": policies.bundle_source(pulled) if pulled else None}


async def _page(request: Request, agent_id: str | None, status: int = 200, **extra: Any) -> Response:
    v = await viewer(request)
    require(v, "policies:write")
    ctx = await call(_overview, kernel_of(request), agent_id)
    q = request.query_params
    changes: list[str] | None = None
    by_seq = {r.seq: r for r in ctx["revisions"]}
    if (first := whole_number(q.get("from"))) is not None and (last := whole_number(q.get("to"))) is not None:
        old, new = by_seq.get(first), by_seq.get(last)
        if old is None or new is None:
            raise NotFound("no such revision to compare")
        changes = diff(old, new)
    files = source_files(ctx["active"]) if ctx["active"] else []
    notice = ""
    if (stored := whole_number(q.get("stored"))) is not None:
        notice = f"Stored revision #{stored}; it is active now."
    elif (activated := whole_number(q.get("activated"))) is not None:
        notice = f"Revision #{activated} is active again."
    elif (promoted := whole_number(q.get("promoted"))) is not None:
        notice = f"The shadow bundle was promoted: it is revision #{promoted}, active now."
    extra.setdefault("errors", [])
    extra.setdefault("uploaded", "")
    extra.setdefault("draft", "")
    return page(request, v, "policies.html", status=status, section="policies", files=files, changes=changes,
                compare=(q.get("from", ""), q.get("to", "")), notice=notice, **ctx, **extra)


def _actor(v: Any) -> Actor:
    """The policy audit trail's actor for a console visitor."""
    return Actor(v.principal.name, v.principal.credential.value)


@router.get("/console/policies")
async def policies_page(request: Request) -> Response:
    return await _page(request, request.query_params.get("agent_id") or None)


def parse_bundle(kind: str, text: str, raw: bytes | None, filename: str) -> tuple[str, str]:
    """(kind, stored content) of a bundle given in a form: a chosen file (a Rego `.tar.gz`, or a
    YAML file) or pasted YAML. Structure only; compiling is the load gate's."""
    if raw is not None and (filename.endswith((".tar.gz", ".tgz", ".tar")) or raw[:2] == b"\x1f\x8b"):
        from kernel.policy.rego import parse_rego_tarball

        return "rego", policies.rego_content(parse_rego_tarball(raw, origin=filename))
    if raw is not None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(f"{filename} is neither UTF-8 YAML nor a .tar.gz bundle") from None
    if kind != "yaml":
        raise invalid("a Rego bundle is uploaded as a .tar.gz file")
    if not text.strip():
        raise invalid("the bundle is empty (paste YAML or choose a file)")
    return "yaml", text


def _upload(k: Any, agent_id: str, kind: str, text: str, raw: bytes | None, filename: str,
            actor: Actor | None = None) -> PolicyRevision | None:
    kind, content = parse_bundle(kind, text, raw, filename)
    return policies.store_policy(k, agent_id, kind, content, actor)


@router.post("/console/policies/{agent_id}")
async def upload(agent_id: str, request: Request) -> Response:
    v = await viewer(request)
    fields = await form(request, v)
    require(v, "policies:write")
    check_text(agent_id, "agent id")  # a NUL reached PostgreSQL's TEXT column: a driver error, a 500
    text = str(fields.get("source") or "")
    upload_file = fields.get("file")
    raw, filename = None, "bundle.yaml"
    if isinstance(upload_file, UploadFile) and upload_file.filename:
        raw, filename = await upload_file.read(), upload_file.filename
    try:
        r = await call(_upload, kernel_of(request), agent_id, str(fields.get("kind") or "yaml"), text, raw, filename,
                       _actor(v))
    except ValidationError as exc:
        return await _page(request, agent_id, status=400, errors=gate_errors(exc.message, filename),
                           draft=text if raw is None else "")
    seq = r.seq if r is not None else ""
    return redirect(request, f"/console/policies?agent_id={agent_id}&stored={seq}")


@router.get("/console/policies/{agent_id}/revisions/{seq}/activate")
async def confirm_activate(agent_id: str, seq: int, request: Request) -> Response:
    """The confirmation step of a re-activation: which revision will decide, and what changes."""
    return await _activate_page(request, agent_id, seq)


async def _activate_page(request: Request, agent_id: str, seq: int, status: int = 200, error: str = "") -> Response:
    v = await viewer(request)
    require(v, "policies:write")
    check_text(agent_id, "agent id")
    if not 1 <= seq <= policies.MAX_REVISION_SEQ:  # a number no store column holds: a 400, as the core says
        raise invalid(f"a revision is numbered 1-{policies.MAX_REVISION_SEQ}")
    policies.refuse_if_pulled(kernel_of(request), agent_id, _actor(v), "re-activating a revision")
    ctx = await call(_overview, kernel_of(request), agent_id)
    chosen = next((r for r in ctx["revisions"] if r.seq == seq), None)
    if chosen is None:
        raise NotFound(f"agent {agent_id!r} has no revision #{seq}")
    active = ctx["active"]
    changes = diff(active, chosen) if active is not None and active.seq != chosen.seq else []
    return page(request, v, "activate.html", status=status, section="policies", error=error, chosen=chosen,
                changes=changes, **ctx)


@router.post("/console/policies/{agent_id}/revisions/{seq}/activate")
async def activate(agent_id: str, seq: int, request: Request) -> Response:
    v = await viewer(request)
    fields = await form(request, v)
    require(v, "policies:write")
    if fields.get("confirm") != "yes":  # posted without the confirmation page's own button
        return await _activate_page(request, agent_id, seq, status=400,
                                    error="Nothing was activated: confirm on this page to re-activate the revision.")
    await call(policies.activate_revision, kernel_of(request), agent_id, seq, _actor(v))
    return redirect(request, f"/console/policies?agent_id={agent_id}&activated={seq}")


@router.get("/console/policies/{agent_id}/promote")
async def confirm_promote(agent_id: str, request: Request) -> Response:
    """The confirmation step of a promotion: what will decide from the next step on."""
    return await _promote_page(request, agent_id)


async def _promote_page(request: Request, agent_id: str, status: int = 200, error: str = "") -> Response:
    v = await viewer(request)
    require(v, "policies:write")
    policies.refuse_if_pulled(kernel_of(request), agent_id, _actor(v), "promoting its shadow")
    ctx = await call(_overview, kernel_of(request), agent_id)
    if ctx["shadow"] is None or ctx["shadow"]["shadow"].status != "shadowing":
        raise NotFound(f"agent {agent_id!r} has no shadow bundle to promote")
    return page(request, v, "promote.html", status=status, section="policies", error=error, **ctx)


@router.post("/console/policies/{agent_id}/promote")
async def promote(agent_id: str, request: Request) -> Response:
    v = await viewer(request)
    fields = await form(request, v)
    require(v, "policies:write")
    if fields.get("confirm") != "yes":  # posted without the confirmation page's own button
        return await _promote_page(request, agent_id, status=400,
                                   error="Nothing was promoted: confirm on this page to promote the shadow bundle.")
    r = await call(shadow.promote_shadow, kernel_of(request), agent_id, _actor(v))
    return redirect(request, f"/console/policies?agent_id={agent_id}&promoted={r.seq}")
