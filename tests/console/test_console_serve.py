"""The console under `regent serve` in a real Chromium: sign-in with an API key or the bootstrap
token, pages limited to the key's scopes, nothing secret rendered, sign-out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.conftest import BOOTSTRAP_TOKEN, ConsoleKernel, console_kernel, shot
from tests.e2e.conftest import SECRET, Api

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LS = {"tool": "shell_exec", "args": {"command": "ls"}}
RM = {"tool": "shell_exec", "args": {"command": "rm -rf /tmp/x"}}
KEYS = {
    "oncall": ["approvals:read", "approvals:write"],
    "intern": ["approvals:read", "approvals:write"],
    "auditor": ["executions:read"],
    "release": ["executions:read", "executions:write", "approvals:read", "approvals:write"],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsoleKernel, dict[str, str]]]:
    with console_kernel(tmp_path_factory.mktemp("console-serve"), "serve", keys=KEYS) as kt:
        yield kt


def sign_in(page: Any, url: str, token: str, path: str = "/console") -> None:
    page.goto(f"{url}{path}")
    page.wait_for_url("**/console/sign-in**")
    page.fill("input[name=token]", token)
    page.click("button:text-is('Sign in')")
    page.wait_for_selector(".who")


def nav_labels(page: Any) -> list[str]:
    return list(page.locator(".bar nav a").all_inner_texts())


def test_a_visitor_without_a_session_is_sent_to_sign_in_and_a_bad_key_is_refused(served: Any, page: Any) -> None:
    k, _ = served
    page.goto(f"{k.url}/console/executions")
    assert "/console/sign-in" in page.url
    shot(page, "sign-in")
    page.fill("input[name=token]", "rbk_00000000-0000-0000-0000-000000000000." + "x" * 43)
    page.click("button:text-is('Sign in')")
    assert "not valid" in page.locator(".notice.error").inner_text()
    assert page.context.cookies() == []


def test_an_approver_only_key_sees_timelines_but_not_policies(served: Any, page: Any) -> None:
    k, tokens = served
    eid = k.run("ops", [LS], "completed")
    sign_in(page, k.url, tokens["oncall"], f"/console/executions/{eid}")
    assert page.url.endswith(f"/console/executions/{eid}")  # back where the visitor was going
    assert page.locator(".who").inner_text().startswith("oncall")
    assert page.locator(".rule-id").first.inner_text() == "allow-read-only"
    assert "Policies" not in nav_labels(page) and "Playground" not in nav_labels(page)
    assert page.locator("text=Cancel execution").count() == 0  # no executions:write
    # no link to the executions list it may not open; the refusal says it once
    assert page.locator(".crumbs a").count() == 0
    r = page.goto(f"{k.url}/console/policies")
    refusal = page.locator(".notice.error").inner_text()
    assert r.status == 403 and "policies:write" in refusal and "forbidden: forbidden" not in refusal
    status = page.evaluate("""async () => (await fetch("/console/executions")).status""")
    assert status == 403


def test_the_bootstrap_token_signs_in_as_admin_and_sign_out_ends_the_session(served: Any, page: Any) -> None:
    k, _ = served
    sign_in(page, k.url, BOOTSTRAP_TOKEN)
    assert page.locator(".who").inner_text().startswith("bootstrap token")
    assert {"Executions", "Policies", "Playground"} <= set(nav_labels(page))
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert BOOTSTRAP_TOKEN not in cookie["value"]
    page.click("text=Sign out")
    page.wait_for_url("**/console/sign-in")
    page.goto(f"{k.url}/console/executions")
    assert "/console/sign-in" in page.url


def test_no_page_renders_a_secret(served: Any, page: Any) -> None:
    k, tokens = served
    eid = k.run("ops", [LS], "completed")
    sign_in(page, k.url, BOOTSTRAP_TOKEN)
    for path in ("/console/executions", f"/console/executions/{eid}", "/console/policies?agent_id=ops",
                 "/console/playground"):
        page.goto(f"{k.url}{path}")
        html = page.content()
        assert SECRET not in html, path
        assert BOOTSTRAP_TOKEN not in html, path
        assert not any(t in html for t in tokens.values()), path


def test_an_approval_asked_by_policy_is_granted_in_the_inbox_and_the_execution_completes(served: Any, page: Any) -> None:
    k, tokens = served
    eid = k.run("ops", [RM], "blocked")
    approval = k.pending(eid)
    sign_in(page, k.url, tokens["oncall"], "/console/approvals")
    row = page.locator(f"#approval-{approval['id']}")
    assert row.locator(".target").inner_text() == "shell_exec"
    assert row.locator(".args").inner_text() == '{"command":"rm -rf /tmp/x"}'
    assert "oncall" in row.inner_text()  # the rule's approvers
    assert row.locator("input[name=decided_by]").count() == 0  # a key decides as its own name
    shot(page, "approvals")
    row.locator("input[name=comment]").fill("checked with the owner")
    row.locator("button:text-is('Grant…')").click()
    page.locator("#confirm-button").click()
    page.locator(".notice.ok", has_text="Granted").wait_for()
    assert k.api.wait_status(eid, "completed", "failed", timeout=30)["status"] == "completed"
    decided = k.api.http.get(f"/v0/approvals/{approval['id']}").json()
    assert (decided["status"], decided["decided_by"], decided["rationale"]) == ("granted", "oncall", "checked with the owner")
    page.reload()
    resolved = page.locator(f"#resolved-{approval['id']}")
    assert resolved.locator(".decided-by").inner_text() == "oncall"
    assert resolved.locator(".credential").inner_text() == "key"  # bound to the key, not only named
    assert "checked with the owner" in resolved.inner_text()


def test_an_approver_the_rule_does_not_list_is_refused_with_a_visible_message(served: Any, page: Any) -> None:
    k, tokens = served
    eid = k.run("ops", [RM], "blocked")
    approval = k.pending(eid)
    sign_in(page, k.url, tokens["intern"], "/console/approvals")
    row = page.locator(f"#approval-{approval['id']}")
    assert row.locator("button").count() == 0  # the page says why instead of offering the buttons
    assert row.locator(".refusal").inner_text().endswith("only oncall, release may decide this; you are intern")
    shot(page, "approvals-refused")
    # and the kernel refuses a forged, confirmed form whatever the page showed
    csrf = page.locator("form[action='/console/sign-out'] input[name=csrf]").get_attribute("value")
    r = page.request.post(f"{k.url}/console/approvals/{approval['id']}/grant", form={"csrf": csrf, "confirm": "grant"})
    assert r.status == 403 and "intern" in r.text() and "is not an approver for this approval" in r.text()
    assert k.api.get(eid)["status"] == "blocked"
    assert k.api.http.get(f"/v0/approvals/{approval['id']}").json()["status"] == "pending"


def test_a_key_may_not_approve_a_step_of_an_execution_it_created(served: Any, page: Any) -> None:
    k, tokens = served
    release = Api(k.url, tokens["release"])
    try:
        eid = release.create("ops", {"calls": [RM]})
        release.wait_status(eid, "blocked", timeout=30)
    finally:
        release.close()
    approval = k.pending(eid)
    assert "release" in approval["approvers"]  # listed, so only the self-approval rule refuses it
    sign_in(page, k.url, tokens["release"], "/console/approvals")
    row = page.locator(f"#approval-{approval['id']}")
    assert row.locator("button").count() == 0
    assert "your key created this execution and may not approve its steps" in row.locator(".refusal").inner_text()
    csrf = page.locator("form[action='/console/sign-out'] input[name=csrf]").get_attribute("value")
    r = page.request.post(f"{k.url}/console/approvals/{approval['id']}/grant", form={"csrf": csrf, "confirm": "grant"})
    assert r.status == 403 and "may not approve" in r.text()
    assert k.api.get(eid)["status"] == "blocked"
    assert k.api.http.get(f"/v0/approvals/{approval['id']}").json()["status"] == "pending"


# Whether an input's placeholder text fits in its content box (measured in the input's own font).
PLACEHOLDER_FITS = """el => {
  const s = getComputedStyle(el);
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = s.font;
  const room = el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
  return ctx.measureText(el.placeholder).width <= room;
}"""

def test_a_bootstrap_decision_is_shown_as_asserted_wherever_the_decider_appears(served: Any, page: Any) -> None:
    k, _ = served
    eid = k.run("ops", [RM], "blocked")
    approval = k.pending(eid)
    sign_in(page, k.url, BOOTSTRAP_TOKEN, "/console/approvals")
    row = page.locator(f"#approval-{approval['id']}")
    who = row.locator("input[name=decided_by]")
    # The field says what it asks for: its placeholder fits inside it, not cut off at the edge.
    assert who.evaluate(PLACEHOLDER_FITS), who.get_attribute("placeholder")
    shot(page, "approvals-bootstrap")
    who.fill("oncall")  # no identity: the form asks who decides
    row.locator("input[name=comment]").fill("not today")  # a deny's reason
    row.locator("button:text-is('Deny…')").click()
    page.locator("#confirm-button").click()
    page.locator(".notice.ok", has_text="Denied").wait_for()
    resolved = page.locator(f"#resolved-{approval['id']}")
    assert resolved.locator(".decided-by").inner_text() == "oncall"
    assert resolved.locator(".credential").inner_text() == "asserted with the bootstrap token"
    shot(page, "approvals-resolved")
    page.goto(f"{k.url}/console/executions/{eid}")
    assert page.locator(".approval .credential").inner_text() == "asserted with the bootstrap token"
    assert "approvers oncall, release by oncall asserted" in page.locator(".approval").inner_text()  # spaced
    page.goto(f"{k.url}/console/audit?execution_id={eid}&decision=approval_denied")
    [record] = page.locator("tr.decision-row").all()
    assert record.locator(".decided-by").inner_text() == "oncall"
    assert record.locator(".credential").inner_text() == "asserted with the bootstrap token"


def test_with_bootstrap_approvals_off_the_inbox_offers_the_bootstrap_token_no_decision(
    tmp_path_factory: pytest.TempPathFactory, page: Any
) -> None:
    with console_kernel(tmp_path_factory.mktemp("console-no-bootstrap"), "serve",
                        REGENT_BOOTSTRAP_APPROVALS="false") as (k, _):
        eid = k.run("ops", [RM], "blocked")
        approval = k.pending(eid)
        sign_in(page, k.url, BOOTSTRAP_TOKEN, "/console/approvals")
        row = page.locator(f"#approval-{approval['id']}")
        assert row.locator("button").count() == 0
        assert "named API key" in row.inner_text()
        # and a forged form changes nothing: the core refuses it (403) whatever the page showed
        csrf = page.locator("form[action='/console/sign-out'] input[name=csrf]").get_attribute("value")
        r = page.request.post(f"{k.url}/console/approvals/{approval['id']}/grant",
                              form={"csrf": csrf, "decided_by": "oncall"})
        assert r.status == 403 and "REGENT_BOOTSTRAP_APPROVALS" in r.text()
        assert k.api.http.get(f"/v0/approvals/{approval['id']}").json()["status"] == "pending"
