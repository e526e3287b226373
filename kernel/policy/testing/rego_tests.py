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

_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)", re.M)
_TEST = re.compile(r"^(todo_)?(test_\w+)\b", re.M)
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
    req = {"modules": {**modules, test_file.name: source}, "data": data, "tests": wanted, "strict": strict}
    try:
        proc = subprocess.run([sys.executable, "-m", "kernel.policy.testing.rego_child"], input=json.dumps(req),
                              capture_output=True, text=True, timeout=timeout_seconds, check=False)
        stdout, rc, timed_out = proc.stdout, proc.returncode, False
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or ""
        stdout, rc, timed_out = raw.decode() if isinstance(raw, bytes) else raw, -9, True
    done: dict[str, RegoTestResult] = {}
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
                done[t] = RegoTestResult(str(test_file), t, "error", message, seconds=took)
            elif ev["passed"]:
                done[t] = RegoTestResult(str(test_file), t, "pass", seconds=took)
            else:
                done[t] = RegoTestResult(str(test_file), t, "fail", "undefined or not true", seconds=took)
    by_name = {f"{package}.{name}": lines.get(name, 0) for name, _ in tests}
    done = {t: replace(r, line=by_name.get(t, 0)) for t, r in done.items()}
    for t in wanted:
        if t in done:
            results.append(done[t])
        elif t == running:
            results.append(RegoTestResult(str(test_file), t, "error", _crash(rc, timed_out, timeout_seconds, source),
                                          line=by_name.get(t, 0)))
        elif running or rc != 0:
            results.append(RegoTestResult(str(test_file), t, "error", "not run: the test process died before it",
                                          line=by_name.get(t, 0)))
    return results


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
