"""Rego unit tests (`test_*` rules in `*_test.rego`, `todo_test_*` skipped), one child process per
file with a timeout: a child killed by a signal is an ERROR for the test it was running."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kernel.policy.rego.idioms import rewrite_idioms
from kernel.policy.rego.instrument import LineCoverage
from kernel.policy.rego.pool import regopy_path
from kernel.policy.rego.testcover import TestProbes
from kernel.policy.rego.v0_syntax import v1_problems

from .explain import plan_explanations

_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)", re.M)
_TEST = re.compile(r"^(todo_)?(test_\w+)\b", re.M)
CHILD_SCRIPT = str(Path(__file__).with_name("rego_child.py"))
WITH_INPUT_HINT = ("likely the regopy segfault on `with input as {...}` (use `with input.<field> as ...` "
                   "instead; see docs/testing-policies.md)")


@dataclass(frozen=True, slots=True)
class RegoTestResult:
    file: str
    name: str  # package.test_rule
    status: str  # pass | fail | error | skip
    message: str = ""
    line: int = 0
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status in ("pass", "skip")


def find_tests(source: str) -> tuple[str, list[tuple[str, bool]]]:
    """(package, [(rule, is_todo)]) in file order, each rule once."""
    m = _PACKAGE.search(source)
    package = m.group(1) if m else ""
    seen: dict[str, bool] = {}
    for todo, name in _TEST.findall(source):
        seen.setdefault(name, bool(todo))
    return package, list(seen.items())


def test_lines(source: str) -> dict[str, int]:
    """Each test rule's first line (JUnit's `line`)."""
    lines: dict[str, int] = {}
    for m in _TEST.finditer(source):
        lines.setdefault(m.group(2), source.count("\n", 0, m.start()) + 1)
    return lines


def run_rego_test_file(test_file: Path, modules: dict[str, str], data: dict[str, Any], *,
                       run: re.Pattern[str] | None = None, timeout_seconds: float = 30.0,
                       strict: bool = False) -> list[RegoTestResult]:
    source = test_file.read_text(encoding="utf-8")
    package, tests = find_tests(source)
    results: list[RegoTestResult] = []
    wanted = []
    lines = test_lines(source)
    for name, todo in tests:
        full = f"{package}.{name}"
        if run is not None and not run.search(full):
            continue
        if todo:
            results.append(RegoTestResult(str(test_file), f"{package}.todo_{name}", "skip", line=lines.get(name, 0)))
        else:
            wanted.append(full)
    if not wanted:
        return results
    by_name = {f"{package}.{name}": lines.get(name, 0) for name, _ in tests}
    refused = [f"{test_file}:{line}:{col}: {message}" for line, col, message in v1_problems(source)]
    refused += [f"{test_file}:{line}:{col}: {message}" for line, col, message in rewrite_idioms(source).problems]
    if refused:  # as the load gate refuses a bundle module that OPA v1 and rego-cpp read differently
        return results + [RegoTestResult(str(test_file), t, "error", refused[0], line=by_name.get(t, 0))
                          for t in wanted]
    source = rewrite_idioms(source).source
    req = {"modules": {**modules, test_file.name: source}, "data": data, "tests": wanted, "strict": strict}
    stdout, rc, timed_out, _ = _child(req, timeout_seconds)
    done: dict[str, RegoTestResult] = {}
    running = _read_results(stdout, str(test_file), done)
    # A test that kills the engine is an ERROR for that test; the rest of the file is not run (a
    # fresh child would not help: rego-cpp then crashes on every test of the module).
    if running:
        done[running] = RegoTestResult(str(test_file), running, "error", _crash(rc, timed_out, timeout_seconds, source))
    if running or rc != 0:
        for t in wanted:
            done.setdefault(t, RegoTestResult(str(test_file), t, "error", "not run: the test process died before it"))
    failing = [t for t in wanted if t in done and done[t].status == "fail"]
    if failing:
        _explain(done, failing, req, source, package, str(test_file), timeout_seconds)
    results += [replace(done[t], line=by_name.get(t, 0)) for t in wanted if t in done]
    return results


def _explain(done: dict[str, RegoTestResult], failing: list[str], req: dict[str, Any], source: str,
             package: str, file: str, timeout_seconds: float) -> None:
    """Name each failing test's first false or undefined expression (explain.py), in a child of
    its own: a query that crashes it costs the explanations, never the results."""
    plan = plan_explanations(source, package, failing)
    if not plan.queries:
        return
    modules = {**req["modules"], file.rsplit("/", 1)[-1]: plan.source}
    cov = {"modules": modules, "queries": plan.queries}
    stdout, _, _, _ = _child({"data": req["data"], "strict": req["strict"], "coverage": cov}, timeout_seconds)
    answers: dict[str, Any] = {}
    for line in stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("defined") and "cov" in ev:
            answers[ev["cov"]] = ev.get("value")
    for t in failing:
        why = plan.message(t, file, answers)
        if why:
            done[t] = replace(done[t], message=why)


def _read_results(stdout: str, file: str, done: dict[str, RegoTestResult]) -> str:
    """Record the child's finished tests in ``done``; returns the test it was running when its
    output stopped ("" when none)."""
    running = ""
    for line in stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if "start" in ev:
            running = ev["start"]
        elif "done" in ev:
            t = ev["done"]
            running = ""
            took = float(ev.get("seconds") or 0.0)
            if "error" in ev:
                message = ev["error"].strip().splitlines()[0][:300] if ev["error"].strip() else "rego error"
                done[t] = RegoTestResult(file, t, "error", message, seconds=took)
            elif ev["passed"]:
                done[t] = RegoTestResult(file, t, "pass", seconds=took)
            else:
                done[t] = RegoTestResult(file, t, "fail", "undefined or not true", seconds=took)
    return running


def _child(req: dict[str, Any], timeout_seconds: float) -> tuple[str, int, bool, str]:
    """Run rego_child.py on ``req``: (stdout, return code, timed out, last line of stderr)."""
    try:
        proc = subprocess.run([sys.executable, "-s", "-S", "-P", CHILD_SCRIPT], input=json.dumps(req),
                              capture_output=True, text=True, timeout=timeout_seconds, check=False,
                              env={"PYTHONPATH": regopy_path()})
        tail = proc.stderr.strip().splitlines()
        return proc.stdout, proc.returncode, False, tail[-1][:300] if tail else ""
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or ""
        return raw.decode() if isinstance(raw, bytes) else raw, -9, True, ""


def run_rego_test_coverage(cover: TestProbes, data: dict[str, Any], ran: list[str], *,
                           timeout_seconds: float = 30.0, strict: bool = False) -> tuple[LineCoverage, list[str]]:
    """The lines the tests ``ran`` (rule names) evaluate, from the file's coverage twin, in a child
    process of its own (after the tests: their results never depend on it); and what could not be
    measured. A query that crashes the child costs that test's coverage only: the rest run again
    in a fresh child."""
    queries = [[t, cover.query_for(t)] for t in ran if cover.queries.get(t)]
    queries.append(["", cover.test_hits])
    answers: dict[str, Any] = {}
    test_hits: list[str] | None = None
    errors: list[str] = []
    while queries:
        req = {"data": data, "strict": strict, "coverage": {"modules": cover.modules, "queries": queries}}
        stdout, rc, timed_out, tail = _child(req, timeout_seconds)
        finished: set[str] = set()
        running = None
        for line in stdout.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if "cov_start" in ev:
                running = ev["cov_start"]
            elif "cov" in ev:
                name, running = ev["cov"], None
                finished.add(name)
                label = f"{cover.package}.{name}" if name else "the test file's own lines"
                if "error" in ev:
                    errors.append(f"{cover.test_path}: {label}: {ev['error']}")
                elif not name:
                    test_hits = ev["value"] if isinstance(ev["value"], list) else None
                elif isinstance(ev["value"], dict):
                    answers.update(ev["value"])
        rest = [q for q in queries if q[0] not in finished]
        if not rest:
            break
        if running is None:  # died before or between queries: nothing to blame, stop
            why = _crash(rc, timed_out, timeout_seconds, "") + (f": {tail}" if tail else "")
            errors.append(f"{cover.test_path}: the coverage process ended early ({why})")
            break
        label = f"{cover.package}.{running}" if running else "the test file's own lines"
        errors.append(f"{cover.test_path}: {label}: not measured: {_crash(rc, timed_out, timeout_seconds, '')}")
        queries = [q for q in rest if q[0] != running]
    return cover.coverage(answers, test_hits, ran), errors


def _crash(rc: int, timed_out: bool, timeout_seconds: float, source: str) -> str:
    if timed_out:
        return f"timed out after {timeout_seconds:g} s"
    try:
        sig = signal.Signals(-rc).name if rc < 0 else f"exit status {rc}"
    except ValueError:
        sig = f"signal {-rc}"
    msg = f"the Rego engine crashed ({sig})"
    if re.search(r"with\s+input\s+as\s*\{", source):
        msg += f": {WITH_INPUT_HINT}"
    return msg
