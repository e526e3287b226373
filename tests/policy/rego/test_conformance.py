"""The Rego conformance set (tests/policy/rego/conformance/*.yaml, OPA's compliance-case shape),
each case through the kernel's path: the load gate, then the worker pool evaluating the query's
rule as an entrypoint.

A case: `note`, `modules` (sources), optional `data` and `input`, `query` (`data.<pkg>.<rule> = x`)
and one of `want_result` (`[{x: value}]`, `[]` for undefined), `want_error_code` with
`want_error` (a substring): `rego_load_error` is a refusal by the load gate, `eval_error` an
error at evaluation. `sort_bindings: true` compares arrays (sets) unordered. `known_difference:
<id>` marks a case where rego-cpp and OPA differ: the case asserts rego-cpp's documented behaviour
(so a change is noticed), `opa_result` says what OPA answers, and docs/policy.md's "Known
differences" lists the id.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel.errors import ValidationError
from kernel.policy.rego import RegoEngine, compile_rego_bundle

HERE = Path(__file__).parent / "conformance"
DOCS = Path(__file__).parents[3] / "docs" / "policy.md"
_QUERY = re.compile(r"^data\.([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*x$")


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for f in sorted(HERE.glob("*.yaml")):
        for case in yaml.safe_load(f.read_text(encoding="utf-8"))["cases"]:
            out.append((f.stem, case["note"], case))
    return out


CASES = _cases()


def _norm(value: Any, sort: bool) -> Any:
    if isinstance(value, dict):
        return {k: _norm(v, sort) for k, v in value.items()}
    if isinstance(value, list):
        items = [_norm(v, sort) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True)) if sort else items
    return value


def run_case(engine: RegoEngine, case: dict[str, Any]) -> tuple[str, Any]:
    """("result", [bindings]) | ("rego_load_error", message) | ("eval_error", message)."""
    m = _QUERY.match(case["query"])
    assert m, f"query must be `data.<pkg>.<rule> = x`: {case['query']}"
    entrypoint = m.group(1).replace(".", "/")
    mapping = {
        "modules": {f"case/m{i}.rego": src for i, src in enumerate(case["modules"])},
        "data": case.get("data") or {},
        "manifest": {"roots": [""], "metadata": {"regent": {"entrypoint": entrypoint}}},
    }
    try:
        bundle = compile_rego_bundle(mapping, engine=engine)
    except ValidationError as exc:
        return "rego_load_error", exc.message
    [got] = engine.probe(bundle, case.get("input", {}), [entrypoint])
    if "error" in got:
        return "eval_error", got["error"]
    if got.get("undefined"):
        return "result", []
    return "result", [{"x": got["value"]}]


@pytest.mark.parametrize(("family", "note", "case"), CASES, ids=[f"{f}:{n}" for f, n, _ in CASES])
def test_conformance_case_decides_as_documented(engine: RegoEngine, family: str, note: str,
                                                case: dict[str, Any]) -> None:
    kind, got = run_case(engine, case)
    if "want_error_code" in case:
        assert kind == case["want_error_code"], f"wanted {case['want_error_code']}, got {kind}: {got}"
        assert case.get("want_error", "") in got
        return
    assert kind == "result", got
    sort = bool(case.get("sort_bindings"))
    assert _norm(got, sort) == _norm(case["want_result"], sort)


def test_conformance_set_is_broad() -> None:
    families = Counter(f for f, _, _ in CASES)
    assert len(CASES) >= 150, families
    assert len({n for _, n, _ in CASES}) == len(CASES), "notes must be unique"


def test_every_known_difference_is_documented() -> None:
    documented = DOCS.read_text(encoding="utf-8").split("### Known differences", 1)[1]
    for _, note, case in CASES:
        if "known_difference" in case:
            assert f"`{case['known_difference']}`" in documented, note
            assert "opa_result" in case or "opa_error" in case, note
