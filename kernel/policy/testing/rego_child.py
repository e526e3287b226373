"""Child process of the Rego unit-test runner: imports regopy first (hazard 3), loads the bundle
modules + one *_test.rego file and queries each test, one JSON line per event on stdout, so a
segfault leaves the parent knowing which test was running."""

import regopy  # noqa: I001  (first, before anything that could pull in greenlet)
import json
import sys
import time


def main() -> int:
    req = json.loads(sys.stdin.read())
    interp = regopy.Interpreter()
    if req.get("strict"):
        interp.strict_built_in_errors = True
    for name, source in req["modules"].items():
        interp.add_module(name, source)
    interp.add_data_json(json.dumps(req.get("data") or {}))
    for test in req["tests"]:
        print(json.dumps({"start": test}), flush=True)
        started = time.perf_counter()
        try:
            output = interp.query(f"x := data.{test}")
            text = str(output)
            ok = text.replace(" ", "").endswith('"bindings":{"x":true}}')
            print(json.dumps({"done": test, "passed": ok, "output": text,
                              "seconds": time.perf_counter() - started}), flush=True)
        except Exception as exc:  # a rego error for this test only
            print(json.dumps({"done": test, "error": str(exc), "seconds": time.perf_counter() - started}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
