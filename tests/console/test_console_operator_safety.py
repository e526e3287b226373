"""Operator safety in a real Chromium, on SQLite and PostgreSQL: Enter never decides, grant and
deny are confirmed and named back, a row the kernel would refuse says why instead of offering
buttons, every pending approval past the 200th is reachable, the executions list pages both ways
and keeps a bad search in place, the auditor opens the bundle behind a decision, and an export is
the page's window complete, saying what it covers (issue 29).

The kernel is the in-process one the store fixture parametrizes (served over loopback with the
console as `regent serve` mounts it); approvals are asked through the core, backlogs written
through the store in one transaction."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kernel import console
from kernel.api.app import create_app
from kernel.clock import ManualClock
from kernel.core import steps
from kernel.core.agents import register_agent
from kernel.core.dispatch import claim_due
from kernel.core.executions import create_execution
from kernel.core.kernel import Kernel
from kernel.domain import (
    Approval,
    ApprovalConfig,
    ApprovalStatus,
    Decision,
    Execution,
    ExecutionStatus,
    Lease,
    Verdict,
)
from kernel.ids import new_uuid7
from kernel.store import tables as t
from tests.conftest import Running
from tests.console.conftest import shot
from tests.core.test_steps import FixedPolicy, req
from tests.support import ServerThread

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BOOT = "operator-safety-bootstrap-token"
KEYS = {
    "oncall": ["approvals:read", "approvals:write", "executions:read"],
    "intern": ["approvals:read", "approvals:write"],
    "reader": ["approvals:read"],
    "release": ["approvals:read", "approvals:write", "executions:write"],
    "auditor": ["decisions:read"],
}


def screen(pg: Any, name: str, full: bool = True) -> None:
    """A screenshot for a person to look at, under test-output/console/ like every console test's."""
    shot(pg, f"operator-{name}", full=full)


class Console:
    """The kernel served with its console (`regent serve`'s sign-in), its keys and a way to ask
    for approvals through the core."""

    def __init__(self, kernel: Kernel, running: Running, srv: ServerThread, tokens: dict[str, tuple[str, str]]):
        self.kernel, self.running, self.srv, self.url = kernel, running, srv, srv.url
        self.tokens = tokens  # name → (token, key id)

    def ask(self, target: str = "transfer_funds", approvers: tuple[str, ...] = ("oncall",),
            created_by: str | None = None, args: Any = None) -> tuple[str, str]:
        """A real pending approval (a step the policy sends to a human): (execution id, approval id)."""
        self.kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask-a-human",
                                                  approval=ApprovalConfig(approvers, message="check the payee")))
        e, _ = create_execution(self.kernel, "shell", None, created_by=created_by)
        [c] = [c for c in claim_due(self.kernel, 100) if c.execution_id == e.id]
        a = steps.submit_step(self.kernel, Lease("shell", e.id, c.dispatch_id, c.attempt),
                              req(target=target, args=args or {"iban": "DE02 1203 0000 0000 2020 51", "eur": 1200}))
        assert a.approval_id
        return e.id, a.approval_id

    def approval(self, approval_id: str) -> Approval:
        with self.kernel.store.read() as tx:
            a = tx.get_approval(approval_id)
        assert a is not None
        return a

    def sign_in(self, pg: Any, who: str, path: str) -> None:
        token = BOOT if who == "bootstrap" else self.tokens[who][0]
        pg.goto(f"{self.url}{path}")
        pg.wait_for_url("**/console/sign-in**")
        pg.fill("input[name=token]", token)
        pg.click("button:text-is('Sign in')")
        pg.wait_for_selector(".who")


@pytest.fixture
def ck(kernel: Kernel, running: Running) -> Iterator[Console]:
    tokens = {}
    with kernel.store.transaction() as tx:
        for name, scopes in KEYS.items():
            key_id = str(uuid.uuid4())
            token = f"rbk_{key_id}.{secrets.token_urlsafe(32)[:43]}"
            tx.insert_api_key({"id": key_id, "name": name, "scopes": json.dumps(scopes),
                               "secret_hash": hashlib.sha256(token.encode()).digest(),
                               "created_at": datetime.now(UTC)})
            tokens[name] = (token, key_id)
    app = create_app(kernel, dev=False, bearer_token=BOOT)
    console.install(app, dev=False, bearer_token=BOOT)
    with ServerThread(app) as srv:
        yield Console(kernel, running, srv, tokens)


# -- 1. no decision by accident ---------------------------------------------------------------------
def test_enter_in_the_comment_decides_nothing_and_a_grant_is_confirmed_then_named_back(ck: Console, page: Any) -> None:
    eid, aid = ck.ask()
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    ck.sign_in(page, "oncall", "/console/approvals")
    posts.clear()
    row = page.locator(f"#approval-{aid}")
    comment = row.locator("input[name=comment]")
    comment.fill("Deny: vendor not on the approved list")
    comment.press("Enter")  # before: the form's first button, Grant, was pressed
    # (before, the row was gone by now: granted, with the deny text as its comment)
    row.get_by_role("button", name=re.compile("^Grant")).click(timeout=5_000)
    confirm = page.locator("#confirm")
    confirm.wait_for()
    # Enter sent nothing: the only POST is the Grant button's, which asks to confirm.
    assert [p.removeprefix(ck.url) for p in posts] == [f"/console/approvals/{aid}/grant"]
    assert ck.approval(aid).status == ApprovalStatus.PENDING
    title = page.locator("#confirm-title").inner_text()
    assert title == f"Grant transfer_funds for execution {eid}?"
    assert "Deciding as oncall" in confirm.inner_text()
    screen(page, "approval-confirm-grant")
    # "No, go back" decides nothing either.
    page.click("#confirm-cancel")
    page.locator(".decide").wait_for()
    assert ck.approval(aid).status == ApprovalStatus.PENDING
    page.locator("input[name=comment]").fill("payee checked with finance")
    page.locator("button.grant").click()
    page.locator("#confirm-button").click()
    done = page.locator("#decided")
    done.wait_for()
    text = done.inner_text()
    assert text.startswith(f"Granted transfer_funds for execution {eid}") and "decided by oncall (key)" in text
    a = ck.approval(aid)
    assert (a.status, a.decided_by, a.credential, a.rationale) == (ApprovalStatus.GRANTED, "oncall", "key",
                                                                   "payee checked with finance")
    screen(page, "approvals-after-grant")


def test_a_deny_needs_its_reason_and_a_post_without_the_confirmation_decides_nothing(ck: Console, page: Any) -> None:
    eid, aid = ck.ask()
    ck.sign_in(page, "oncall", f"/console/approvals/{aid}")
    page.locator("button.deny").click()
    error = page.locator("#decide-error")
    error.wait_for()
    assert "deny needs its reason" in error.inner_text()
    assert ck.approval(aid).status == ApprovalStatus.PENDING
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    # On the server too: a deny without a reason, even "confirmed", and a grant without the
    # confirmation, change nothing.
    r = page.request.post(f"{ck.url}/console/approvals/{aid}/deny", form={"csrf": csrf, "confirm": "deny"})
    assert r.status == 400 and "reason" in r.text()
    r = page.request.post(f"{ck.url}/console/approvals/{aid}/grant", form={"csrf": csrf, "comment": "x"})
    assert r.status == 200 and "Yes, grant transfer_funds" in r.text()
    r = page.request.post(f"{ck.url}/console/approvals/{aid}", form={"csrf": csrf, "comment": "x"})
    assert r.status == 400 and "Enter never decides" in r.text()
    assert ck.approval(aid).status == ApprovalStatus.PENDING
    page.locator("input[name=comment]").fill("vendor not on the approved list")
    page.locator("button.deny").click()
    assert page.locator("#confirm-title").inner_text() == f"Deny transfer_funds for execution {eid}?"
    assert "vendor not on the approved list" in page.locator("#confirm").inner_text()
    screen(page, "approval-confirm-deny")
    page.locator("#confirm-button").click()
    done = page.locator("#decided")
    done.wait_for()
    assert done.inner_text().startswith(f"Denied transfer_funds for execution {eid}")
    a = ck.approval(aid)
    assert (a.status, a.decided_by, a.rationale) == (ApprovalStatus.DENIED, "oncall", "vendor not on the approved list")


def test_the_bootstrap_token_must_name_who_decides(ck: Console, page: Any) -> None:
    _, aid = ck.ask(approvers=("alice",))
    ck.sign_in(page, "bootstrap", f"/console/approvals/{aid}")
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    r = page.request.post(f"{ck.url}/console/approvals/{aid}/grant", form={"csrf": csrf, "confirm": "grant"})
    assert r.status == 400 and "Say who is deciding" in r.text()
    assert ck.approval(aid).status == ApprovalStatus.PENDING
    page.fill("input[name=decided_by]", "mallory")  # a name the rule does not list: said before confirming
    page.locator("button.grant").click()
    assert "only alice may decide this, and the form names mallory" in page.locator("#decide-error").inner_text()
    page.fill("input[name=decided_by]", "alice")
    page.locator("button.grant").click()
    page.locator("#confirm-button").click()
    page.locator("#decided").wait_for()
    a = ck.approval(aid)
    assert (a.status, a.decided_by, a.credential) == (ApprovalStatus.GRANTED, "alice", "bootstrap")
    assert "decided by alice (asserted with the bootstrap token)" in page.locator("#decided").inner_text()


def test_a_row_the_kernel_would_refuse_says_why_instead_of_offering_buttons(ck: Console, page: Any) -> None:
    _, listed = ck.ask(approvers=("oncall", "release"))
    _, own = ck.ask(approvers=("oncall", "release"), created_by=ck.tokens["release"][1])
    expected = {
        "intern": {listed: "only oncall, release may decide this; you are intern",
                   own: "only oncall, release may decide this; you are intern"},
        "reader": {listed: "lacks the scope approvals:write", own: "lacks the scope approvals:write"},
        "release": {listed: None, own: "your key created this execution and may not approve its steps"},
    }
    for who, rows in expected.items():
        page.context.clear_cookies()
        ck.sign_in(page, who, "/console/approvals")
        for aid, why in rows.items():
            row = page.locator(f"#approval-{aid}")
            if why is None:
                assert row.locator("button.grant").count() == 1 and row.locator(".refusal").count() == 0
            else:
                assert row.locator("button").count() == 0, who
                assert why in row.locator(".refusal").inner_text(), who
        if who == "release":
            screen(page, "approvals-refusal-reasons")


# -- 2. nothing out of sight ------------------------------------------------------------------------
def _backlog(k: Kernel, n: int) -> list[tuple[str, str, str]]:
    """`n` pending approvals written through the store, a second apart: (approval id, agent,
    target), oldest first. Agents: ops (2 of 3, approvers oncall) and billing (approvers finance)."""
    start = k.clock.now() - timedelta(hours=2)
    out = []
    for agent in ("ops", "billing"):
        register_agent(k, agent, "http://127.0.0.1:9/webhook", "s3cret", None, keep_policy=True)
    with k.store.transaction() as tx:
        for i in range(n):
            at = start + timedelta(seconds=i)
            agent, approvers = ("billing", ["finance"]) if i % 3 == 2 else ("ops", ["oncall"])
            target = "transfer_funds" if i % 2 else "shell_exec"
            eid = new_uuid7()
            tx.insert_execution(Execution(id=eid, agent_id=agent, input={"i": i}, status=ExecutionStatus.BLOCKED,
                                          created_at=at, updated_at=at))
            aid = str(uuid.uuid4())
            tx.insert_approval(Approval(id=aid, step_id=f"step-{i}", execution_id=eid, status=ApprovalStatus.PENDING,
                                        approvers=approvers, message=None, timeout_at=at + timedelta(hours=4),
                                        created_at=at, agent_id=agent, kind="tool_call", target=target,
                                        rule_id="ask-a-human"))
            out.append((aid, agent, target))
    return out


def _ids_on(page: Any) -> list[str]:
    return [i.removeprefix("approval-") for i in page.locator("tr.pending-approval").evaluate_all(
        "rows => rows.map(r => r.id)")]


def _walk(page: Any, link: str) -> list[list[str]]:
    pages = [_ids_on(page)]
    for _ in range(20):
        nxt = page.locator(f"nav.pager a.{link}").first
        if nxt.count() == 0:
            break
        nxt.click()
        page.wait_for_load_state()
        pages.append(_ids_on(page))
    return pages


def test_every_pending_approval_past_the_200th_is_reachable_by_paging_filtering_and_counts(ck: Console, page: Any) -> None:
    rows = _backlog(ck.kernel, 263)
    ids = [r[0] for r in rows]
    ck.sign_in(page, "oncall", "/console/approvals")
    screen(page, "approvals-inbox", full=False)
    forward = _walk(page, "later")
    assert [i for p in forward for i in p] == ids  # every one, oldest first, once (before: the oldest 200)
    assert [len(p) for p in forward] == [50, 50, 50, 50, 50, 13]
    assert page.locator("#pending-total").inner_text() == "263 pending"
    counts = dict(zip(page.locator("a.agent-count").evaluate_all("as => as.map(a => a.dataset.agent)"),
                      [int(b) for b in page.locator("a.agent-count b").all_inner_texts()], strict=True))
    assert counts == {"ops": 176, "billing": 87}
    back = _walk(page, "earlier")
    assert [i for p in reversed(back) for i in p] == ids
    # newest first, filtered by agent and target
    page.goto(f"{ck.url}/console/approvals?order=newest&agent_id=billing&target=transfer_funds")
    want = [r[0] for r in reversed(rows) if r[1] == "billing" and r[2] == "transfer_funds"]
    assert _ids_on(page) == want[:50] and f"of {len(want)} pending" in page.locator("#inbox-range").inner_text()
    # "I can decide": oncall is an approver of ops' approvals only
    page.goto(f"{ck.url}/console/approvals?mine=1")
    mine = [i for p in _walk(page, "later") for i in p]
    assert mine == [r[0] for r in rows if r[1] == "ops"]
    # the newest approval has a page of its own with the decide form
    page.goto(f"{ck.url}/console/approvals/{ids[-1]}")
    assert page.locator("form.decide button.grant").count() == 1


def test_the_inbox_refreshes_itself_counts_down_and_a_timelines_decide_link_reaches_the_row(
    ck: Console, page: Any
) -> None:
    eid, first = ck.ask()
    ck.sign_in(page, "oncall", "/console/approvals")
    left = page.locator(f"#approval-{first} .countdown")
    before = left.inner_text()
    page.wait_for_function("([sel, was]) => document.querySelector(sel).textContent !== was",
                           arg=[f"#approval-{first} .countdown", before])
    _, second = ck.ask(target="wire_money")  # asked while the page is open
    page.locator(f"#approval-{second}").wait_for(timeout=20_000)
    assert page.locator("#pending-total").inner_text() == "2 pending"
    # while the approver types, a change is only announced: what was typed stays
    page.locator(f"#approval-{first} input[name=comment]").fill("checking the payee")
    _, third = ck.ask(target="close_account")
    page.locator("#inbox-changed").wait_for(timeout=20_000)
    assert page.locator(f"#approval-{third}").count() == 0
    assert page.locator(f"#approval-{first} input[name=comment]").input_value() == "checking the payee"
    title = page.locator(f"#approval-{first} time").get_attribute("title")
    assert title and "your time zone" in title
    page.goto(f"{ck.url}/console/executions/{eid}")
    page.click("a.decide-link")
    page.wait_for_url(f"**/console/approvals/{first}")
    assert page.locator("form.decide button.grant").count() == 1


def _executions(k: Kernel, n: int) -> list[str]:
    start = k.clock.now() - timedelta(days=1)
    ids = []
    with k.store.transaction() as tx:
        for i in range(n):
            at = start + timedelta(minutes=i)
            eid = new_uuid7()
            tx.insert_execution(Execution(id=eid, agent_id="shell", input={"i": i}, status=ExecutionStatus.COMPLETED,
                                          created_at=at, updated_at=at))
            ids.append(eid)
    return sorted(ids, reverse=True)


def test_the_executions_list_pages_both_ways_finds_an_id_prefix_and_keeps_a_bad_date_in_place(
    ck: Console, page: Any
) -> None:
    ids = [*_executions(ck.kernel, 120), ck.running.start()[0]]
    ids.sort(reverse=True)
    ck.sign_in(page, "bootstrap", "/console/executions")

    def shown() -> list[str]:
        return list(page.locator("tr.execution-row a.exec-id").all_inner_texts())

    def follow(selector: str) -> None:
        # A click returns once the next page has committed, not loaded: its rows read [] in
        # between (seen once in CI, on PostgreSQL). Wait for the load before reading them.
        page.click(selector)
        page.wait_for_load_state()

    assert shown() == ids[:50]  # full ids, newest first
    follow("nav.pager a.older >> nth=0")
    follow("nav.pager a.older >> nth=0")
    assert shown() == ids[100:]
    follow("nav.pager a.newer >> nth=0")
    assert shown() == ids[50:100]
    follow("nav.pager a.newer >> nth=0")
    assert shown() == ids[:50] and page.locator("nav.pager a.newer").count() == 0
    created = page.locator("tr.execution-row time").first
    assert created.inner_text().endswith("Z") and "your time zone" in (created.get_attribute("title") or "")
    screen(page, "executions-list")
    target = ids[77]
    page.fill("input[name=q]", target[:30].upper())  # any case
    follow("button:text-is('Search')")
    assert shown() == [x for x in ids if x.startswith(target[:30])]
    # A date the form cannot use (typed into a URL, or by a browser without a date picker) is
    # said above the form, which keeps the search as given.
    r = page.goto(f"{ck.url}/console/executions?q={target[:8]}&status=completed&from=yesterday")
    assert r is not None and r.status == 400
    assert "from" in page.locator("#search-error").inner_text()
    assert page.locator("input[name=q]").input_value() == target[:8]
    assert page.locator("select[name=status]").input_value() == "completed"
    assert page.locator("input[name=from]").get_attribute("value") == "yesterday"
    # The counts above the error are the store's (a page built for the error once read "0+").
    pills = page.locator("ul.counts").inner_text()
    assert "+" not in pills and "completed" in pills, pills
    screen(page, "executions-bad-date")


# -- 3. the audit trail -----------------------------------------------------------------------------
def _decisions(k: Kernel, n: int, at: datetime, agent: str = "shell", policy_hash: str = "0" * 64) -> None:
    rows = [{"id": str(uuid.uuid4()), "agent_id": agent, "execution_id": str(uuid.uuid4()), "step_id": None,
             "kind": "tool_call", "target": f"tool_{i % 4}", "decision": "allowed", "rule_id": "allow-read-only",
             "reason": None, "policy_kind": "yaml", "policy_revision": "r1", "policy_hash": policy_hash,
             "decided_by": None, "credential": None, "event_seq": None,
             "decided_at": at - timedelta(seconds=i * 30)} for i in range(n)]
    with k.store.transaction() as tx:
        tx.w.execute(t.decisions.insert(), rows)


def test_the_auditor_opens_the_exact_bundle_behind_a_decision(ck: Console, page: Any) -> None:
    source = "default_action: deny\nrules:\n  - id: allow-read-only\n    action: allow\n    match: {target: ls}\n"
    with ck.kernel.store.transaction() as tx:
        tx.add_policy_revision("shell", "yaml", "audited-rev", source, ck.kernel.clock.now())
    digest = hashlib.sha256(source.encode()).hexdigest()
    _decisions(ck.kernel, 1, ck.kernel.clock.now() - timedelta(minutes=5), policy_hash=digest)
    ck.sign_in(page, "auditor", "/console/audit")
    page.click("a.bundle-link")
    page.wait_for_url(f"**/console/audit/bundle/shell/{digest}")
    assert page.locator("#bundle-hash").inner_text() == digest
    assert page.locator(".bundle-file li").all_inner_texts() == source.splitlines()
    screen(page, "audit-bundle")
    r = page.goto(f"{ck.url}/console/policies")
    assert r is not None and r.status == 403  # the bundle, not the policy admin


def _export(page: Any, url: str) -> tuple[int, str]:
    status, body = page.evaluate("async (href) => { const r = await fetch(href); return [r.status, await r.text()]; }", url)
    return int(status), str(body)


def test_an_export_is_the_pages_window_complete_and_says_what_it_covers(ck: Console, page: Any) -> None:
    clock = ck.kernel.clock
    assert isinstance(clock, ManualClock)
    now = clock.now()
    _decisions(ck.kernel, 1203, now - timedelta(seconds=1))  # the last 10 hours: > 2 export pages of 500
    _decisions(ck.kernel, 40, now - timedelta(days=3))  # outside the page's last 24 hours
    _decisions(ck.kernel, 7, now - timedelta(minutes=1), agent="billing")
    ck.sign_in(page, "auditor", "/console/audit")
    status, body = _export(page, page.locator("#export-jsonl").get_attribute("href"))
    lines = [json.loads(line) for line in body.splitlines()]
    assert status == 200
    head, records, end = lines[0], lines[1:-1], lines[-1]
    # before: 1 250 rows, every one of all time, and no line saying what the file covers
    assert len(records) == 1210 and end == {"regent_export_end": {"rows": 1210, "complete": True}}
    about = head["regent_export"]
    until = datetime.fromisoformat(about["to"])
    assert until == now.replace(microsecond=0) + timedelta(seconds=1) and about["filters"] == {}
    since = datetime.fromisoformat(about["from"])
    assert since == now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)  # the chart's 24 whole hours
    assert all(since <= datetime.fromisoformat(r["decided_at"]) < until for r in records)
    assert len({r["id"] for r in records}) == 1210
    assert "the last 24 hours" in page.locator("#window").inner_text()  # the page says the window it lists
    # filtered as the page is: billing's 7, in CSV with its first and last lines
    page.goto(f"{ck.url}/console/audit?agent_id=billing")
    status, body = _export(page, page.locator("#export-csv").get_attribute("href"))
    text = body.splitlines()
    assert status == 200 and text[0].startswith("# regent decisions export: decided_at from ")
    assert '"agent_id": "billing"' in text[0] and text[-1] == "# end of export: 7 rows, complete"
    table = list(csv.DictReader(io.StringIO("\n".join(text[1:-1]))))
    assert len(table) == 7 and {r["agent_id"] for r in table} == {"billing"}
    screen(page, "audit-window")
