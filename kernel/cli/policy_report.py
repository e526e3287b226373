"""How `regent policy test` shows its results: pretty (rich), JSON and JUnit XML; pure rendering."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kernel.policy.cases import CaseResult, Report
from kernel.policy.testing import LoadedBundle, RegoTestResult

_NOT_RULES = {"default", "bundle-error", "eval-error", "local", ""}
_COLOUR = {"pass": "green", "fail": "red", "error": "red", "skip": "yellow", "xfail": "yellow", "xpass": "red"}


def stdout_console() -> Console:
    """A terminal gets rich's own width; a pipe or file gets whole lines (nothing truncated)."""
    return Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)


@dataclass
class Suite:
    bundle: LoadedBundle
    report: Report
    line_coverage: dict[str, Any] | None = None


@dataclass
class Run:
    suites: list[Suite] = field(default_factory=list)
    loaded: list[LoadedBundle] = field(default_factory=list)
    rego: list[RegoTestResult] = field(default_factory=list)
    # Each Rego bundle's line coverage (its cases and unit tests together), under --coverage.
    line_reports: list[tuple[LoadedBundle, dict[str, Any]]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(len(s.report.results) for s in self.suites) + len(self.rego)

    @property
    def failed(self) -> int:
        return sum(s.report.failed for s in self.suites) + sum(1 for x in self.rego if not x.passed)

    def rule_coverage(self) -> dict[str, Any]:
        rules = covered = 0
        for s in self.suites:
            ran = {x.rule_id for x in s.report.results if x.outcome != "skip"}
            n = len(s.report.unexercised_rules) + len(ran - _NOT_RULES)
            rules += n
            covered += n - len(s.report.unexercised_rules)
        return {"rules": rules, "covered": covered, "percent": 100.0 * covered / rules if rules else 100.0}

    def line_coverage(self) -> dict[str, Any] | None:
        """Every Rego bundle's line coverage together, in OPA's shape (None without --coverage)."""
        reports = [r for _, r in self.line_reports]
        if not reports:
            return None
        files: dict[str, Any] = {}
        for r in reports:
            files.update(r["files"])
        cov = sum(f["covered_lines"] for f in files.values())
        nots = sum(f["not_covered_lines"] for f in files.values())
        total = cov + nots
        out = {"files": files, "covered_lines": cov, "not_covered_lines": nots,
               "coverage": round(100.0 * cov / total, 2) if total else 100.0}
        errors = [f"{b.path}: {e}" for b, r in self.line_reports for e in r.get("errors", [])]
        if errors:  # the figures are incomplete: say so in JSON too, not only in the pretty output
            out["errors"] = errors
        return out


# -- JSON -------------------------------------------------------------------------------------------


def render_json(run: Run) -> str:
    doc: dict[str, Any] = {
        "suites": [_suite_json(s) for s in run.suites],
        "rego_tests": [_rego_json(x) for x in run.rego],
        "shadowed": [{"bundle": str(b.path), "rule_id": r, "shadowed_by": by} for b in run.loaded for r, by in b.shadowed],
        "coverage": run.rule_coverage(),
        "failed": run.failed,
        "total": run.total,
    }
    lines = run.line_coverage()
    if lines is not None:
        doc["line_coverage"] = lines
    return json.dumps(doc, indent=2)


def _suite_json(s: Suite) -> dict[str, Any]:
    results = []
    for x in s.report.results:
        row: dict[str, Any] = {"name": x.case.name, "target": x.case.target, "kind": x.case.kind,
                               "decision": x.decision, "rule_id": x.rule_id, "pass": x.passed, "status": x.outcome}
        if x.case.line:
            row["line"] = x.case.line
        for key in ("agent_id", "expect", "expect_rule", "expect_reason"):
            if getattr(x.case, key):
                row[key] = getattr(x.case, key)
        if x.case.args is not None:
            row["args"] = x.case.args
        if x.reason:
            row["reason"] = x.reason
        if x.failure:
            row["failure"] = x.failure
        results.append(row)
    body: dict[str, Any] = {"bundle": str(s.bundle.path), "kind": s.bundle.kind, "cases": s.report.source,
                            "results": results, "failed": s.report.failed, "skipped": s.report.skipped}
    if s.report.unexercised_rules:
        body["unexercised_rules"] = s.report.unexercised_rules
    if s.line_coverage is not None:
        body["line_coverage"] = s.line_coverage
    return body


def _rego_json(x: RegoTestResult) -> dict[str, Any]:
    row: dict[str, Any] = {"file": x.file, "name": x.name, "status": x.status}
    if x.line:
        row["line"] = x.line
    if x.message:
        row["message"] = x.message
    return row


# -- JUnit ------------------------------------------------------------------------------------------


def render_junit(run: Run) -> str:
    """JUnit XML with the declaration, `time` on suites and cases, and each case's `file`/`line`
    (what CI annotators use to jump to it)."""
    root = ET.Element("testsuites", tests=str(run.total), failures=str(run.failed))
    total_time = 0.0
    for s in run.suites:
        r = s.report
        took = sum(x.seconds for x in r.results)
        total_time += took
        suite = ET.SubElement(root, "testsuite", name=str(s.bundle.path), tests=str(len(r.results)),
                              failures=str(r.failed), errors="0", skipped=str(r.skipped), time=f"{took:.6f}")
        if r.source:
            suite.set("file", r.source)
        for x in r.results:
            _case_element(suite, s.bundle.path, r.source, x)
    by_file: dict[str, list[RegoTestResult]] = {}
    for t in run.rego:
        by_file.setdefault(t.file, []).append(t)
    for file, ts in by_file.items():
        took = sum(t.seconds for t in ts)
        total_time += took
        suite = ET.SubElement(root, "testsuite", name=file, tests=str(len(ts)),
                              failures=str(sum(t.status == "fail" for t in ts)),
                              errors=str(sum(t.status == "error" for t in ts)),
                              skipped=str(sum(t.status == "skip" for t in ts)), time=f"{took:.6f}", file=file)
        for t in ts:
            tc = ET.SubElement(suite, "testcase", classname=Path(file).stem, name=t.name, file=file,
                               time=f"{t.seconds:.6f}")
            if t.line:
                tc.set("line", str(t.line))
            if t.status in ("fail", "error"):
                ET.SubElement(tc, "failure" if t.status == "fail" else "error", message=t.message)
            elif t.status == "skip":
                ET.SubElement(tc, "skipped", message="todo test")
    root.set("time", f"{total_time:.6f}")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")


def _case_element(suite: ET.Element, bundle: Path, source: str, x: CaseResult) -> None:
    tc = ET.SubElement(suite, "testcase", classname=bundle.stem, name=_label(x, True),
                       time=f"{x.seconds:.6f}")
    if source:
        tc.set("file", source)
    if x.case.line:
        tc.set("line", str(x.case.line))
    outcome = x.outcome
    if outcome in ("fail", "xpass"):
        f = ET.SubElement(tc, "failure", message=x.failure)
        f.text = f"decision {x.decision} by rule {x.rule_id}"
    elif outcome == "skip":
        ET.SubElement(tc, "skipped", message=x.reason or "skipped")
    elif outcome == "xfail":
        ET.SubElement(tc, "skipped", message=f"xfail: {x.case.xfail.reason if x.case.xfail else ''}".rstrip(": "))


# -- pretty -----------------------------------------------------------------------------------------


def render_pretty(run: Run, out: Console, *, full_labels: bool) -> None:
    for s in run.suites:
        _pretty_suite(s, out, full_labels)
    _pretty_rego(run.rego, out)
    for b in run.loaded:
        for rule, by in b.shadowed:
            out.print(f"  {b.path}: rule {rule} never matches: shadowed by rule {by}", style="yellow", markup=False)
    cov = run.rule_coverage()
    out.print(f"  rule coverage {cov['percent']:.1f}% ({cov['covered']} of {cov['rules']} rules)")
    lines = run.line_coverage()
    if lines is not None:
        total = lines["covered_lines"] + lines["not_covered_lines"]
        out.print(f"  line coverage {lines['coverage']:.1f}% ({lines['covered_lines']} of {total} Rego lines)")
        for bundle, report in run.line_reports:
            for problem in report.get("errors", []):
                out.print(f"    {bundle.path}: line coverage incomplete: {problem}", style="yellow", markup=False)
        for file, entry in lines["files"].items():
            missing = ", ".join(_span(r) for r in entry.get("not_covered", []))
            if missing:
                out.print(f"    {file}: {entry['coverage']:.1f}%, not covered: lines {missing}", highlight=False)


def _span(r: dict[str, dict[str, int]]) -> str:
    a, b = r["start"]["row"], r["end"]["row"]
    return str(a) if a == b else f"{a}-{b}"


def _label(x: CaseResult, full: bool) -> str:
    if x.case.name:
        return str(x.case.name)
    label = x.case.target
    if x.case.args:
        label += " " + json.dumps(x.case.args, separators=(",", ":"), sort_keys=True)
    return label if full or len(label) <= 56 else label[:55] + "…"


def _pretty_suite(s: Suite, out: Console, full: bool) -> None:
    r = s.report
    t = Table(title=str(s.bundle.path), show_header=False, box=None, padding=(0, 2))
    for _ in range(4):
        t.add_column(no_wrap=full, overflow="fold")
    order = {"fail": 0, "xpass": 0, "pass": 1, "xfail": 2, "skip": 3}
    for x in sorted(r.results, key=lambda x: order[x.outcome]):
        outcome = x.outcome
        status = f"[{_COLOUR[outcome]}]{outcome.upper()}[/]"
        if outcome == "skip":
            detail = x.reason or "skipped"
        elif x.failure:
            detail = x.failure
        else:
            detail = x.decision
        where = f"{r.source}:{x.case.line}" if r.source and x.case.line and not x.passed else ""
        t.add_row(status, Text(_label(x, full)), Text(detail), Text(x.rule_id or where))
    out.print(t)
    if r.unexercised_rules:
        out.print(f"  rules never exercised: {', '.join(r.unexercised_rules)}")
    n = len(r.results)
    skipped = f", {r.skipped} skipped or xfail" if r.skipped else ""
    out.print(f"  {r.failed} of {n} cases failed{skipped}" if r.failed else f"  {n} cases passed{skipped}")
    out.print()


def _pretty_rego(rego: list[RegoTestResult], out: Console) -> None:
    if not rego:
        return
    t = Table(title="Rego unit tests", show_header=False, box=None, padding=(0, 2))
    for x in sorted(rego, key=lambda x: x.passed):
        t.add_row(f"[{_COLOUR[x.status]}]{x.status.upper()}[/]", Text(x.name), Text(x.message),
                  Text(f"{x.file}:{x.line}" if x.line else x.file))
    out.print(t)
    bad = sum(1 for x in rego if not x.passed)
    out.print(f"  {bad} of {len(rego)} Rego tests failed" if bad else f"  {len(rego)} Rego tests passed")
    out.print()
