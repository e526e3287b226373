"""The console's read models on both dialects: the executions page with its counts, a timeline's
rows, and the audit chart's counts per time bucket."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kernel.clock import ManualClock
from kernel.core import audit, steps, timeline
from kernel.core.audit import DecisionQuery
from kernel.core.executions import cancel_execution
from kernel.core.kernel import Kernel
from kernel.domain import Decision, Lease, Verdict
from kernel.store import tables as t
from kernel.store.base import SqlStore
from tests.conftest import Running
from tests.core.test_steps import FixedPolicy, req


def test_execution_page_filters_by_created_range_pages_by_keyset_and_counts_by_status(
    kernel: Kernel, running: Running, clock: ManualClock
) -> None:
    first, _, _ = running.start()
    clock.advance(60)
    start = clock.now()
    ids = [running.start()[0] for _ in range(3)]
    cancel_execution(kernel, ids[0])
    page = timeline.execution_page(kernel, agent_id="shell", status=None, created_from=start, created_to=None,
                                   cursor=None, limit=2)
    assert [e.id for e in page.executions] == [ids[2], ids[1]]
    assert page.counts == {"running": 3, "cancelled": 1}
    rest = timeline.execution_page(kernel, agent_id="shell", status=None, created_from=start, created_to=None,
                                   cursor=page.next_cursor, limit=2)
    assert [e.id for e in rest.executions] == [ids[0]] and rest.next_cursor is None
    before = timeline.execution_page(kernel, agent_id=None, status="running", created_from=None, created_to=start,
                                     cursor=None, limit=10)
    assert [e.id for e in before.executions] == [first]


def test_timeline_folds_each_steps_events_into_one_row_with_its_decision(kernel: Kernel, running: Running) -> None:
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "no-email", "not today"))
    eid, did, att = running.start()
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="send_email", args={"to": "a@example.com"}))
    t = timeline.timeline(kernel, eid)
    [row] = [r for r in t.rows if isinstance(r, timeline.StepRow)]
    assert (row.target, row.decision, row.rule_id, row.reason) == ("send_email", "deny", "no-email", "not today")
    assert [e.type for e in row.events] == ["step.proposed", "step.denied"]
    assert row.step is not None and row.step.args == {"to": "a@example.com"}
    assert t.steps == 1 and t.execution_seq == t.last_seq and t.next_seq is None
    paged = timeline.timeline(kernel, eid, after_seq=0, limit=2)
    assert paged.next_seq == 2 and all(not isinstance(r, timeline.StepRow) for r in paged.rows)


def test_decision_counts_fall_in_their_time_buckets_by_outcome(kernel: Kernel, running: Running, clock: ManualClock) -> None:
    since = clock.now()  # 12:00, a whole hour
    eid, did, att = running.start()
    kernel.policy = FixedPolicy(Decision(Verdict.ALLOW, "ok"))
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="a"))
    clock.advance(3600 + 1)  # the second hour
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="b"))
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "no"))
    steps.submit_step(kernel, Lease("shell", eid, did, att), req(target="c"))
    clock.advance(3 * 3600)
    window = since + timedelta(hours=6)  # 15-minute buckets: counted from the records
    counts = audit.count_decisions(kernel, DecisionQuery(), since, window)
    assert counts.width == timedelta(minutes=15) and counts.rolled_up_hours == 0
    assert counts.buckets[0] == {"allowed": 1} and counts.buckets[4] == {"allowed": 1, "denied": 1}
    assert sum(sum(b.values()) for b in counts.buckets) == 3
    only = audit.count_decisions(kernel, DecisionQuery(decision="denied"), since, window)
    assert only.buckets[4] == {"denied": 1} and sum(sum(b.values()) for b in only.buckets) == 1
    day = audit.count_decisions(kernel, DecisionQuery(), since, since + timedelta(hours=24))
    assert day.width == timedelta(hours=1) and day.buckets[:3] == [{"allowed": 1}, {"allowed": 1, "denied": 1}, {}]
    assert audit.count_decisions(kernel, DecisionQuery(target="a"), since, since + timedelta(hours=24)).buckets[0] == {"allowed": 1}


def test_bucket_edges_are_whole_widths_inside_the_range_with_partial_ends() -> None:
    t0 = datetime(2026, 12, 1, 12, 20, tzinfo=UTC)
    edges, width = audit.bucket_edges(t0, t0 + timedelta(hours=24))
    assert width == timedelta(hours=1) and len(edges) == 26  # 12:20-13:00, 23 whole hours, 12:00-12:20
    assert edges[1] == datetime(2026, 12, 1, 13, tzinfo=UTC) and edges[-1] == t0 + timedelta(hours=24)
    assert audit.bucket_edges(t0, t0 + timedelta(hours=3))[1] == timedelta(minutes=5)
    assert audit.bucket_edges(t0, t0 + timedelta(days=30))[1] == timedelta(days=1)
    assert audit.bucket_edges(t0, t0 + timedelta(days=365))[1] == timedelta(days=30)
    since, until = audit.default_range(t0)
    assert (since, until) == (datetime(2026, 11, 30, 13, tzinfo=UTC), datetime(2026, 12, 1, 13, tzinfo=UTC))


def _decide(kernel: Kernel, running: Running, n: int, verdict: Verdict = Verdict.ALLOW, target: str = "t") -> None:
    eid, did, att = running.start()
    kernel.policy = FixedPolicy(Decision(verdict, f"rule-{verdict.value}"))
    for i in range(n):
        steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=target, args={"i": i}))


def test_closed_hours_are_summed_from_the_rollup_not_scanned_again(
    kernel: Kernel, running: Running, clock: ManualClock, store: SqlStore
) -> None:
    since = clock.now()
    _decide(kernel, running, 3)
    clock.advance(3600)
    _decide(kernel, running, 2, Verdict.DENY, target="x")
    clock.advance(3600 + 60)  # 14:01: 12:00 and 13:00 are closed, but 13:00 ended less than 5 minutes ago
    until = since + timedelta(hours=24)
    first = audit.count_decisions(kernel, DecisionQuery(), since, until)
    assert first.rolled_up_hours == 1 and first.buckets[:2] == [{"allowed": 3}, {"denied": 2}]
    clock.advance(600)
    second = audit.count_decisions(kernel, DecisionQuery(), since, until)
    assert second.rolled_up_hours == 2 and second.buckets == first.buckets
    # The records of the rolled-up hours are gone (as if deleted behind the kernel's back): the
    # chart still counts them, so it read the rollup, not the records.
    with store.engine.begin() as c:
        c.execute(t.decisions.delete())
        c.execute(t.decisions.insert(), [{  # one record left, a day older, so the records do not end before 12:00
            "id": "old", "agent_id": "shell", "execution_id": "e", "step_id": None, "kind": "tool_call",
            "target": "old", "decision": "allowed", "rule_id": "r", "reason": None, "policy_kind": "yaml",
            "policy_revision": "r", "policy_hash": "0" * 64, "decided_by": None, "credential": None,
            "event_seq": None, "decided_at": since - timedelta(days=1)}])
        c.execute(t.decision_journal.delete())  # the records not yet moved out of the journal
    assert audit.count_decisions(kernel, DecisionQuery(), since, until).buckets[:2] == [{"allowed": 3}, {"denied": 2}]
    assert audit.count_decisions(kernel, DecisionQuery(decision="denied"), since, until).buckets[:2] == [{}, {"denied": 2}]
    assert audit.count_decisions(kernel, DecisionQuery(rule_id="rule-allow"), since, until).buckets[0] == {"allowed": 3}
    # A filter the rollup does not keep (target) is counted from the records.
    by_target = audit.count_decisions(kernel, DecisionQuery(target="x"), since, until)
    assert by_target.rolled_up_hours == 0 and by_target.buckets[1] == {}


def test_the_open_hour_and_partial_ends_are_counted_from_the_records(
    kernel: Kernel, running: Running, clock: ManualClock
) -> None:
    since = clock.now()
    _decide(kernel, running, 2)
    clock.advance(2 * 3600 + 10 * 60)  # 14:10
    assert audit.roll_up_recent(kernel) >= 2  # what the cleanup sweep does
    _decide(kernel, running, 1, Verdict.DENY)  # in the open hour
    counts = audit.count_decisions(kernel, DecisionQuery(), since + timedelta(minutes=30),
                                       since + timedelta(hours=25))
    assert counts.buckets[0] == {} and counts.rolled_up_hours == 1  # 12:30-13:00 counted live: nothing after 12:00
    whole = audit.count_decisions(kernel, DecisionQuery(), since, since + timedelta(hours=24))
    assert whole.buckets[0] == {"allowed": 2} and whole.buckets[2] == {"denied": 1}


def test_retention_forgets_the_rolled_up_hours_it_deletes_records_of(
    kernel: Kernel, running: Running, clock: ManualClock
) -> None:
    since = clock.now()
    _decide(kernel, running, 2)
    clock.advance(2 * 3600)
    _decide(kernel, running, 1)
    clock.advance(2 * 3600)
    assert audit.count_decisions(kernel, DecisionQuery(), since, since + timedelta(hours=24)).rolled_up_hours == 3
    kernel.decision_retention = 3 * 3600.0  # cutoff 13:00: the 12:00 decisions go
    assert audit.delete_expired_decisions(kernel) == 2
    after = audit.count_decisions(kernel, DecisionQuery(), since, since + timedelta(hours=24))
    assert after.buckets[0] == {} and after.buckets[2] == {"allowed": 1}


def test_a_decision_search_names_its_bundle_by_revision_or_by_policy_hash(kernel: Kernel, running: Running) -> None:
    from kernel.core import policies
    from kernel.errors import ValidationError

    with kernel.store.transaction() as tx:
        tx.add_policy_revision("shell", "yaml", "shell-2026-12-01", "default_action: deny\nrules: []\n", kernel.clock.now())
    [stored] = policies.list_revisions(kernel, "shell")
    assert stored.revision == "shell-2026-12-01" and len(stored.content_hash) == 64
    assert policies.policy_hash_of(kernel, stored.revision) == stored.content_hash
    assert policies.policy_hash_of(kernel, stored.revision, "shell") == stored.content_hash
    assert policies.policy_hash_of(kernel, stored.content_hash.upper()) == stored.content_hash
    with pytest.raises(ValidationError, match="no stored bundle has the revision"):
        policies.policy_hash_of(kernel, "no-such-revision")


def test_a_range_reaching_back_before_the_oldest_record_marks_no_hours_before_it(
    kernel: Kernel, running: Running, clock: ManualClock
) -> None:
    kernel.decision_retention = 0  # kept for ever: only the records bound how far back hours go
    since = clock.now()
    _decide(kernel, running, 2)
    clock.advance(2 * 3600 + 600)  # 14:10: 12:00 and 13:00 are closed
    counts = audit.count_decisions(kernel, DecisionQuery(), datetime(1, 1, 2, tzinfo=UTC), clock.now())
    assert counts.rolled_up_hours == 2 and sum(sum(b.values()) for b in counts.buckets) == 2
    assert counts.edges[0] == datetime(1970, 1, 1, tzinfo=UTC)  # no record is older
    with kernel.store.read() as tx:
        assert tx.rollup_hours(datetime(1970, 1, 1, tzinfo=UTC), clock.now()) == {since, since + timedelta(hours=1)}
    far = audit.count_decisions(kernel, DecisionQuery(), since, datetime(9999, 12, 31, tzinfo=UTC))
    assert sum(sum(b.values()) for b in far.buckets) == 2


def test_the_inbox_pages_every_pending_approval_both_ways_in_either_order_with_filters_and_counts(
    kernel: Kernel, running: Running, clock: ManualClock
) -> None:
    # Before: the inbox read the oldest 200 and said "200+"; the rest could not be reached.
    from kernel.core import inbox
    from kernel.core.approvals import Principal
    from kernel.domain import ApprovalConfig

    asked = []  # (approval id, target), oldest first
    for i in range(13):
        approvers = ("alice",) if i % 3 else ("bob",)
        kernel.policy = FixedPolicy(Decision(Verdict.REQUIRE_APPROVAL, "ask", approval=ApprovalConfig(approvers)))
        eid, did, att = running.start()
        target = f"pay_{i % 2}"
        asked.append((steps.submit_step(kernel, Lease("shell", eid, did, att), req(target=target)).approval_id, target))
        if i % 4:
            clock.advance(1)  # some share a created_at: the id breaks the tie
    alice = Principal(name="alice", scopes=frozenset({"approvals:read", "approvals:write"}), key_id="k-alice")

    def walk(q: inbox.InboxQuery) -> tuple[list[str], list[str]]:
        """Every page forward, then every page back from the last: the ids in page order."""
        pages = [inbox.inbox(kernel, q, alice)]
        while pages[-1].next_cursor:
            pages.append(inbox.inbox(kernel, replace(q, after=pages[-1].next_cursor), alice))
        back = [pages[-1]]
        while back[-1].prev_cursor:
            back.append(inbox.inbox(kernel, replace(q, before=back[-1].prev_cursor), alice))
        return ([it.approval.id for p in pages for it in p.pending],
                [it.approval.id for p in reversed(back) for it in p.pending])

    for q, expected in [
        (inbox.InboxQuery(limit=4), [a for a, _ in asked]),
        (inbox.InboxQuery(limit=4, newest_first=True), [a for a, _ in reversed(asked)]),
        (inbox.InboxQuery(limit=3, target="pay_1"), [a for a, target in asked if target == "pay_1"]),
        (inbox.InboxQuery(limit=2, mine=True), [a for i, (a, _) in enumerate(asked) if i % 3]),
        (inbox.InboxQuery(limit=5, mine=True, newest_first=True), [a for i, (a, _) in reversed(list(enumerate(asked))) if i % 3]),
    ]:
        forward, backward = walk(q)
        assert forward == expected and backward == expected, q
    box = inbox.inbox(kernel, inbox.InboxQuery(target="pay_0"), alice)
    assert box.per_agent == {"shell": 13} and box.matching == 7
    refused = {it.approval.id: it.refusal for it in inbox.inbox(kernel, inbox.InboxQuery(), alice).pending}
    assert refused[asked[0][0]] == "only bob may decide this; you are alice" and refused[asked[1][0]] is None


def test_the_executions_page_finds_an_id_prefix_and_pages_back_to_the_newest(kernel: Kernel, store: SqlStore) -> None:
    # Oracle: str.startswith over every id. The prefixes end in every kind of character the
    # range bound handles (a digit, 9, f, a hyphen, an f carrying into a hyphen).
    base = kernel.clock.now()
    ids = ["0193f0ff-0000-7000-8000-000000000001", "0193f0ff-ffff-7000-8000-000000000002",
           "0193f100-0000-7000-8000-000000000003", "01940000-0000-7000-8000-000000000004",
           "0199ffff-0000-7000-8000-000000000005", "019a0000-0000-7000-8000-000000000006"]
    from kernel.core.agents import register_agent
    from kernel.domain import Execution, ExecutionStatus

    register_agent(kernel, "shell", "http://127.0.0.1:9/webhook", "s3cret", None, keep_policy=True)
    with store.transaction() as tx:
        for i, eid in enumerate(ids):
            tx.insert_execution(Execution(id=eid, agent_id="shell", input=None, status=ExecutionStatus.RUNNING,
                                          created_at=base, updated_at=base + timedelta(seconds=i)))
    for prefix in ("0193f0ff-", "0193f0ff-f", "0193f0f", "0193f1", "0199", "0199f", "019", "01940000-0000-7000-8000-00000000000",
                   ids[3], "0193F0FF"):
        page = timeline.execution_page(kernel, agent_id=None, status=None, created_from=None, created_to=None,
                                       cursor=None, limit=50, id_starts=prefix)
        assert [e.id for e in page.executions] == sorted((x for x in ids if x.startswith(prefix.lower())), reverse=True), prefix
    first = timeline.execution_page(kernel, agent_id=None, status=None, created_from=None, created_to=None,
                                    cursor=None, limit=4)
    older = timeline.execution_page(kernel, agent_id=None, status=None, created_from=None, created_to=None,
                                    cursor=first.next_cursor, limit=4)
    assert [e.id for e in older.executions] == sorted(ids, reverse=True)[4:] and older.next_cursor is None
    back = timeline.execution_page(kernel, agent_id=None, status=None, created_from=None, created_to=None,
                                   cursor=None, newer_than=older.prev_cursor, limit=4)
    assert [e.id for e in back.executions] == [e.id for e in first.executions] and back.prev_cursor is None


def test_a_status_count_stops_one_past_the_cap_and_reads_as_more_than_it(
        kernel: Kernel, running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "COUNT_CAP", 2)
    for _ in range(4):
        running.start()
    page = timeline.execution_page(kernel, agent_id=None, status=None, created_from=None, created_to=None,
                                   cursor=None, limit=10)
    assert page.counts == {"running": 3} and page.count_cap == 2
    assert len(page.executions) == 4
