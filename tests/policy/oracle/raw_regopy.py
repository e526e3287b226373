"""The oracle for the differential tests: raw regopy, its public API only, given the input as JSON
text (`Interpreter.set_input_term`), in a process of its own (the test process is a kernel
process and must never import regopy).

Run as ``python -s -S -P raw_regopy.py`` with regopy's directory alone on PYTHONPATH; one JSON
request a line on stdin ({"modules", "data", "query", "input"}: input is JSON text), one JSON
answer a line on stdout: {"value": V}, {"undefined": true} or {"error": MESSAGE}.
"""

# ruff: noqa: I001
from __future__ import annotations

import regopy  # first (regopy-notes hazard 3)

import hashlib
import json
import sys
from typing import Any

_interpreters: dict[str, Any] = {}


def _interpreter(req: dict[str, Any]) -> Any:
    key = hashlib.sha256(json.dumps([req["modules"], req["data"]], sort_keys=True).encode()).hexdigest()
    interp = _interpreters.get(key)
    if interp is None:
        interp = regopy.Interpreter()
        for name, source in req["modules"].items():
            interp.add_module(name, source)
        interp.add_data_json(json.dumps(req["data"]))
        _interpreters[key] = interp
    return interp


def answer(req: dict[str, Any]) -> dict[str, Any]:
    interp = _interpreter(req)
    try:
        interp.set_input_term(req["input"])
        output = interp.query(f"x := {req['query']}")
        text = str(output)  # the Output stays referenced until its text is read (hazard 2)
    except Exception as exc:
        return {"error": " ".join(str(exc).split())[:300]}
    try:
        doc = json.loads(text)
    except ValueError:
        return {"error": text[:300]}
    if not isinstance(doc, dict) or "x" not in doc.get("bindings", {}):
        return {"undefined": True}
    return {"value": doc["bindings"]["x"]}


def main() -> None:
    for line in sys.stdin:
        sys.stdout.write(json.dumps(answer(json.loads(line))) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
