"""Rego traces, line coverage and runtime-error locations, read from the instrumented twin.

`instrument.py` builds the twin and says how to read its probes; this module asks a `RegoEngine`
to evaluate them (in a worker) and turns the answers into the explain document, OPA-shaped line
coverage and a `file:line (rule …)` for an evaluation that errored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from kernel.domain.decision import Decision, PolicyInput

from .bundle import RegoBundle
from .decision import _VERDICT_RANK, decision_from_output
from .document import input_document
from .instrument import Instrumented

__all__ = ["ProbeError", "Prober", "Traced", "decision_json", "explain_rego", "locate_error", "traced_evaluate",
           "traced_evaluate_many"]

_CONFLICT_CODES = ("eval_conflict_error", "multiple outputs", "must not produce")


class ProbeError(Exception):
    """A probe could not run (the bundle did not load, or the worker faulted)."""


class Prober(Protocol):
    """What this module needs of an engine (`engine.RegoEngine` is one): the engine imports this
    module, never the other way round."""

    def probe(self, bundle: RegoBundle, document: dict[str, Any], entrypoints: list[str]) -> list[dict[str, Any]]:
        """Several entrypoints of ``bundle`` on one input; raises ProbeError."""
        ...

    def probe_many(self, bundle: RegoBundle, documents: list[dict[str, Any]],
                   entrypoint: str) -> list[dict[str, Any]] | None:
        """One entrypoint on each document, batched; None: probe them one by one instead."""
        ...

    def evaluate_document(self, bundle: RegoBundle, document: dict[str, Any]) -> Decision: ...

    def explain(self, bundle: RegoBundle, inp: PolicyInput) -> tuple[Decision, str]: ...


def decision_json(d: Decision) -> dict[str, Any]:
    """A Decision as plain JSON (the explain document and `--format json`)."""
    out: dict[str, Any] = {"decision": d.verdict.value, "rule_id": d.rule_id}
    if d.reason:
        out["reason"] = d.reason
    if d.approval is not None:
        out["approval_config"] = {"approvers": list(d.approval.approvers),
                                  "timeout_seconds": d.approval.timeout_seconds, "message": d.approval.message}
    if d.rate_limit is not None:
        r = d.rate_limit
        out["rate_limit"] = {"max_calls": r.max_calls, "window_seconds": r.window_seconds, "per_what": r.per_what,
                             "max_wait_seconds": r.max_wait_seconds, "on_limiter_error": r.on_limiter_error}
    if d.budget is not None:
        out["budget"] = {"max_tokens": d.budget.max_tokens, "on_exceed": d.budget.on_exceed}
    out["policy_kind"] = d.policy_kind.value
    out["policy_revision"] = d.policy_revision
    return out


@dataclass
class Traced:
    """One evaluation of the instrumented twin: the decision, the raw value and the probe hits."""

    decision: Decision
    value: Any
    defined: bool
    hits: set[str]
    error: str = ""


def traced_evaluate(engine: Prober, bundle: RegoBundle, document: dict[str, Any]) -> Traced:
    """Evaluate the entrypoint and the probe collector of ``bundle``'s twin in one worker call."""
    twin, probes = bundle.instrumented
    try:
        [combined] = engine.probe(twin, document, [probes.combined])
    except ProbeError as exc:
        return Traced(engine.evaluate_document(bundle, document), None, False, set(), str(exc))
    return _traced(engine, bundle, document, combined)


def traced_evaluate_many(engine: Prober, bundle: RegoBundle, documents: list[dict[str, Any]]) -> list[Traced]:
    """`traced_evaluate` for each document, the twin's probes in batched worker calls."""
    twin, probes = bundle.instrumented
    results = engine.probe_many(twin, documents, probes.combined)
    if results is None:
        return [traced_evaluate(engine, bundle, d) for d in documents]
    return [_traced(engine, bundle, d, r) for d, r in zip(documents, results, strict=True)]


def _traced(engine: Prober, bundle: RegoBundle, document: dict[str, Any], combined: dict[str, Any]) -> Traced:
    result = combined.get("value")
    if not isinstance(result, dict):  # an evaluation error: the plain path says (and locates) it
        return Traced(engine.evaluate_document(bundle, document), None, False, set(),
                      str(combined.get("error", "")))
    hits = set(result.get("hits") or [])
    values = result.get("value") or []
    kind = document.get("kind", "") if isinstance(document, dict) else ""
    defined = bool(values)
    value = values[0] if defined else None
    decision = decision_from_output(value, defined=defined, kind=kind, default_action=bundle.default_action,
                                    revision=bundle.revision, entrypoint=bundle.entrypoint)
    return Traced(decision, value, defined, hits)


def explain_rego(engine: Prober, bundle: RegoBundle, inp: PolicyInput, *,
                 rules: tuple[str, ...] = ()) -> dict[str, Any]:
    """The explain document: the decision, every member of the decision set (overridden ones
    marked), and a trace of each definition of the entrypoint rule and of ``rules`` (rule names
    or rule ids), expression by expression with file:line; plus what print() wrote."""
    document = input_document(inp)
    decision, printed = engine.explain(bundle, inp)
    traced = traced_evaluate(engine, bundle, document)
    probes = bundle.instrumented[1]
    doc: dict[str, Any] = {
        "kind": "rego",
        "entrypoint": "data." + bundle.entrypoint.replace("/", "."),
        "input": document,
        "decision": decision_json(decision),
        "decision_set": _members(traced.value, decision) if traced.defined else [],
    }
    reached = probes.reached(traced.hits)
    entry_package, entry_rule = probes.entrypoint_rule
    wanted = set(rules)
    trace = []
    for path, d in probes.definitions():
        package = probes.module_rules[path].package
        if (package, d.name) == (entry_package, entry_rule) or d.name in wanted or (d.rule_id and d.rule_id in wanted):
            row = probes.trace(traced.hits, path, d, reached)
            row["file"] = bundle.display_path(path)
            trace.append(row)
    doc["trace"] = trace
    if traced.error and decision.rule_id != "eval-error":
        doc["trace_error"] = traced.error
    doc["prints"] = [line for line in printed.splitlines()]
    return doc


def _members(value: Any, decision: Decision) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    members = []
    for item in items:
        if not isinstance(item, dict):
            members.append({"member": item, "selected": False})
            continue
        rid = item.get("rule_id")
        verdict = item.get("decision")
        row: dict[str, Any] = {"rule_id": rid, "decision": verdict, "member": item}
        selected = rid == decision.rule_id and verdict == decision.verdict.value
        row["selected"] = selected
        if not selected and decision.rule_id not in ("eval-error",):
            rank = _VERDICT_RANK.get(decision.verdict)
            mine = next((r for v, r in _VERDICT_RANK.items() if v.value == verdict), None)
            why = "deny-overrides" if rank is not None and mine is not None and rank < mine else "tie on rule_id"
            row["overridden_by"] = {"rule_id": decision.rule_id, "decision": decision.verdict.value, "why": why}
        members.append(row)
    return members


def locate_error(engine: Prober, bundle: RegoBundle, document: dict[str, Any], error: str) -> str:
    """Where an evaluation error comes from, as ``file:line (rule NAME)`` text; "" when the probes
    cannot tell. Runs every probe and rule of the twin separately, so only the error path pays."""
    twin, probes = bundle.instrumented
    names = list(probes.probes)
    rule_eps = list(probes.rule_entrypoints)
    try:
        results = engine.probe(twin, document, [probes.probe_entrypoint(n) for n in names] + rule_eps)
    except ProbeError:
        return ""
    probe_results = dict(zip(names, results[: len(names)], strict=True))
    rule_results = dict(zip(rule_eps, results[len(names) :], strict=True))
    if any(code in error for code in _CONFLICT_CODES):
        found = _conflict(probes, probe_results, bundle)
        if found:
            return found
    return _first_fault(probes, probe_results, rule_results, bundle)


def _conflict(probes: Instrumented, results: dict[str, dict[str, Any]], bundle: RegoBundle) -> str:
    done: dict[tuple[str, str], list[int]] = {}
    for name, (path, index, k) in probes.probes.items():
        if k != 0 or "value" not in results.get(name, {}):
            continue
        d = probes.module_rules[path].rules[index]
        if d.kind == "complete" and not d.chain:
            done.setdefault((path, d.name), []).append(d.line)
    for (path, rule), lines in sorted(done.items()):
        if len(lines) >= 2:
            where = ", ".join(f"{bundle.display_path(path)}:{line}" for line in sorted(lines)[:3])
            return f"{where} (rule {rule}: these definitions all held with different values)"
    return ""


def _first_fault(probes: Instrumented, results: dict[str, dict[str, Any]],
                 rule_results: dict[str, dict[str, Any]], bundle: RegoBundle) -> str:
    failing_rules = {rule for ep, (path, rule) in probes.rule_entrypoints.items() if "error" in rule_results.get(ep, {})}
    candidates: list[tuple[str, int, str, str]] = []  # (path, line, rule, expression text)
    for path, d in probes.definitions():
        if d.kind not in ("complete", "multi") or path in probes.skipped:
            continue
        m = probes._module_index[path]
        n = len(d.body)
        for k in range(1, n + 1):
            name = f"__regent_{m}_{d.index}_{k + 1}" if k < n else f"__regent_{m}_{d.index}_done"
            before = f"__regent_{m}_{d.index}_{k}"
            if "error" in results.get(name, {}) and "error" not in results.get(before, {}):
                expr = d.body[k - 1]
                candidates.append((path, expr.line, d.name, expr.text))
                break
        else:
            done = results.get(f"__regent_{m}_{d.index}_done", {})
            if d.name in failing_rules and "value" in done:
                candidates.append((path, d.line, d.name, "the rule's value"))
    if not candidates:
        return ""
    # The deepest one: an expression that names no other failing rule.
    deepest = next((c for c in candidates if not any(r != c[2] and r in c[3] for r in failing_rules)), candidates[0])
    path, line, rule, text = deepest
    return f"{bundle.display_path(path)}:{line} (rule {rule}: {text})"
