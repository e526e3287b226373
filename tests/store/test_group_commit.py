"""Group commit on SQLite: the lane's use cases share one write transaction while more of them
wait, and one commit ends it. Every answer is released only once its writes are committed (seen
from another connection), a use case that fails takes only its own writes with it, a commit that
fails fails every use case in it, and a lock held on another thread never deadlocks the lane."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kernel import lane as threads
from kernel.domain import Agent, Step, StepStatus
from kernel.errors import StoreConflict
from kernel.lane import Lane
from kernel.store.migrations import migrate
from kernel.store.sqlite import SqliteStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def grouped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SqliteStore, Lane, Path]]:
    # A group's time bound is 4 ms; on a loaded machine five use cases can take longer, which
    # would split the group these tests build (correctly, but they assert one group).
    monkeypatch.setattr(threads, "GROUP_SECONDS", 30.0)
    path = tmp_path / "regent.db"
    store = SqliteStore(f"sqlite:///{path}")
    migrate(store)
    lane = Lane(threads=1, groups=store.commit_groups(), stuck_after=60.0)  # the gate must not spill the calls
    yield store, lane, path
    lane.close()
    store.close()


def committed_agents(path: Path) -> set[str]:
    """What another connection sees: only committed rows."""
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT id FROM agents")}


def write_agent(store: SqliteStore, agent_id: str, fail: bool = False) -> Callable[[], str]:
    def use_case() -> str:
        with store.transaction(lock=f"exec-{agent_id}") as tx:
            tx.upsert_agent(Agent(id=agent_id, webhook_url="http://127.0.0.1:9/w", secret="s", registered_at=NOW))
            if fail:
                raise ValueError(f"{agent_id} failed")
        return agent_id

    return use_case


def run_behind_a_blocker(lane: Lane, calls: list[Callable[[], Any]], on_answer: Callable[[int], None]
                         ) -> list[Any]:
    """Queue `calls` behind one that waits until they are all queued, so they meet in one group."""
    gate = threading.Event()

    async def scenario() -> list[Any]:
        first = asyncio.ensure_future(lane.call(gate.wait, 10))

        async def one(i: int, fn: Callable[[], Any]) -> Any:
            try:
                out = await lane.call(fn)
            except Exception as exc:
                out = exc
            on_answer(i)
            return out

        tasks = [asyncio.ensure_future(one(i, fn)) for i, fn in enumerate(calls)]
        # One loop turn: each task's first step puts its call on the lane's queue, behind the gate.
        await asyncio.sleep(0)
        gate.set()
        await first
        return list(await asyncio.gather(*tasks))

    return asyncio.run(scenario())


def test_queued_use_cases_share_one_commit_and_answer_only_once_it_is_done(grouped: Any) -> None:
    store, lane, path = grouped
    names = [f"agent-{i}" for i in range(5)]
    seen_at_answer: dict[int, set[str]] = {}

    answers = run_behind_a_blocker(lane, [write_agent(store, n) for n in names],
                                   lambda i: seen_at_answer.setdefault(i, committed_agents(path)))

    assert answers == names
    # Each answer came once its own row was committed, and the first once every row of the
    # group was: one commit for all.
    assert all(names[i] in seen for i, seen in seen_at_answer.items())
    assert seen_at_answer[0] == set(names)


def test_a_use_case_that_fails_in_a_group_takes_only_its_own_writes_with_it(grouped: Any) -> None:
    store, lane, path = grouped
    calls = [write_agent(store, "a"), write_agent(store, "b", fail=True), write_agent(store, "c")]

    answers = run_behind_a_blocker(lane, calls, lambda i: None)

    assert answers[0] == "a" and answers[2] == "c"
    assert isinstance(answers[1], ValueError)
    assert committed_agents(path) == {"a", "c"}


def test_a_commit_that_fails_fails_every_use_case_of_its_group(grouped: Any) -> None:
    store, lane, path = grouped

    def orphan_step() -> str:
        # A step of an execution that does not exist, its foreign key checked only at COMMIT.
        with store.transaction(lock="exec-orphan") as tx:
            tx.w.exec_driver_sql("PRAGMA defer_foreign_keys=ON")
            tx.insert_step(Step(step_id="f" * 64, execution_id="0190c2d0-0000-7000-8000-000000000000", kind="tool_call",
                                target="t", args_hash="0" * 64, occurrence=0, status=StepStatus.EXECUTING,
                                idempotency="safe_to_retry"), "null")
        return "orphan"

    answers = run_behind_a_blocker(lane, [write_agent(store, "a"), orphan_step, write_agent(store, "b")],
                                   lambda i: None)

    assert all(isinstance(a, StoreConflict) for a in answers), answers
    assert committed_agents(path) == set()
    # The lane goes on: the next use case commits on its own.
    assert asyncio.run(lane.call(write_agent(store, "after"))) == "after"
    assert committed_agents(path) == {"after"}


def test_after_commit_callbacks_run_once_the_group_has_committed(grouped: Any) -> None:
    store, lane, path = grouped
    ran: list[tuple[str, set[str]]] = []

    def with_callback(agent_id: str) -> Callable[[], str]:
        def use_case() -> str:
            write_agent(store, agent_id)()
            store.after_commit(lambda: ran.append((agent_id, committed_agents(path))))
            return agent_id

        return use_case

    run_behind_a_blocker(lane, [with_callback("a"), with_callback("b")], lambda i: None)

    assert [name for name, _ in ran] == ["a", "b"]
    assert all(seen == {"a", "b"} for _, seen in ran)


def test_a_lock_held_on_another_thread_does_not_deadlock_the_lane(grouped: Any) -> None:
    """Another thread holds execution X's lock and waits for the write lock, which the lane's
    open group holds; the lane's next use case wants X: the group commits first."""
    store, lane, path = grouped
    holding, group_open = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            with store.transaction(lock="exec-x") as tx:
                holding.set()
                group_open.wait(10)
                tx.upsert_agent(Agent(id="other", webhook_url="http://127.0.0.1:9/w", secret="s", registered_at=NOW))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    assert holding.wait(10)

    def opens_group() -> str:
        out = write_agent(store, "first")()
        group_open.set()
        return out

    def wants_x() -> str:
        with store.transaction(lock="exec-x") as tx:
            tx.upsert_agent(Agent(id="second", webhook_url="http://127.0.0.1:9/w", secret="s", registered_at=NOW))
        return "second"

    answers = run_behind_a_blocker(lane, [opens_group, wants_x], lambda i: None)
    t.join(10)

    assert not t.is_alive() and not errors
    assert answers == ["first", "second"]
    assert committed_agents(path) == {"first", "other", "second"}


def test_the_same_execution_twice_in_a_row_sees_its_first_use_case_committed(grouped: Any) -> None:
    store, lane, path = grouped
    seen: list[set[str]] = []

    def second() -> str:
        with store.transaction(lock="exec-a") as tx:
            seen.append(committed_agents(path))
            tx.upsert_agent(Agent(id="a2", webhook_url="http://127.0.0.1:9/w", secret="s", registered_at=NOW))
        return "a2"

    answers = run_behind_a_blocker(lane, [write_agent(store, "a"), second], lambda i: None)

    assert answers == ["a", "a2"]
    assert seen == [{"a"}]  # the group committed before the second took the execution's lock
    assert committed_agents(path) == {"a", "a2"}


def test_reads_on_the_lane_see_the_open_groups_writes(grouped: Any) -> None:
    store, lane, _ = grouped

    def reads_back() -> bool:
        write_agent(store, "mine")()
        with store.read() as tx:
            return tx.get_agent("mine") is not None

    assert run_behind_a_blocker(lane, [write_agent(store, "x"), reads_back], lambda i: None) == ["x", True]
