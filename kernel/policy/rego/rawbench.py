"""Raw in-process Rego evaluation timings, for `bench.py`: the public regopy API and the worker's
own path (native.py), on one compiled bundle and input, with no process boundary.

Run by `bench.py` as ``python -s -S -P rawbench.py N`` with the bundle and input on stdin, regopy's
directory alone on PYTHONPATH; timings on stdout. The kernel never imports this file (regopy).
"""

# ruff: noqa: I001
from __future__ import annotations

import regopy  # first (regopy-notes hazard 3)

import importlib.util
import json
import os
import sys
import time
from typing import Any


def _native() -> Any:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native.py")
    spec = importlib.util.spec_from_file_location("_regent_rego_native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(n: int) -> None:
    N = _native()
    req = json.loads(sys.stdin.buffer.read())
    interp = regopy.Interpreter()
    for name, source in req["modules"].items():
        interp.add_module(name, source)
    interp.add_data_json(json.dumps(req.get("data") or {}))
    bundle = interp.build(None, [req["entrypoint"]])
    runtime = regopy.Interpreter()
    document = req["input"]
    entrypoint = req["entrypoint"]

    def regopy_api() -> Any:
        runtime.set_input(regopy.Input(document))
        output = runtime.query_bundle_entrypoint(bundle, entrypoint)
        return json.loads(str(output))

    body = json.dumps(document).encode("utf-8")
    ep_bytes = entrypoint.encode("utf-8")

    def worker_path() -> Any:
        # What Worker.evaluate does, minus the socket: decode, build the input, query.
        N.set_input(runtime, json.loads(body))
        _, text = N.query_output(N.query_entrypoint(runtime, bundle, ep_bytes))
        return json.loads(text)

    timings: dict[str, list[float]] = {"regopy_api": [], "worker_path": []}
    clock = time.perf_counter
    for name, fn in (("regopy_api", regopy_api), ("worker_path", worker_path)):
        for _ in range(min(n, 500)):  # warm-up
            fn()
        samples = timings[name]
        for _ in range(n):
            t0 = clock()
            fn()
            samples.append(clock() - t0)
    sys.stdout.write(json.dumps({"timings": timings, "value": regopy_api()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]))
