"""The reliability suite's verdicts (reliability/report.py): a check holds on a known open defect
only when every one of its failed cases is known; anything else still fails the run."""

from __future__ import annotations

from reliability.report import Outcome, apply_known

KNOWN = [("lone surrogate", "tracked elsewhere")]


def _outcome(*items: str) -> Outcome:
    o = Outcome("R3", "fuzz")
    o.check("a clear 4xx each", not items, "", items=list(items))
    return o


def test_a_check_whose_every_failure_is_known_holds_and_says_why() -> None:
    o = _outcome("lone surrogate in input → 500")
    apply_known([o], KNOWN)
    assert o.ok
    assert o.checks[0].known == ["lone surrogate in input → 500 (tracked elsewhere)"]


def test_one_unknown_failure_still_fails_the_check_and_is_named() -> None:
    o = _outcome("lone surrogate in input → 500", "path traversal → 404 without the envelope")
    apply_known([o], KNOWN)
    assert not o.ok
    assert "path traversal" in o.checks[0].detail and "lone surrogate" not in o.checks[0].detail


def test_a_failed_check_without_cases_is_never_excused() -> None:
    o = Outcome("R1", "crash")
    o.check("every one completed", False, "3 running")
    apply_known([o], [("", "matches everything")])
    assert not o.ok


def test_a_skipped_scenario_is_not_a_pass() -> None:
    o = Outcome("R2", "replicas", skipped="no PostgreSQL")
    assert not o.ok
