"""Operator safety and the audit trail in a real Chromium under `regent dev`: a cancel asks for
confirmation and a reason and records both; the policies page says who stored and who last
activated each revision, and when; a shadow is promoted only after a confirmation page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.conftest import ConsoleKernel, console_kernel, shot
from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RM = {"tool": "shell_exec", "args": {"command": "rm -rf /tmp/x"}}  # needs approval
CANDIDATE = """default_action: deny
rules:
  - id: candidate-allows-ls
    when: {target: shell_exec, arguments: {command: {regex: "^ls"}}}
    then: {decision: allow}
"""


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleKernel]:
    with console_kernel(tmp_path_factory.mktemp("console-operator")) as (k, _):
        yield k


def test_cancel_asks_for_confirmation_and_a_reason_and_records_who_and_why(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [RM], "blocked")
    approval = ck.pending(eid)
    page.goto(f"{ck.url}/console/executions/{eid}")
    page.click("text=Cancel execution…")
    page.locator("#cancel-form").wait_for()
    assert ck.api.get(eid)["status"] == "blocked"  # the first click only asked
    text = page.locator("main").inner_text()
    assert "1 pending approval" in text and eid in text
    page.fill("textarea[name=rationale]", "vendor not on the approved list")
    shot(page, "cancel-confirm")
    page.click("text=Yes, cancel the execution")
    page.locator("#execution-status", has_text="cancelled").wait_for()
    row = page.locator("tr.event", has_text="execution.cancelled")
    assert "client_cancelled by bootstrap" in row.inner_text()
    assert row.locator(".rationale").inner_text() == "vendor not on the approved list"
    assert page.locator(".approval .pill").inner_text() == "cancelled"
    shot(page, "cancel-done")
    assert page.dialogs == []  # no JavaScript confirm() involved
    [cancelled] = [e["payload"] for e in ck.api.events(eid) if e["type"] == "execution.cancelled"]
    assert (cancelled["cancelled_by"], cancelled["credential"], cancelled["rationale"]) == (
        "bootstrap", "dev", "vendor not on the approved list")
    got = ck.api.http.get(f"/v0/approvals/{approval['id']}").json()
    assert got["status"] == "cancelled" and got["decided_by"] == "bootstrap"


def test_a_cancel_form_posted_without_its_confirmation_cancels_nothing(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [RM], "blocked")
    page.goto(f"{ck.url}/console/executions/{eid}/cancel")
    # The form without its confirming button's value: what a stray or scripted submit would send.
    page.evaluate("document.querySelector('#cancel-form button[name=confirm]').removeAttribute('name')")
    page.click("text=Yes, cancel the execution")
    page.locator("#cancel-error").wait_for()
    assert "Nothing was cancelled" in page.locator("#cancel-error").inner_text()
    assert ck.api.get(eid)["status"] == "blocked"
    page.click("text=No, keep it running")
    page.locator("#execution-status", has_text="blocked").wait_for()


def test_the_revision_history_says_who_stored_and_who_last_activated_each_revision(
        ck: ConsoleKernel, page: Any) -> None:
    first = ck.api.http.get("/v0/policies/ops").json()["seq"]
    r = ck.api.http.post("/v0/policies/ops", json={"bundle": CANDIDATE.replace("deny", "allow", 1)})
    assert r.status_code == 204, r.text
    page.goto(f"{ck.url}/console/policies?agent_id=ops")
    row = page.locator(f"#revision-{first}")
    stored_at = row.locator(".stored-at").inner_text()
    assert "manifest" in row.locator(".stored-by").inner_text()  # provisioned from regent.yaml
    row.locator("text=Re-activate").click()
    page.locator("#activate-confirm").wait_for()
    assert ck.api.http.get("/v0/policies/ops").json()["seq"] != first  # the click only asked
    assert "dev (anonymous admin)" in page.locator("main").inner_text()  # who the history will name
    shot(page, "activate-confirm")
    # The form without its confirming button's value: what a stray Enter or scripted submit sends.
    page.evaluate("document.querySelector('#activate-confirm button[name=confirm]').removeAttribute('name')")
    page.click("#activate-confirm button")
    page.locator("#activate-error").wait_for()
    assert "Nothing was activated" in page.locator("#activate-error").inner_text()
    assert ck.api.http.get("/v0/policies/ops").json()["seq"] != first
    page.click("#activate-confirm button[name=confirm]")  # the confirmation step, confirmed
    page.locator(".notice.ok", has_text=f"#{first}").wait_for()
    row = page.locator(f"#revision-{first}")
    activated = ck.api.http.get("/v0/policies/ops").json()
    assert activated["seq"] == first and activated["activated_via"] == "reactivate"
    assert "dev" in row.locator(".activated-by").inner_text()  # anonymous dev access: its credential
    assert "reactivate" in row.locator(".activated-by").inner_text()
    assert row.locator(".stored-at").inner_text() == stored_at  # stored once, activated again later
    assert row.locator(".activated-at").inner_text() != stored_at
    assert "reactivate" in page.locator("#active-by").inner_text()
    shot(page, "policies-history-by")


def test_a_shadow_is_promoted_from_the_console_only_after_a_confirmation(ck: ConsoleKernel, page: Any) -> None:
    r = ck.api.http.put("/v0/policies/ops/shadow", json={"bundle": CANDIDATE})
    assert r.status_code == 200, r.text
    shadow_revision = r.json()["revision"]
    before = ck.api.http.get("/v0/policies/ops").json()["seq"]
    page.goto(f"{ck.url}/console/policies?agent_id=ops")
    page.click("text=Promote to active…")
    page.locator("#promote-confirm").wait_for()
    assert ck.api.http.get("/v0/policies/ops").json()["seq"] == before  # the first click only asked
    assert shadow_revision[:24] in page.locator("#promote-sides").inner_text()
    shot(page, "promote-confirm")
    page.click("text=Yes, promote it")
    page.locator(".notice.ok", has_text="promoted").wait_for()
    active = wait_for(lambda: (a := ck.api.http.get("/v0/policies/ops").json())["seq"] > before and a,
                      "the promoted revision", timeout=10)
    assert active["revision"] == shadow_revision and active["activated_via"] == "promoted"
    (event, *_) = ck.api.http.get("/v0/policies/ops/events").json()
    assert (event["type"], event["credential"], event["payload"]["from_seq"]) == ("policy.promoted", "dev", before)
    assert "promoted" in page.locator("#active-by").inner_text()
    assert page.dialogs == []
    shot(page, "promote-done")
