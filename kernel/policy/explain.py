"""The explain document (`regent policy eval --explain`, the console's playground): plain JSON for
both bundle kinds, and the text lines the CLI and the playground print from it.

YAML: every rule in file order, whether it matched and the first condition that failed. Rego:
the entrypoint, the input document, every member of the decision set (those overridden by
deny-overrides marked), a per-expression trace of the entrypoint rule's definitions (and of the
rules asked for) with file:line, and what print() wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kernel.domain import Decision, PolicyInput

__all__ = ["decision_json", "explain_document", "explain_lines"]


def decision_json(d: Decision) -> dict[str, Any]:
    from kernel.policy.rego.trace import decision_json as rego_decision_json

    out = rego_decision_json(d)
    if d.judge_record:
        out["judge"] = d.judge_record
    return out


def explain_document(compiled: Any, inp: PolicyInput, *, explain: bool = True, rules: tuple[str, ...] = (),
                     judge: Callable[[Decision], Decision] | None = None) -> dict[str, Any]:
    """``compiled`` is a YamlBundle or a resolver.RegoCompiled. ``judge`` settles a judge rule's
    decision (a stand-in answer); without it a judge decision shows its fallback."""
    rego = hasattr(compiled, "engine") and hasattr(compiled, "bundle")

    def settle(d: Decision) -> Decision:
        return judge(d) if judge is not None and d.judge is not None else d

    if not rego:
        d = settle(compiled.evaluate(inp))
        doc: dict[str, Any] = {"kind": "yaml", "decision": decision_json(d)}
        if explain:
            doc["rules"] = [_yaml_trace(t) for t in compiled.explain(inp)]
        return doc
    if not explain:
        return {"kind": "rego", "decision": decision_json(settle(compiled.evaluate(inp)))}
    from kernel.policy.rego.trace import explain_rego

    doc = explain_rego(compiled.engine, compiled.bundle, inp, rules=rules)
    if judge is not None:
        d = compiled.evaluate(inp)
        if d.judge is not None:
            doc["decision"] = decision_json(settle(d))
    return doc


def _yaml_trace(t: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"rule_id": t.rule_id, "line": t.line, "matched": t.matched, "selected": t.selected}
    if t.failed:
        row["failed"] = t.failed
        row["detail"] = t.detail
    return row


def explain_lines(doc: dict[str, Any], *, explain: bool = True) -> list[str]:
    """The document as text: the decision line first, then indented detail lines."""
    d = doc["decision"]
    lines = [f"{d['decision']}  {d['rule_id']}" + (f"  {d['reason']}" if d.get("reason") else "")]
    for key in ("approval_config", "rate_limit", "budget"):
        if key in d:
            lines.append(f"{key} {json.dumps(d[key])}")
    if not explain:
        return lines
    if doc["kind"] == "yaml":
        for t in doc["rules"]:
            mark = "→" if t["selected"] else ("✓" if t["matched"] else "✗")
            why = "" if t["matched"] else f"  ({t['failed']} did not match: {t['detail']})"
            lines.append(f"{mark} {t['rule_id']} (line {t['line']}){why}")
        return lines
    lines.append(f"entrypoint {doc['entrypoint']}")
    lines.append(f"input {json.dumps(doc['input'], sort_keys=True)}")
    members = doc["decision_set"]
    lines.append(f"decision set ({len(members)}):" if members else "decision set: undefined or empty")
    for m in members:
        mark = "→" if m.get("selected") else " "
        over = m.get("overridden_by")
        why = f"  (overridden by {over['rule_id']}: {over['why']})" if over else ""
        lines.append(f"  {mark} {m.get('decision')} {m.get('rule_id')}{why}")
    for row in doc["trace"]:
        rid = f" [{row['rule_id']}]" if row.get("rule_id") else ""
        lines.append(f"rule {row['rule']}{rid} {row['file']}:{row['line']}: {row['result']}"
                     + (f" ({row['why']})" if row.get("why") else ""))
        for e in row.get("expressions", []):
            mark = {"held": "✓", "undefined": "✗", "not evaluated": "·"}[e["result"]]
            lines.append(f"  {mark} {row['file']}:{e['line']}  {' '.join(e['text'].split())}  ({e['result']})")
    printed = doc.get("prints") or []
    lines.append(f"print lines ({len(printed)}):" if printed else "print lines: none")
    lines += [f"  {line}" for line in printed]
    return lines
