"""The approvals inbox: every pending approval across agents (paged both ways, filtered, counted
per agent, refreshing itself) with what the approver decides on; one approval's own page; grant
and deny as explicit acts (a confirmation that names the action, a deny's reason required, Enter
never decides); and the latest resolved ones with who and when."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response

from kernel.api.threads import call
from kernel.console.web import ConsoleRoute, form, kernel_of, page, redirect, require, viewer
from kernel.core import approvals
from kernel.core.inbox import FILTERS, InboxItem, InboxQuery, approval_item, inbox, stamp
from kernel.errors import Conflict, Forbidden, NotFound, ValidationError
from kernel.identity import parse_uuid

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)  # pages, not the HTTP API
MAX_COMMENT = 2000
VERBS = {"grant": ("Grant", "Granted", "granted"), "deny": ("Deny", "Denied", "denied")}


def _aid(approval_id: str) -> str:
    try:
        return parse_uuid(approval_id)
    except ValidationError:
        raise NotFound("approval not found") from None


def _back(value: Any) -> str:
    """Where to return after a decision: an inbox URL the form carried, else the inbox."""
    text = str(value or "")
    ok = text.startswith("/console/approvals") and "//" not in text and "\\" not in text and len(text) < 4096
    return text if ok else "/console/approvals"


def _query(request: Request) -> tuple[InboxQuery, dict[str, str]]:
    q = request.query_params
    fields = {key: q.get(key, "").strip()[:1024] for key in (*FILTERS, "mine", "order")}
    fields["mine"] = "1" if fields["mine"] else ""
    fields["order"] = "newest" if fields["order"] == "newest" else ""
    query = InboxQuery(agent_id=fields["agent_id"] or None, target=fields["target"] or None,
                       rule_id=fields["rule_id"] or None, mine=bool(fields["mine"]),
                       newest_first=bool(fields["order"]), after=q.get("after") or None,
                       before=q.get("before") or None)
    return query, fields


def _done(item: InboxItem | None) -> str:
    """The decision just taken, named back to the approver from the stored record."""
    if item is None or item.approval.status.value not in ("granted", "denied"):
        return ""
    a = item.approval
    target = a.target or (item.step.target if item.step else "the step")
    who = a.decided_by or "no one named"
    how = {"key": "key", "bootstrap": "asserted with the bootstrap token", "dev": "asserted under regent dev"}
    verb = "Granted" if a.status.value == "granted" else "Denied"
    said = f" with the comment “{a.rationale}”" if a.rationale else ""
    return (f"{verb} {target} for execution {a.execution_id} ({item.agent_id}), recorded as decided by {who} "
            f"({how.get(a.credential or '', a.credential or '')}){said}.")


async def _page(request: Request, v: Any, status: int = 200, error: str = "") -> Response:
    require(v, "approvals:read")
    k = kernel_of(request)
    query, fields = _query(request)
    try:
        box = await call(inbox, k, query, v.principal)
    except ValidationError as exc:  # a filter no row can hold, a cursor not ours: said above the form
        error, status = exc.message.removeprefix("validation error: "), 400
        box = await call(inbox, k, InboxQuery(newest_first=query.newest_first), v.principal)
    notice = ""
    if decided := request.query_params.get("decided"):
        try:
            notice = _done(await call(approval_item, k, parse_uuid(decided), v.principal))
        except ValidationError:
            notice = ""
    here = urlencode({key: value for key, value in fields.items() if value})
    keep = {key: fields[key] for key in ("order", "mine") if fields[key]}
    counts = [(agent, n, urlencode({"agent_id": agent, **keep})) for agent, n in sorted(box.per_agent.items())]
    return page(request, v, "approvals.html", status=status, section="approvals", box=box, now=k.clock.now(),
                error=error, notice=notice, fields=fields, here=here, counts=counts, back=request.url.path + (f"?{here}" if here else ""),
                stamp=await call(stamp, k))


@router.get("/console/approvals")
async def inbox_page(request: Request) -> Response:
    v = await viewer(request)
    return await _page(request, v)


@router.get("/console/approvals/live")
async def inbox_live(request: Request) -> Response:
    """What the inbox polls: 204 while no approval was asked or answered, else 200 (the page
    then reloads its table, or says it changed while the visitor is typing)."""
    v = await viewer(request)
    require(v, "approvals:read")
    now = await call(stamp, kernel_of(request))
    code = 204 if request.query_params.get("seen") == now else 200
    return Response(status_code=code, headers={"Cache-Control": "no-store", "X-Regent-Stamp": now})


async def _one(request: Request, v: Any, approval_id: str, *, status: int = 200, error: str = "",
               confirm: str = "", fields: dict[str, Any] | None = None) -> Response:
    require(v, "approvals:read")
    k = kernel_of(request)
    item = await call(approval_item, k, _aid(approval_id), v.principal)
    if item is None:
        raise NotFound("approval not found")
    f = fields or {}
    return page(request, v, "approval.html", status=status, section="approvals", it=item, now=k.clock.now(),
                error=error, confirm=confirm, verbs=VERBS, comment=str(f.get("comment") or ""),
                decided_by=str(f.get("decided_by") or ""), back=_back(f.get("back") or request.query_params.get("back")))


@router.get("/console/approvals/{approval_id}")
async def approval_page(approval_id: str, request: Request) -> Response:
    """One approval, whatever its status: what it asks, the decision form (or why not), its outcome."""
    v = await viewer(request)
    return await _one(request, v, approval_id)


@router.post("/console/approvals/{approval_id}")
async def no_choice(approval_id: str, request: Request) -> Response:
    """A decide form sent without a Grant or Deny button (a browser's implicit submission):
    nothing is decided; the approval's page comes back with what was typed."""
    v = await viewer(request)
    fields = await form(request, v)
    return await _one(request, v, approval_id, status=400, fields=fields,
                      error="Nothing was decided: choose Grant or Deny (Enter never decides).")


@router.post("/console/approvals/{approval_id}/{verb}")
async def decide(approval_id: str, verb: str, request: Request) -> Response:
    """Grant or deny in two steps: the first post answers a page that names the action and asks
    to confirm it; only a post carrying `confirm` equal to the verb decides."""
    v = await viewer(request)
    fields = await form(request, v)
    require(v, "approvals:write")
    if verb not in VERBS:
        raise NotFound("no such action")
    aid = _aid(approval_id)
    comment = str(fields.get("comment") or "").strip()
    fields["comment"] = comment
    if len(comment) > MAX_COMMENT:
        return await _one(request, v, aid, status=400, fields=fields,
                          error=f"The comment is over {MAX_COMMENT} characters.")
    if verb == "deny" and not comment:
        return await _one(request, v, aid, status=400, fields=fields,
                          error="A deny needs its reason: say why in the comment, then Deny again.")
    # A named key decides as its name; the bootstrap token and dev access have no identity, so
    # the form asks who is deciding (recorded as given, as the API does) and a decision always
    # names someone.
    asserted = str(fields.get("decided_by") or "").strip()
    if v.principal.name is None and not asserted:
        return await _one(request, v, aid, status=400, fields=fields,
                          error="Say who is deciding: the bootstrap token has no name of its own.")
    if fields.get("confirm") != verb:
        # A decision the kernel would refuse is said now, not after a confirmation.
        item = await call(approval_item, kernel_of(request), aid, v.principal)
        if item is None:
            raise NotFound("approval not found")
        a = item.approval
        why = item.refusal
        if why is None and v.principal.name is None and a.approvers and asserted not in a.approvers:
            why = f"only {', '.join(a.approvers)} may decide this, and the form names {asserted}"
        if why:
            code = 409 if a.status.value != "pending" else 403
            return await _one(request, v, aid, status=code, fields=fields, error=f"Not decided: {why}.")
        return await _one(request, v, aid, fields=fields, confirm=verb)
    try:
        await call(approvals.decide_approval, kernel_of(request), aid, grant=verb == "grant", principal=v.principal,
                   decided_by=asserted, rationale=comment or None)
    except (Forbidden, Conflict) as exc:
        return await _one(request, v, aid, status=403 if isinstance(exc, Forbidden) else 409, fields=fields,
                          error=exc.message)
    back = _back(fields.get("back"))
    return redirect(request, back + ("&" if "?" in back else "?") + urlencode({"decided": aid}))
