"""Line coverage of a Rego bundle over a case run, in OPA's `opa test --coverage` shape.

Each case is evaluated once, on the bundle's instrumented twin (in a worker), which answers the
decision and the probes that held; lines are then marked per distinct probe set and merged.
"""

from __future__ import annotations

from typing import Any

from kernel.domain.decision import Decision, PolicyInput
from kernel.policy.rego.document import input_document
from kernel.policy.rego.instrument import LineCoverage
from kernel.policy.rego.trace import traced_evaluate

__all__ = ["RegoLineCoverage"]


class RegoLineCoverage:
    """Pass ``evaluate`` to `run_cases`; read ``report()`` afterwards."""

    def __init__(self, compiled: Any) -> None:  # a resolver.RegoCompiled
        self.engine = compiled.engine
        self.bundle = compiled.bundle
        self.coverage = LineCoverage()
        self.errors: list[str] = []
        self._seen: set[frozenset[str]] = set()
        self._probes = self.bundle.instrumented[1]
        self.coverage.merge(self._probes.line_coverage(set()))  # every line, none covered yet

    def evaluate(self, inp: PolicyInput) -> Decision:
        traced = traced_evaluate(self.engine, self.bundle, input_document(inp))
        if traced.error and len(self.errors) < 5:
            self.errors.append(traced.error)
        key = frozenset(traced.hits)
        if key not in self._seen:
            self._seen.add(key)
            self.coverage.merge(self._probes.line_coverage(traced.hits))
        return traced.decision

    def report(self) -> dict[str, Any]:
        display = {path: self.bundle.display_path(path) for path in self.bundle.modules}
        report = self.coverage.report(display)
        skipped = {self.bundle.display_path(p): why for p, why in self._probes.skipped.items()}
        if skipped:
            report["not_measured"] = skipped
        if self.errors:  # the twin did not load or a probe failed: these figures are incomplete
            report["errors"] = self.errors
        return report
