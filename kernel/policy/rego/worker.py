"""A Rego worker process: compiles bundles once per content digest and evaluates their entrypoint.

Run only by `pool.py`, as ``python -s -S -P worker.py FD [--test-hooks] [--spin-us N]``
with ``PYTHONPATH`` set to regopy's directory and nothing else in the environment. The kernel never
imports this file: it must not load regopy (regopy can segfault, abort, leak or loop; see
regopy-notes.md), so every call into rego-cpp happens here (through `native.py`) and a fault costs
only this process.
"""

# ruff: noqa: I001
from __future__ import annotations  # a compiler directive, not an import: regopy is still first

# regopy must be the first import: greenlet loaded before it makes every evaluation leak native
# memory (regopy-notes hazard 3). -S keeps site (and any .pth file) from importing anything first.
import regopy

import contextlib
import importlib.util
import json
import os
import resource
import signal
import socket
import sys
import time
from collections import OrderedDict
from typing import Any


def load_sibling(name: str) -> Any:
    """A module of this directory, by path: importing the kernel package here would run package
    __init__ files that other modules own and might import anything."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_regent_rego_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


P = load_sibling("protocol")
N = load_sibling("native")

DEFAULT_SPIN_SECONDS = 200e-6  # pool.DEFAULT_SPIN_SECONDS; the pool passes --spin-us
_PREEMPTED_SECONDS = 30e-6  # one poll turn (recv + sched_yield) is ~2 µs unless something else ran
_NO_POLL_SECONDS = 0.05


class Worker:
    def __init__(self, sock: socket.socket, *, test_hooks: bool, max_bundles: int = 64,
                 spin_seconds: float = DEFAULT_SPIN_SECONDS):
        self.last_prints = ""
        self.sock = sock
        self.test_hooks = test_hooks
        self.max_bundles = max_bundles
        self.spin_seconds = spin_seconds
        self.runtime = regopy.Interpreter()
        self._strict_runtime: Any = None  # made on the first bundle loaded with "strict"
        self.builtin_checker = regopy.Interpreter()
        # key → (build interpreter, bundle, entrypoint, runtime): the interpreter stays referenced
        # while its bundle lives (freeing rego objects out of order is what crashes, hazard 2).
        self.bundles: OrderedDict[str, tuple[Any, Any, bytes, Any]] = OrderedDict()
        self.buffer = bytearray()
        self._replied_at = 0.0
        self._in_burst = False
        self._no_poll_until = 0.0

    # -- framing ---------------------------------------------------------------------------
    def _recv_exact(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                return None
            self.buffer += chunk
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def _await_request(self) -> None:
        """Wait for the next request's first bytes. While requests come back to back (the last one
        arrived within ``spin_seconds`` of the reply before it), poll for up to that long before
        blocking: a process blocked in recv() puts its CPU to sleep, and waking a sleeping vCPU
        cost ~80 µs a round trip on a quiet 2-CPU VM, more than the evaluation itself. An idle
        worker blocks as before. On a busy machine polling only loses: the poll yields the CPU
        each turn, and once a turn shows that something else ran meanwhile, the worker blocks
        (and does not poll for the next 50 ms), so a woken worker gets the CPU back promptly."""
        if self.buffer:
            return
        clock = time.perf_counter
        chunk = None
        if self._in_burst:
            last = clock()
            deadline = last + self.spin_seconds
            while True:
                try:
                    chunk = self.sock.recv(65536, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    os.sched_yield()
                    now = clock()
                    if now - last > _PREEMPTED_SECONDS:
                        self._no_poll_until = now + _NO_POLL_SECONDS
                        break
                    if now >= deadline:
                        break
                    last = now
        if chunk is None:
            chunk = self.sock.recv(65536)
        now = clock()
        self._in_burst = (self.spin_seconds > 0 and now - self._replied_at <= self.spin_seconds
                          and now >= self._no_poll_until)
        self.buffer += chunk
        if not chunk:
            raise EOFError

    def send(self, op: int, payload: bytes = b"") -> None:
        self.sock.sendall(P.frame(op, payload))

    def serve(self) -> None:
        self.send(P.OP_HELLO, json.dumps(N.probe_capabilities()).encode())
        while True:
            try:
                self._await_request()
            except EOFError:
                return  # the kernel closed its end: shut down quietly
            header = self._recv_exact(P.HEADER.size)
            if header is None:
                return
            length, op = P.HEADER.unpack(header)
            payload = self._recv_exact(length)
            if payload is None:
                return
            if op == P.OP_EVAL:
                self.evaluate(payload)
            elif op == P.OP_EVAL_PRINTS:
                self.evaluate(payload, capture=True)
            elif op == P.OP_LAST_PRINTS:
                self.send(P.OP_OK, self.last_prints.encode("utf-8"))
            elif op == P.OP_LOAD:
                self.load(json.loads(payload))
            elif op == P.OP_PROBE:
                self.probe(payload)
            elif op == P.OP_EVAL_BATCH:
                self.evaluate_batch(payload)
            else:
                self.fail(f"unknown op {op}")
            self._replied_at = time.perf_counter()

    def fail(self, error: str, **extra: Any) -> None:
        self.send(P.OP_FAIL, json.dumps({"error": error, **extra}).encode())

    # -- operations ------------------------------------------------------------------------
    def load(self, req: dict[str, Any]) -> None:
        names = req.get("names") or []
        builtins = {n: bool(self.builtin_checker.is_builtin(n)) for n in names}
        interp = regopy.Interpreter()
        strict = bool(req.get("strict"))
        runtime = self.runtime
        if strict:
            interp.strict_built_in_errors = True
            if self._strict_runtime is None:
                self._strict_runtime = regopy.Interpreter()
                self._strict_runtime.strict_built_in_errors = True
            runtime = self._strict_runtime
        entrypoints = [req["entrypoint"], *(req.get("entrypoints") or [])]
        error = ""
        with N.StdoutCapture() as capture:
            try:
                for name, source in req["modules"].items():
                    interp.add_module(name, source)
                interp.add_data_json(json.dumps(req.get("data") or {}))
                bundle = interp.build(None, entrypoints)
                if not bundle.ok():
                    error = "rego-cpp could not build the bundle"
                else:
                    error = self._trial(bundle, req["entrypoint"].encode("utf-8"), runtime)
            except regopy.RegoError as exc:
                error = str(exc)
        if error:
            self.fail(error, report=capture.text, builtins=builtins)
            return
        self.bundles[req["key"]] = (interp, bundle, req["entrypoint"].encode("utf-8"), runtime)
        self.bundles.move_to_end(req["key"])
        while len(self.bundles) > self.max_bundles:
            self.bundles.popitem(last=False)
        if self.test_hooks and _wants_forgetting(req.get("data")):
            # as if evicted between this load and the next request: every request answers OP_MISSING
            self.bundles.pop(req["key"], None)
        self.send(P.OP_OK, json.dumps({"builtins": builtins}).encode())

    def _trial(self, bundle: Any, entrypoint: bytes, runtime: Any) -> str:
        """Run the entrypoint once on an empty input: rego-cpp verifies a bundle's plans only
        when it first runs them, and a bundle that fails verification fails every step."""
        N.set_empty_input(runtime)
        out = N.query_entrypoint(runtime, bundle, entrypoint)
        if not out:
            return ""
        kind, message = N.query_output(out)
        if kind != "error" or "bundle verify" not in message:
            return ""  # an error on the empty input may well be the input's fault
        return (
            f"rego-cpp cannot run this bundle ({message}); rego-cpp 1.5.2 fails this way on "
            "some object literals, e.g. one holding seven distinct numbers: move such constants "
            "into data.json, or build the object with object.union from smaller ones"
        )

    def _request(self, payload: bytes, what: str) -> tuple[Any, Any] | None:
        """The held bundle a request names (key prefix) and its decoded JSON body; None after
        answering OP_MISSING (bundle not held) or a failure (body not JSON)."""
        key = payload[: P.KEY_BYTES].decode("ascii")
        entry = self.bundles.get(key)
        if entry is None:
            self.send(P.OP_MISSING)
            return None
        self.bundles.move_to_end(key)
        try:
            return entry, json.loads(payload[P.KEY_BYTES :])
        except ValueError as exc:
            self.fail(f"{what} is not JSON: {exc}")
            return None

    def evaluate(self, payload: bytes, capture: bool = False) -> None:
        self.last_prints = ""
        found = self._request(payload, "input document")
        if found is None:
            return
        entry, document = found
        _, bundle, entrypoint, runtime = entry
        if not self._set_document(runtime, document, payload[P.KEY_BYTES :]):
            return
        if capture:
            # rego-cpp writes print() lines to stdout; only `policy eval --explain` asks for them.
            with N.StdoutCapture() as cap:
                out = N.query_entrypoint(runtime, bundle, entrypoint)
            self.last_prints = cap.text
        else:
            out = N.query_entrypoint(runtime, bundle, entrypoint)
        if not out:
            self.fail(N.last_error(runtime) or "rego-cpp returned no output")
            return
        kind, text = N.query_output(out)
        if kind == "value":
            self.send(P.OP_VALUE, text.encode("utf-8"))
        elif kind == "undefined":
            self.send(P.OP_UNDEFINED)
        else:
            self.fail(text)

    def evaluate_batch(self, payload: bytes) -> None:
        """The entrypoint on each of several input documents (OP_EVAL_BATCH)."""
        found = self._request(payload, "batch request")
        if found is None:
            return
        entry, req = found
        documents = req.get("inputs") if isinstance(req, dict) else None
        if not isinstance(documents, list):
            self.fail('a batch is a JSON object with "inputs", an array of input documents')
            return
        _, bundle, entrypoint, runtime = entry
        if req.get("entrypoint"):
            entrypoint = str(req["entrypoint"]).encode("utf-8")
        results: list[dict[str, Any]] = []
        for document in documents:
            if self.test_hooks:
                _maybe_fault(document)
            try:
                N.set_input(runtime, document)
            except (N.BadInput, UnicodeEncodeError) as exc:
                results.append({"error": f"input document cannot be given to rego-cpp: {exc}"})
                continue
            results.append(self._query(runtime, bundle, entrypoint))
        self.send(P.OP_OK, json.dumps({"results": results}).encode("utf-8"))

    @staticmethod
    def _query(runtime: Any, bundle: Any, entrypoint: bytes) -> dict[str, Any]:
        out = N.query_entrypoint(runtime, bundle, entrypoint)
        if not out:
            return {"error": N.last_error(runtime) or "rego-cpp returned no output"}
        kind, text = N.query_output(out)
        if kind == "value":
            return {"value": text}
        if kind == "undefined":
            return {"undefined": True}
        return {"error": text}

    def _set_document(self, runtime: Any, document: Any, text: bytes | None = None) -> bool:
        """Give ``document`` (``text`` decoded, when given) to ``runtime`` as its input; answers
        OP_FAIL and returns False if rego-cpp cannot take it."""
        if self.test_hooks:
            _maybe_fault(document)
        try:
            N.set_input(runtime, document, text)
        except (N.BadInput, UnicodeEncodeError) as exc:
            self.fail(f"input document cannot be given to rego-cpp: {exc}")
            return False
        return True

    def probe(self, payload: bytes) -> None:
        """Evaluate several entrypoints of one bundle on one input (OP_PROBE)."""
        found = self._request(payload, "probe request")
        if found is None:
            return
        entry, req = found
        _, bundle, _, runtime = entry
        if not self._set_document(runtime, req.get("input")):
            return
        results = [self._query(runtime, bundle, str(name).encode("utf-8")) for name in req.get("entrypoints") or []]
        self.send(P.OP_OK, json.dumps({"results": results}).encode("utf-8"))


def _wants_forgetting(data: Any) -> bool:
    """A bundle whose data.json holds ``{TEST_FAULT_KEY: "forget"}`` is dropped right after it
    loads (honoured only with test hooks): the engine's "bundle missing twice" path."""
    return isinstance(data, dict) and data.get(P.TEST_FAULT_KEY) == "forget"


def _maybe_fault(document: Any) -> None:
    args = document.get("args") if isinstance(document, dict) else None
    fault = args.get(P.TEST_FAULT_KEY) if isinstance(args, dict) else None
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "abort":
        os.abort()
    elif fault == "exit":
        os._exit(3)
    elif fault == "hang":
        while True:
            time.sleep(1)


def main(argv: list[str]) -> int:
    fd = int(argv[0])
    test_hooks = "--test-hooks" in argv
    spin = DEFAULT_SPIN_SECONDS
    if "--spin-us" in argv:
        spin = max(0.0, float(argv[argv.index("--spin-us") + 1]) / 1e6)
    # No RLIMIT_AS/RLIMIT_DATA: rego-cpp's allocator (snmalloc) reserves ~256 GB of address space
    # at start-up and aborts under either limit. The pool watches resident memory instead.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not write a core file
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the kernel's to handle
    sock = socket.socket(fileno=fd)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the kernel went away
        Worker(sock, test_hooks=test_hooks, spin_seconds=spin).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
