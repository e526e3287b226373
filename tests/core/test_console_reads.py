"""The console's read models on both dialects: the executions page with its counts, a timeline's
rows, and the audit chart's counts per time bucket."""

from __future__ import annotations

from datetime import timedelta

from kernel.clock import ManualClock
from kernel.core import decisions, steps, timeline
from kernel.core.decisions import DecisionQuery
from kernel.core.executions import cancel_execution
from kernel.core.kernel import Kernel
from kernel.domain import Decision, Verdict
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
    steps.submit_step(kernel, "shell", eid, did, att, req(target="send_email", args={"to": "a@example.com"}))
    t = timeline.timeline(kernel, eid)
    [row] = [r for r in t.rows if isinstance(r, timeline.StepRow)]
    assert (row.target, row.decision, row.rule_id, row.reason) == ("send_email", "deny", "no-email", "not today")
    assert [e.type for e in row.events] == ["step.proposed", "step.denied"]
    assert row.step is not None and row.step.args == {"to": "a@example.com"}
    assert t.steps == 1 and t.execution_seq == t.last_seq and t.next_seq is None
    paged = timeline.timeline(kernel, eid, after_seq=0, limit=2)
    assert paged.next_seq == 2 and all(not isinstance(r, timeline.StepRow) for r in paged.rows)


def test_decision_counts_fall_in_their_time_buckets_by_outcome(kernel: Kernel, running: Running, clock: ManualClock) -> None:
    since = clock.now()
    eid, did, att = running.start()
    kernel.policy = FixedPolicy(Decision(Verdict.ALLOW, "ok"))
    steps.submit_step(kernel, "shell", eid, did, att, req(target="a"))
    clock.advance(3600 + 1)  # the second hour
    steps.submit_step(kernel, "shell", eid, did, att, req(target="b"))
    kernel.policy = FixedPolicy(Decision(Verdict.DENY, "no"))
    steps.submit_step(kernel, "shell", eid, did, att, req(target="c"))
    counts = decisions.count_decisions(kernel, DecisionQuery(), since, since + timedelta(hours=3), 3)
    assert counts.buckets == [{"allowed": 1}, {"allowed": 1, "denied": 1}, {}]
    only = decisions.count_decisions(kernel, DecisionQuery(decision="denied"), since, since + timedelta(hours=3), 3)
    assert only.buckets == [{}, {"denied": 1}, {}]
    assert decisions.count_decisions(kernel, DecisionQuery(target="a"), since, since + timedelta(hours=2), 24).buckets[0] == {"allowed": 1}
