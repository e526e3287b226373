"""regorus (Microsoft's Rust Rego engine, OPA v1 syntax) as an independent oracle for what OPA
answers: the conformance set and the generated differential test ask it the same question they
ask Regent's path.

regorus is not OPA. Where it is known to differ (a built-in its wheel lacks, a parse OPA's
parser does otherwise), the case or the generator says so, with the reason.
"""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("RUST_BACKTRACE", "0")  # regorus appends a backtrace to errors otherwise

import regorus


def regorus_eval(modules: list[str], data: Any, input_doc: Any, query: str) -> tuple[str, Any]:
    """("result", [bindings, …]) — `[]` for undefined — or ("error", message): a module regorus
    refuses, or an error at evaluation. Values come back as JSON (numbers exact, sets as sorted
    arrays)."""
    engine = regorus.Engine()
    try:
        for i, source in enumerate(modules):
            engine.add_policy(f"case/m{i}.rego", source)
        engine.add_data_json(json.dumps(data or {}))
        engine.set_input_json(json.dumps(input_doc))
        out = json.loads(engine.eval_query_as_json(query))
    except BaseException as exc:  # a Rust panic (pyo3's PanicException) is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return "error", str(exc).strip()
    return "result", [r["bindings"] for r in out.get("result", [])]


def norm(value: Any, sort: bool) -> Any:
    """Arrays sorted (when ``sort``) by their JSON text, so a set compares whatever its order."""
    if isinstance(value, dict):
        return {k: norm(v, sort) for k, v in value.items()}
    if isinstance(value, list):
        items = [norm(v, sort) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True)) if sort else items
    return value
