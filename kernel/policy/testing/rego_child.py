"""Child process of the Rego unit-test runner: loads the bundle modules + one *_test.rego file and
queries each test, one JSON line per event on stdout, so a segfault leaves the parent knowing which
test was running. With a "coverage" request it instead loads the modules it is given (the file's
coverage twin, kernel/policy/rego/testcover.py, or the file with the explain queries of
kernel/policy/testing/explain.py) and answers their queries, one line each.

Run by path (``python -s -S -P rego_child.py``, regopy's directory alone on PYTHONPATH), as the Rego
workers are: regopy is imported first (hazard 3) and nothing of the kernel is.
"""

import regopy  # noqa: I001  (first, before anything that could pull in greenlet)
import json
import sys
import time
from typing import Any


def _interpreter(req: dict[str, Any], modules: dict[str, str]) -> Any:
    interp = regopy.Interpreter()
    if req.get("strict"):
        interp.strict_built_in_errors = True
    for name, source in modules.items():
        interp.add_module(name, source)
    interp.add_data_json(json.dumps(req.get("data") or {}))
    return interp


def _emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def _run_tests(req: dict[str, Any]) -> None:
    interp = _interpreter(req, req["modules"])
    for test in req["tests"]:
        _emit({"start": test})
        started = time.perf_counter()
        try:
            output = interp.query(f"x := data.{test}")
            text = str(output)
            ok = text.replace(" ", "").endswith('"bindings":{"x":true}}')
            _emit({"done": test, "passed": ok, "output": text, "seconds": time.perf_counter() - started})
        except Exception as exc:  # a rego error for this test only
            _emit({"done": test, "error": str(exc), "seconds": time.perf_counter() - started})


def _run_coverage(req: dict[str, Any]) -> None:
    cov = req["coverage"]
    interp = _interpreter(req, cov["modules"])
    for name, query in cov["queries"]:
        _emit({"cov_start": name})
        try:
            output = interp.query(query)
            text = str(output)  # keep the Output referenced while its text is read (hazard 2)
            bindings = json.loads(text).get("bindings", {})
            _emit({"cov": name, "value": bindings.get("x"), "defined": "x" in bindings})
        except Exception as exc:  # this query only: the coverage of one test
            _emit({"cov": name, "error": str(exc)[:300]})


def main() -> int:
    req = json.loads(sys.stdin.read())
    if "coverage" in req:
        _run_coverage(req)
    else:
        _run_tests(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
