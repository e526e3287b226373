"""The console under `regent dev` (anonymous admin) in a real Chromium: executions and their
timelines (live while running), escaping, CSRF, the policies page and the playground."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.console.conftest import ConsoleKernel, console_kernel, shot
from tests.e2e.conftest import (
    REPO,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LS = {"tool": "shell_exec", "args": {"command": "ls -la"}}
DELETE = {"tool": "fs_delete", "args": {"path": "/etc"}}
RM = {"tool": "shell_exec", "args": {"command": "rm -rf /tmp/x"}}  # needs approval
XSS = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleKernel]:
    with console_kernel(tmp_path_factory.mktemp("console-dev")) as (k, _):
        yield k


def test_regent_dev_prints_where_the_console_is(ck: ConsoleKernel) -> None:
    assert f"console {ck.url}/console (anonymous admin)" in (ck.tmp / "kernel.out").read_text()


def test_timeline_of_a_completed_execution_shows_each_steps_decision_and_rule_id(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [LS, DELETE], "completed")
    page.goto(f"{ck.url}/console/executions/{eid}")
    rows = page.locator("tr.step")
    assert rows.count() == 2
    allowed, denied = rows.nth(0), rows.nth(1)
    assert allowed.locator(".target").inner_text() == "shell_exec"
    assert allowed.locator(".verdict").inner_text() == "allow"
    assert allowed.locator(".rule-id").inner_text() == "allow-read-only"
    assert "yaml" in allowed.locator("td.decision").inner_text()
    assert denied.locator(".target").inner_text() == "fs_delete"
    assert denied.locator(".verdict").inner_text() == "deny"
    assert denied.locator(".rule-id").inner_text() == "default"
    # the revision that decided, as the events recorded it
    revision = ck.api.http.get("/v0/policies/ops").json()["revision"]
    assert allowed.locator("td.decision [title]").get_attribute("title") == revision
    assert page.locator("#execution-status").inner_text() == "completed"
    assert page.locator("[data-live]").count() == 0  # a finished execution does not poll
    assert allowed.locator(".args").inner_text() == '{"command":"ls -la"}'
    assert allowed.locator(".result").inner_text() == '"ran shell_exec"'
    shot(page, "timeline")


def test_a_long_timeline_is_paged_with_links_to_every_part_of_it(ck: ConsoleKernel, page: Any) -> None:
    calls = [{"tool": "shell_exec", "args": {"command": f"ls /tmp/{i}"}} for i in range(200)]
    eid = ck.run("ops", calls, "completed", timeout=90)
    total = len(ck.api.http.get(f"/v0/executions/{eid}/events", params={"limit": 1000}).json())
    assert total > 500
    page.goto(f"{ck.url}/console/executions/{eid}")
    pager = page.locator("nav.pager").first
    assert pager.inner_text().startswith(f"events 1–500 of {total}")
    assert page.locator("nav.pager .earlier").count() == 0
    page.click("nav.pager .latest >> nth=0")
    page.wait_for_url(re.compile(r"after_seq=\d+"))
    last = page.locator("nav.pager").first.inner_text()
    assert last.endswith("‹ earlier") and f"of {total}" in last and f"–{total} of" in last
    assert page.locator("tr.event", has_text="execution.completed").count() == 1
    assert page.locator("dl.facts div", has_text="Steps").locator("dd").inner_text() == "200"  # all, not this page's
    last_step = page.locator("tr.step").last.get_attribute("id")
    page.screenshot(path=str(shot(page, "timeline-paged")), clip={"x": 0, "y": 0, "width": 1280, "height": 800})
    page.click("nav.pager .first >> nth=0")
    page.wait_for_load_state()  # the click returns at commit; count() does not wait for rows
    assert page.locator("tr.event", has_text="execution.created").count() == 1
    assert page.locator("tr.step").count() >= 100
    # The audit links a decision to its step, on the timeline page that holds its event.
    page.goto(f"{ck.url}/console/audit?execution_id={eid}")
    page.click(f"a[href$='#{last_step}']")
    page.wait_for_url(re.compile(r"after_seq=\d+#step-"))
    assert page.locator(f"tr#{last_step}").is_visible()


def test_executions_list_filters_by_status_and_shows_counts(ck: ConsoleKernel, page: Any) -> None:
    done = ck.run("ops", [LS], "completed")
    blocked = ck.run("ops", [RM], "blocked")
    page.goto(f"{ck.url}/console/executions")
    assert page.locator(f"a[href='/console/executions/{done}']").count() == 1
    assert page.locator(f"a[href='/console/executions/{blocked}']").count() == 1
    counts = {li.inner_text().split()[0]: int(li.inner_text().split()[1]) for li in page.locator(".counts li").all()}
    assert counts["blocked"] >= 1 and counts["completed"] >= 1
    shot(page, "executions")
    page.select_option("select[name=status]", "blocked")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"status=blocked"))
    assert page.locator(f"a[href='/console/executions/{blocked}']").count() == 1
    assert page.locator(f"a[href='/console/executions/{done}']").count() == 0
    statuses = {s.inner_text() for s in page.locator("tbody td .pill").all()}
    assert statuses == {"blocked"}


def test_running_execution_timeline_updates_without_a_reload(ck: ConsoleKernel, page: Any) -> None:
    gate = ck.tmp / "gate-live"
    eid = ck.run("ops", [LS, LS | {"args": {"command": "pwd"}}], gate=str(gate))
    wait_for(lambda: ck.api.types(eid).count("step.succeeded") == 1, "the first step to succeed")
    page.goto(f"{ck.url}/console/executions/{eid}")
    assert page.locator("tr.step").count() == 1
    assert page.locator(".live").count() == 1
    page.evaluate("window.__same_document = true")
    gate.write_text("go")
    page.locator("#execution-status", has_text="completed").wait_for(timeout=20_000)
    assert page.locator("tr.step").count() == 2
    assert page.evaluate("window.__same_document === true")  # swapped in place, not reloaded
    assert page.locator(".live").count() == 0


def test_a_step_whose_args_hold_a_script_renders_as_text(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [{"tool": "note", "args": {"text": XSS}}], "completed")
    page.goto(f"{ck.url}/console/executions/{eid}")
    row = page.locator("tr.step").first
    assert row.locator(".args").inner_text() == '{"text":"<script>alert(1)</script>"}'
    assert XSS in page.locator(".summary .input").inner_text()
    assert page.evaluate("document.scripts.length") == 1  # only the console's own script
    page.goto(f"{ck.url}/console/executions")  # the input preview in the list
    assert XSS in page.locator("td.clip").first.inner_text()
    assert page.dialogs == []
    assert page.evaluate("document.scripts.length") == 1


def test_state_changing_post_without_the_csrf_token_is_refused(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [RM], "blocked")
    page.goto(f"{ck.url}/console/executions/{eid}")
    status = page.evaluate(
        """async (url) => (await fetch(url, {method: "POST", body: new URLSearchParams({})})).status""",
        f"/console/executions/{eid}/cancel")
    assert status == 403
    wrong = page.evaluate(
        """async (url) => { const r = await fetch(url, {method: "POST", body: new URLSearchParams({csrf: "x"})});
                            return [r.status, await r.text()]; }""",
        f"/console/executions/{eid}/cancel")
    assert wrong[0] == 403 and "CSRF" in wrong[1]
    assert ck.api.get(eid)["status"] == "blocked"
    # the right token from another site's page is refused too (its Origin names that site)
    [cookie] = [c for c in page.context.cookies() if c["name"] == "regent_console"]
    page.click("text=Cancel execution…")  # the confirmation page holds the form and its token
    token = page.locator("input[name=csrf]").first.get_attribute("value")
    r = httpx.post(f"{ck.url}/console/executions/{eid}/cancel", data={"csrf": token, "confirm": "yes"},
                   cookies={"regent_console": cookie["value"]}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "another site" in r.text
    assert ck.api.get(eid)["status"] == "blocked"
    # the same POST from the page's own form carries the token and is accepted
    page.click("text=Yes, cancel the execution")
    page.locator("#execution-status", has_text="cancelled").wait_for()
    assert ck.api.get(eid)["status"] == "cancelled"


def test_session_cookie_is_httponly_samesite_strict_and_expires(ck: ConsoleKernel, page: Any) -> None:
    page.goto(f"{ck.url}/console/executions")
    [cookie] = [c for c in page.context.cookies() if c["name"] == "regent_console"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert page.evaluate("document.cookie") == ""
    r = httpx.get(f"{ck.url}/console/executions", cookies={"regent_console": cookie["value"] + "x"})
    assert r.status_code == 200 and "regent_console=" in r.headers.get("set-cookie", "")  # dev: a new one


BROKEN = "default_action: deny\nrules:\n  - id: oops\n    when: [target\n"
CANDIDATE = """default_action: allow
rules:
  - id: no-listing
    when:
      target: shell_exec
      arguments:
        command: {regex: "^ls"}
    then:
      decision: deny
      reason: no listing today
"""


def test_upload_with_a_syntax_error_is_refused_with_file_line_and_the_active_revision_keeps_deciding(
    ck: ConsoleKernel, page: Any
) -> None:
    before = ck.api.http.get("/v0/policies/ops/revisions").json()
    page.goto(f"{ck.url}/console/policies?agent_id=ops")
    assert page.locator(".source li").first.inner_text().startswith("#")  # the bundle's first line
    shot(page, "policies")
    page.fill("textarea[name=source]", BROKEN)
    page.click("text=Check and activate")
    errors = page.locator("#gate-errors")
    errors.wait_for()
    assert re.search(r"bundle\.yaml:\d+: ", errors.inner_text()), errors.inner_text()
    assert page.locator("textarea[name=source]").input_value() == BROKEN  # kept for fixing
    shot(page, "policies-upload-refused")
    assert ck.api.http.get("/v0/policies/ops/revisions").json() == before
    eid = ck.run("ops", [LS], "completed")
    [allowed] = [e["payload"] for e in ck.api.events(eid) if e["type"] == "step.allowed"]
    assert allowed["rule_id"] == "allow-read-only"


def test_upload_activates_a_new_revision_shows_the_diff_and_an_old_one_can_be_reactivated(
    ck: ConsoleKernel, page: Any
) -> None:
    page.goto(f"{ck.url}/console/policies?agent_id=ops")
    page.fill("textarea[name=source]", CANDIDATE)
    page.click("text=Check and activate")
    page.locator(".notice.ok").wait_for()
    seqs = [r["seq"] for r in ck.api.http.get("/v0/policies/ops/revisions").json()]
    new, old = max(seqs), min(seqs)
    assert ck.api.http.get("/v0/policies/ops").json()["seq"] == new
    page.goto(f"{ck.url}/console/policies?agent_id=ops&from={old}&to={new}")
    # each revision shows the policy hash its decisions record (docs/audit.md), to match them up
    hashes = {r["policy_hash"] for r in ck.api.http.get("/v0/policies/ops/revisions").json()}
    shown = page.locator("td.policy-hash")
    assert {shown.nth(i).get_attribute("title") for i in range(shown.count())} == hashes
    assert all(len(t) == 12 for t in shown.all_inner_texts())
    added = page.locator("#diff .add").all_inner_texts()
    assert "+  - id: no-listing" in added
    shot(page, "policies-diff")
    page.locator("tr", has_text=f"{old}").locator("text=Re-activate").first.click()
    # a confirmation page names the revision and what changes; nothing is activated until it is confirmed
    assert ck.api.http.get("/v0/policies/ops").json()["seq"] == new
    assert "no-listing" in page.locator("#activate-diff").inner_text()
    page.click("#activate-confirm button[name=confirm]")
    page.locator(".notice.ok", has_text=f"#{old}").wait_for()
    assert ck.api.http.get("/v0/policies/ops").json()["seq"] == old


def test_playground_shows_the_active_and_the_candidate_decision_for_one_input(ck: ConsoleKernel, page: Any) -> None:
    ck.run("ops", [LS, DELETE], "completed")  # something to replay
    page.goto(f"{ck.url}/console/playground")
    page.select_option("select[name=agent_id]", "ops")
    page.fill("input[name=target]", "shell_exec")
    page.fill("textarea[name=args]", '{"command": "ls -la"}')
    page.fill("textarea[name=candidate]", CANDIDATE)
    page.click("button:text-is('Evaluate')")
    active, candidate = page.locator("#eval-active"), page.locator("#eval-candidate")
    active.wait_for()
    assert active.locator(".verdict").inner_text() == "allow"
    assert active.locator(".rule-id").inner_text() == "allow-read-only"
    assert any(line.startswith("→ allow-read-only (line") for line in active.locator(".explain li").all_inner_texts())
    assert candidate.locator(".verdict").inner_text() == "deny"
    assert candidate.locator(".rule-id").inner_text() == "no-listing"
    assert "no listing today" in candidate.inner_text()
    shot(page, "playground")
    page.click("text=Replay against the candidate")
    replay = page.locator("#replay")
    replay.wait_for()
    changed = replay.locator("tr.changed")
    assert changed.count() >= 2  # ls: allow → deny; fs_delete: deny → allow
    texts = changed.all_inner_texts()
    assert any("shell_exec" in t and "no-listing" in t for t in texts)
    assert any("fs_delete" in t and "default" in t for t in texts)
    shot(page, "playground-replay")


def test_playground_reports_a_candidate_that_does_not_compile(ck: ConsoleKernel, page: Any) -> None:
    page.goto(f"{ck.url}/console/playground")
    page.fill("input[name=target]", "shell_exec")
    page.fill("textarea[name=candidate]", BROKEN)
    page.click("button:text-is('Evaluate')")
    errors = page.locator("#playground-errors")
    errors.wait_for()
    assert re.search(r"candidate\.yaml:\d+: ", errors.inner_text())


REGO_CANDIDATE = """package shell

import rego.v1

decision := {"decision": "deny", "rule_id": "no-listing-rego", "reason": "no listing today"} if {
	input.target == "shell_exec"
	startswith(input.args.command, data.shell.prefix)
} else := {"decision": "allow", "rule_id": "allow-rest"}
"""


def test_playground_decides_with_a_rego_candidate_module_and_its_data(ck: ConsoleKernel, page: Any) -> None:
    page.goto(f"{ck.url}/console/playground")
    page.select_option("select[name=agent_id]", "ops")
    page.fill("input[name=target]", "shell_exec")
    page.fill("textarea[name=args]", '{"command": "ls -la"}')
    page.check("input[name=candidate_kind][value=rego]")
    page.fill("textarea[name=candidate]", REGO_CANDIDATE)
    page.click("details.rego-extras summary")
    page.fill("textarea[name=candidate_data]", '{"shell": {"prefix": "ls"}}')
    page.click("button:text-is('Evaluate')")
    active, candidate = page.locator("#eval-active"), page.locator("#eval-candidate")
    candidate.wait_for()
    assert active.locator(".verdict").inner_text() == "allow"  # the active YAML bundle
    assert candidate.locator(".verdict").inner_text() == "deny"
    assert candidate.locator(".rule-id").inner_text() == "no-listing-rego"
    assert "rego" in candidate.locator("h2").inner_text()
    assert candidate.locator(".explain li").count() > 0  # the Rego explanation
    shot(page, "playground-rego")
    assert page.locator("input[name=candidate_kind][value=rego]").is_checked()  # the form keeps what was typed


def test_a_rego_candidate_with_a_syntax_error_is_refused_with_its_file_and_line(ck: ConsoleKernel, page: Any) -> None:
    page.goto(f"{ck.url}/console/playground")
    page.fill("input[name=target]", "shell_exec")
    page.check("input[name=candidate_kind][value=rego]")
    page.fill("textarea[name=candidate]", "package shell\n\nimport rego.v1\n\ndecision := {\n")
    page.click("button:text-is('Evaluate')")
    errors = page.locator("#playground-errors")
    errors.wait_for()
    assert re.search(r"policy\.rego:\d+", errors.inner_text()), errors.inner_text()
    assert page.locator("#eval-candidate").count() == 0


def test_a_rego_bundle_tarball_chosen_as_the_candidate_decides(ck: ConsoleKernel, page: Any, tmp_path: Any) -> None:
    import tarfile

    bundle = tmp_path / "shell-rego.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        for f in sorted((REPO / "bundles" / "shell-rego").iterdir()):
            tar.add(f, arcname=f.name)
    page.goto(f"{ck.url}/console/playground")
    page.select_option("select[name=agent_id]", "ops")
    page.fill("input[name=target]", "shell_exec")
    page.fill("textarea[name=args]", '{"command": "rm -rf /tmp/x"}')
    page.click("details.rego-extras summary")
    page.set_input_files("input[name=candidate_file]", str(bundle))
    page.click("button:text-is('Evaluate')")
    candidate = page.locator("#eval-candidate")
    candidate.wait_for()
    assert candidate.locator(".verdict").inner_text() == "require_approval"
    assert candidate.locator(".rule-id").inner_text() == "approve-other-commands"
    assert "shell-rego-2026-12-03.1" in candidate.locator("h2 [title]").get_attribute("title")


def test_playground_starts_a_candidate_from_the_active_bundle(ck: ConsoleKernel, page: Any) -> None:
    page.goto(f"{ck.url}/console/playground?agent_id=ops")
    page.click("#start-from-active")
    page.wait_for_url(re.compile(r"start=active"))
    assert "allow-read-only" in page.locator("textarea[name=candidate]").input_value()
    assert page.locator("input[name=candidate_kind][value=yaml]").is_checked()


def test_a_long_value_is_collapsed_and_opens_to_the_whole_of_it(ck: ConsoleKernel, page: Any) -> None:
    text = "word " * 80
    eid = ck.run("ops", [{"tool": "note", "args": {"text": text}}], "completed")
    page.goto(f"{ck.url}/console/executions/{eid}")
    row = page.locator("tr.step").first
    pre = row.locator("pre.args")
    assert not pre.is_visible()  # collapsed behind its first characters
    row.locator("details summary").first.click()
    assert pre.is_visible() and text.strip() in pre.inner_text()


def test_a_long_unbroken_value_wraps_instead_of_widening_the_page(ck: ConsoleKernel, page: Any) -> None:
    # what an agent sends is not ours to shape: 20 000 characters without a space
    eid = ck.run("ops", [{"tool": "note", "args": {"memo": "x" * 20_000}}], "completed")
    page.set_viewport_size({"width": 1024, "height": 800})  # a laptop's window; the preview alone is ~900 px
    page.goto(f"{ck.url}/console/executions/{eid}")
    page.locator("tr.step").first.wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]


def test_a_denied_step_is_found_by_the_audit_search_and_is_in_both_exports(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [LS, DELETE], "completed")
    page.goto(f"{ck.url}/console/audit")
    page.select_option("select[name=decision]", "denied")
    page.fill("input[name=target]", "fs_delete")
    page.click("#audit-search button[type=submit]")
    page.wait_for_url(re.compile(r"decision=denied"))
    rows = page.locator("tr.decision-row", has=page.locator(f"a[href^='/console/executions/{eid}#step-']"))
    assert rows.count() == 1
    assert rows.first.locator(".rule-id").inner_text() == "default"
    assert {t for t in page.locator("tr.decision-row .target").all_inner_texts()} == {"fs_delete"}
    fetch = """async (href) => { const r = await fetch(href); return [r.status, r.headers.get("content-type"), await r.text()]; }"""
    page.wait_for_function("document.getElementById('chart-image').complete")
    assert page.evaluate("document.getElementById('chart-image').naturalWidth") > 0  # the SVG drew
    status, ctype, svg = page.evaluate(fetch, page.locator("#chart-image").get_attribute("src"))
    assert status == 200 and ctype.startswith("image/svg+xml")
    assert 'fill="url(#p-denied)"' in svg and " denied</title>" in svg  # the denied bar, drawn on the server
    # Each outcome has its own colour and its own fill pattern, in the chart and in its legend.
    fills = re.findall(r'<pattern id="p-\w+"(.*?)<rect width="6" height="6" fill="(#[0-9a-f]{6})"/>(.*?)</pattern>', svg, re.S)
    assert len(fills) == 7 and len({c for _, c, _ in fills}) == 7 and len({a + m for a, _, m in fills}) == 7
    assert page.locator("ul.legend li svg").count() == 7
    shot(page, "audit-search")
    status, ctype, body = page.evaluate(fetch, page.locator("#export-jsonl").get_attribute("href"))
    assert status == 200 and ctype.startswith("application/x-ndjson")
    head, *exported, end = [json.loads(line) for line in body.splitlines()]  # what it covers, the rows, their count
    assert head["regent_export"]["filters"] == {"decision": "denied", "target": "fs_delete"}
    assert end == {"regent_export_end": {"rows": len(exported), "complete": True}}
    assert any(r["execution_id"] == eid and r["decision"] == "denied" and r["rule_id"] == "default" for r in exported)
    assert {r["target"] for r in exported} == {"fs_delete"}
    status, ctype, body = page.evaluate(fetch, page.locator("#export-csv").get_attribute("href"))
    assert status == 200 and ctype.startswith("text/csv")
    table = list(csv.DictReader(io.StringIO("".join(line for line in body.splitlines(True) if not line.startswith("#")))))
    assert any(r["execution_id"] == eid and r["decision"] == "denied" for r in table)
    page.goto(f"{ck.url}/console/audit")  # every outcome the module's executions met, for the docs
    page.wait_for_function("document.getElementById('chart-image').complete")
    shot(page, "audit")


def test_the_audit_finds_a_bundle_by_the_hash_prefix_it_shows(ck: ConsoleKernel, page: Any) -> None:
    eid = ck.run("ops", [DELETE], "completed")
    [d] = ck.api.http.get("/v0/decisions", params={"execution_id": eid}).json()["decisions"]
    page.goto(f"{ck.url}/console/audit?execution_id={eid}")
    shown = page.locator("tr.decision-row .policy-hash").first  # the Bundle column: a hash's first 12
    assert shown.get_attribute("title") == d["policy_hash"]
    page.fill("input[name=policy_hash]", shown.inner_text())
    page.click("#audit-search button[type=submit]")
    page.wait_for_url(re.compile(r"policy_hash="))
    assert page.locator("#search-error").count() == 0
    titles = page.locator("tr.decision-row .policy-hash")
    assert titles.count() >= 1 and {titles.nth(i).get_attribute("title") for i in range(titles.count())} == {
        d["policy_hash"]}


def test_a_search_the_audit_cannot_run_is_said_above_the_form_that_keeps_it(ck: ConsoleKernel, page: Any) -> None:
    # two Rego bundles under one manifest revision: the revision alone does not say which
    d = REPO / "bundles" / "shell-rego"
    r = ck.api.http.post("/v0/agents", json={"id": "two-bundles", "webhook_url": "http://127.0.0.1:9/webhook",
                                             "secret": "two-bundles-secret"})
    assert r.status_code in (200, 201), r.text
    for marker in ("one", "two"):
        data = json.loads((d / "data.json").read_text())
        data["shell"]["marker"] = marker
        bundle = {"modules": {"policy.rego": (d / "policy.rego").read_text()}, "data": data,
                  "manifest": {"revision": "same-1", "roots": ["shell"],
                               "metadata": {"regent": {"entrypoint": "shell/decision", "default_action": "deny"}}}}
        assert ck.api.http.post("/v0/policies/two-bundles", json={"kind": "rego", "bundle": bundle}).status_code == 204
    hashes = sorted(x["policy_hash"] for x in ck.api.http.get("/v0/policies/two-bundles/revisions").json())
    r = page.goto(f"{ck.url}/console/audit?agent_id=two-bundles&policy_hash=same-1&target=shell_exec")
    assert r.status == 400
    error = page.locator("#search-error").inner_text()
    assert "names 2 different bundles" in error and all(h[:12] in error for h in hashes)
    assert page.locator("input[name=target]").input_value() == "shell_exec"  # the form keeps the search
    assert page.locator("#chart-image").count() == 0
    page.fill("input[name=policy_hash]", hashes[1][:12])  # one of the prefixes the message lists
    page.click("#audit-search button[type=submit]")
    page.wait_for_url(re.compile(hashes[1][:12]))
    assert page.locator("#search-error").count() == 0 and page.locator("#chart-image").count() == 1
    page.goto(f"{ck.url}/console/audit?from=yesterday")
    assert "is not a date and time" in page.locator("#search-error").inner_text()


def test_a_rego_bundle_shows_every_module_data_json_and_the_manifest_with_line_numbers(ck: ConsoleKernel, page: Any) -> None:
    d = REPO / "bundles" / "shell-rego"
    r = ck.api.http.post("/v0/agents", json={"id": "ops-rego", "webhook_url": "http://127.0.0.1:9/webhook",
                                             "secret": "not-shown-anywhere"})
    assert r.status_code in (200, 201), r.text
    bundle = {"modules": {"policy.rego": (d / "policy.rego").read_text()},
              "data": json.loads((d / "data.json").read_text()),
              "manifest": {"revision": "console-1", "roots": ["shell"],
                           "metadata": {"regent": {"entrypoint": "shell/decision", "default_action": "deny"}}}}
    r = ck.api.http.post("/v0/policies/ops-rego", json={"kind": "rego", "bundle": bundle})
    assert r.status_code == 204, r.text
    page.goto(f"{ck.url}/console/policies?agent_id=ops-rego")
    names = page.locator(".card h3").all_inner_texts()
    assert names == ["policy.rego", "data.json", ".manifest"]
    first = page.locator(".source").first.locator("li")
    assert first.count() == len((d / "policy.rego").read_text().splitlines())
    assert first.first.inner_text() == (d / "policy.rego").read_text().splitlines()[0]
    assert "console-1" in page.locator("dl.facts").inner_text()
    assert "not-shown-anywhere" not in page.content()


SHADOW_CANDIDATE = """default_action: deny
rules:
  - id: no-listing
    when: {target: shell_exec}
    then: {decision: deny, reason: listing is off in the candidate}
"""


def test_policies_page_shows_the_shadow_report_with_links_to_the_disagreeing_steps(
    ck: ConsoleKernel, page: Any
) -> None:
    r = ck.api.http.put("/v0/policies/ops/shadow", json={"bundle": SHADOW_CANDIDATE})
    assert r.status_code == 200, r.text
    try:
        eid = ck.run("ops", [LS], "completed")  # the active bundle allows it; the shadow would deny
        wait_for(lambda: ck.api.http.get("/v0/policies/ops/shadow/report").json()["totals"]["evaluated"] >= 1,
                 "the shadow judgement", timeout=20)
        page.goto(f"{ck.url}/console/policies?agent_id=ops")
        card = page.locator("#shadow-report")
        card.wait_for()
        assert "allow→deny" in card.inner_text() and "no-listing" in card.inner_text()
        link = page.locator("#shadow-samples a").first
        assert link.get_attribute("href") == f"/console/executions/{eid}"
        shot(page, "policies-shadow")
    finally:
        assert ck.api.http.delete("/v0/policies/ops/shadow").status_code == 204
