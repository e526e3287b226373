"""Line coverage of a Rego bundle over a case run and its unit tests, in OPA's `opa test --coverage`
shape.

Each case is evaluated once, on the bundle's instrumented twin (in a worker), which answers the
decision and the probes that held; lines are then marked per distinct probe set and merged. Each
`*_test.rego` file's tests are measured after they ran, on a twin of the bundle with that file
(kernel/policy/rego/testcover.py), in a child process; its lines are reported too, as OPA does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernel.domain.decision import Decision, PolicyInput
from kernel.policy.rego.document import input_document
from kernel.policy.rego.idioms import rewrite_idioms
from kernel.policy.rego.instrument import LineCoverage
from kernel.policy.rego.testcover import instrument_tests
from kernel.policy.rego.trace import Traced, traced_evaluate, traced_evaluate_many

from .rego_tests import RegoTestResult, run_rego_test_coverage

__all__ = ["RegoLineCoverage"]

_NOT_AGAIN = ("the Rego engine crashed", "timed out", "not run")


class RegoLineCoverage:
    """Pass ``evaluate`` to `run_cases`; read ``report()`` afterwards."""

    def __init__(self, compiled: Any) -> None:  # a resolver.RegoCompiled
        self.engine = compiled.engine
        self.bundle = compiled.bundle
        self.coverage = LineCoverage()
        self.errors: list[str] = []
        self._seen: set[frozenset[str]] = set()
        self._probes = self.bundle.instrumented[1]
        self.coverage.merge(self._probes.line_coverage(set(), roots=()))  # every line, none covered yet

    def evaluate(self, inp: PolicyInput) -> Decision:
        return self._record(traced_evaluate(self.engine, self.bundle, input_document(inp)))

    def evaluate_many(self, inputs: list[PolicyInput]) -> list[Decision]:
        """`evaluate` for each input, the probes in batched worker calls."""
        traced = traced_evaluate_many(self.engine, self.bundle, [input_document(i) for i in inputs])
        return [self._record(t) for t in traced]

    def _record(self, traced: Traced) -> Decision:
        if traced.error and len(self.errors) < 5:
            self.errors.append(traced.error)
        key = frozenset(traced.hits)
        if key not in self._seen:
            self._seen.add(key)
            self.coverage.merge(self._probes.line_coverage(traced.hits))
        return traced.decision

    def add_tests(self, test_file: Path, results: list[RegoTestResult], *, strict: bool = False) -> None:
        """Merge the lines that the tests of ``test_file`` which ran (passed, failed or errored;
        not skipped) evaluated."""
        # As the test runner runs it: idioms.py's load-time rewrites applied (lines kept).
        rewrite, key = rewrite_idioms(test_file.read_text(encoding="utf-8")), str(test_file)
        source = rewrite.source
        package = results[0].name.rsplit(".", 1)[0] if results else ""
        # A test that crashed the engine or ran out of time would only do it again; a file the
        # load gate refuses (its tests are ERRORs naming why) has nothing to measure.
        ran = [] if rewrite.problems else [
            r.name[len(package) + 1 :] for r in results
            if r.file == key and r.status != "skip" and not r.message.startswith(_NOT_AGAIN)]
        cover = instrument_tests(dict(self.bundle.runnable_modules), self.bundle.entrypoint, key, source, ran)
        if key in cover.probes.skipped:
            self.errors.append(f"{key}: {cover.probes.skipped[key]}")
        if not ran:  # its lines are still reported, none covered
            self.coverage.merge(cover.coverage({}, None, []))
            return
        coverage, errors = run_rego_test_coverage(cover, self.bundle.data, ran, strict=strict)
        self.coverage.merge(coverage)
        self.errors.extend(errors[: max(0, 5 - len(self.errors))])

    def report(self) -> dict[str, Any]:
        display = {path: self.bundle.display_path(path) for path in self.bundle.modules}
        report = self.coverage.report(display)
        skipped = {self.bundle.display_path(p): why for p, why in self._probes.skipped.items()}
        if skipped:
            report["not_measured"] = skipped
        if self.errors:  # the twin did not load or a probe failed: these figures are incomplete
            report["errors"] = self.errors
        return report
