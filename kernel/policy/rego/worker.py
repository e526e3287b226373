"""A Rego worker process: compiles bundles once per content digest and evaluates their entrypoint.

Run only by `pool.py`, as ``python -s -S -P worker.py FD [--test-hooks]``
with ``PYTHONPATH`` set to regopy's directory and nothing else in the environment. The kernel never
imports this file: it must not load regopy (regopy can segfault, abort, leak or loop; see
regopy-notes.md), so every call into rego-cpp happens here and a fault costs only this
process. ``--bench N`` instead times raw in-process evaluation for `bench.py`.
"""

# ruff: noqa: I001
from __future__ import annotations  # a compiler directive, not an import: regopy is still first

# regopy must be the first import: greenlet loaded before it makes every evaluation leak native
# memory (regopy-notes hazard 3). -S keeps site (and any .pth file) from importing anything first.
import regopy
from regopy import rego_shared as _rs

import contextlib
import ctypes
import importlib.util
import json
import json.encoder
import os
import resource
import signal
import socket
import sys
import tempfile
import time
from collections import OrderedDict
from typing import Any


def _load_protocol() -> Any:
    # By path, not as kernel.policy.rego.protocol: importing the kernel package here would run
    # package __init__ files that other modules own and might import anything.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py")
    spec = importlib.util.spec_from_file_location("_regent_rego_protocol", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


P = _load_protocol()

_lib = _rs.rego
_libc = ctypes.CDLL(None)
_new_input = _lib.regoNewInput
_free_input = _lib.regoFreeInput
_in_str = _lib.regoInputString
_in_int = _lib.regoInputInt
_in_float = _lib.regoInputFloat
_in_bool = _lib.regoInputBoolean
_in_null = _lib.regoInputNull
_in_item = _lib.regoInputObjectItem
_in_object = _lib.regoInputObject
_in_array = _lib.regoInputArray
_set_input = _lib.regoSetInput
_query_entrypoint = _lib.regoBundleQueryEntrypoint
_output_ok = _lib.regoOutputOk
_free_output = _lib.regoFreeOutput
_INT64 = (-(1 << 63), (1 << 63) - 1)
_escape = json.encoder.encode_basestring  # type: ignore[attr-defined]

_NODE_ERROR_MESSAGE = 1801
_NODE_ERROR_CODE = 1803

# Builtins whose availability depends on how rego-cpp was built: a call and the value it must give.
_PROBES = {
    "time.now_ns": "time.now_ns() > 0",
    "time.parse_ns": 'time.parse_ns("2006-01-02", "2026-12-02") == 1796169600000000000',
    "time.parse_rfc3339_ns": 'time.parse_rfc3339_ns("2026-12-02T19:00:00+00:00") == 1796238000000000000',
    "time.parse_duration_ns": 'time.parse_duration_ns("1h") == 3600000000000',
    "time.format": 'time.format(0) == "1970-01-01T00:00:00.000000000Z"',
    "time.date": "time.date(0) == [1970, 1, 1]",
    "time.clock": "time.clock(0) == [0, 0, 0]",
    "time.weekday": 'time.weekday(0) == "Thursday"',
    "time.add_date": "time.add_date(0, 0, 0, 1) == 86400000000000",
    "time.diff": "count(time.diff(0, 0)) == 6",
    "crypto.md5": 'crypto.md5("a") == "0cc175b9c0f1b6a831c399e269772661"',
    "crypto.sha1": 'crypto.sha1("a") == "86f7e437faa5a7fce15d1ddcb9eaeaea377667b8"',
    "crypto.sha256": 'startswith(crypto.sha256("a"), "ca978112ca1bbdcafac231b39a23dc4d")',
    "crypto.hmac.md5": 'count(crypto.hmac.md5("a", "k")) == 32',
    "crypto.hmac.sha1": 'count(crypto.hmac.sha1("a", "k")) == 40',
    "crypto.hmac.sha256": 'count(crypto.hmac.sha256("a", "k")) == 64',
    "crypto.hmac.sha512": 'count(crypto.hmac.sha512("a", "k")) == 128',
    "crypto.hmac.equal": 'crypto.hmac.equal("a", "a")',
}
# Declared-only probes: too awkward to call with a fixed argument, so is_builtin must do.
_DECLARED = (
    "crypto.x509.parse_certificates",
    "crypto.x509.parse_and_verify_certificates",
    "crypto.x509.parse_certificate_request",
    "crypto.x509.parse_keypair",
    "crypto.x509.parse_rsa_private_key",
    "crypto.parse_private_keys",
    "io.jwt.decode",
    "io.jwt.decode_verify",
    "io.jwt.encode_sign",
    "io.jwt.encode_sign_raw",
    "io.jwt.verify_hs256",
    "io.jwt.verify_rs256",
    "io.jwt.verify_es256",
)
# Known quirks of this build that bundles should hear about (not load errors).
_QUIRKS = {
    "time.parse_rfc3339_ns rejects the Z suffix": 'time.parse_rfc3339_ns("2026-12-02T19:00:00Z") == 1796238000000000000',
    "strings are held JSON-escaped (count, substring and regex see the escapes)": 'count("a\\nb") == 3',
}


class _BadInput(Exception):
    pass


def _add(p: int, v: Any) -> None:
    """Append one JSON value to a rego input under construction (regopy's builder, minus its cost).

    Strings go in JSON-escaped (without the quotes), which is how rego-cpp 1.5.2 holds string
    literals and JSON input internally. Raw strings, as regopy's own `Input` passes them, break
    three ways: `input.s == "a\\"b"` is false for the input `a"b`; a NUL truncates the string
    (the policy would see "ls" for "ls\\0; rm -rf /"); and rego-cpp prints them unescaped in
    its JSON output, so an input string can inject keys into the decision object
    (`x", "decision": "allow`).
    """
    t = type(v)
    if t is str:
        rc = _in_str(p, _escape(v)[1:-1].encode("utf-8"))
    elif t is dict:
        for k, x in v.items():
            if _in_str(p, _escape(k)[1:-1].encode("utf-8")):
                raise _BadInput("rego-cpp rejected an object key")
            _add(p, x)
            if _in_item(p):
                raise _BadInput("rego-cpp rejected an object item")
        rc = _in_object(p, len(v))
    elif t is list:
        for x in v:
            _add(p, x)
        rc = _in_array(p, len(v))
    elif t is bool:
        rc = _in_bool(p, v)
    elif t is int:
        if not _INT64[0] <= v <= _INT64[1]:
            raise _BadInput("an integer does not fit in 64 bits")
        rc = _in_int(p, v)
    elif t is float:
        rc = _in_float(p, v)
    elif v is None:
        rc = _in_null(p)
    else:
        raise _BadInput(f"unsupported JSON value of type {t.__name__}")
    if rc:
        raise _BadInput(f"rego-cpp rejected a value (code {rc})")


def _error_text(node: int) -> str:
    """The error messages and codes under a rego-cpp error node, without the s-expression."""
    messages: list[str] = []
    codes: list[str] = []
    stack = [node]
    while stack and len(messages) < 8:
        n = stack.pop()
        kind = _lib.regoNodeType(n)
        if kind in (_NODE_ERROR_MESSAGE, _NODE_ERROR_CODE):
            try:
                value = _rs.rego_node_value(n)
            except Exception:
                value = ""
            if value:
                (messages if kind == _NODE_ERROR_MESSAGE else codes).append(value)
            continue
        stack.extend(_rs.rego_node_get(n, i) for i in reversed(range(_rs.rego_node_size(n))))
    text = "; ".join(messages) or "unknown rego-cpp error"
    if codes and codes[0] != "rego_error" and codes[0] not in text:
        text = f"{codes[0]}: {text}"
    return text


class _StdoutCapture:
    """Send fd 1 to a temp file for a while: rego-cpp prints its readable error report there."""

    def __enter__(self) -> _StdoutCapture:
        self.tmp = tempfile.TemporaryFile()
        _libc.fflush(None)
        self.saved = os.dup(1)
        os.dup2(self.tmp.fileno(), 1)
        return self

    def __exit__(self, *exc: object) -> None:
        _libc.fflush(None)  # C++ streams sit on C stdio; flush before the fd moves back
        os.dup2(self.saved, 1)
        os.close(self.saved)
        self.tmp.seek(0)
        self.text = self.tmp.read(64 * 1024).decode("utf-8", "replace")
        self.tmp.close()


def _probe_capabilities() -> dict[str, Any]:
    interp = regopy.Interpreter()
    unavailable = []
    for name, check in _PROBES.items():
        if not interp.is_builtin(name) or not _query_true(interp, check):
            unavailable.append(name)
    unavailable.extend(n for n in _DECLARED if not interp.is_builtin(n))
    quirks = [quirk for quirk, check in _QUIRKS.items() if not _query_true(interp, check)]
    return {
        "pid": os.getpid(),
        "regopy": getattr(regopy, "__version__", ""),
        "build_info": regopy.build_info(),
        "unavailable": sorted(unavailable),
        "quirks": quirks,
    }


def _query_true(interp: Any, expression: str) -> bool:
    try:
        output = interp.query(f"x := {expression}")
        text = str(output)
    except Exception:
        return False
    return text.replace(" ", "").endswith('"bindings":{"x":true}}')


class Worker:
    def __init__(self, sock: socket.socket, *, test_hooks: bool, max_bundles: int = 64):
        self.last_prints = ""
        self.sock = sock
        self.test_hooks = test_hooks
        self.max_bundles = max_bundles
        self.runtime = regopy.Interpreter()
        self._strict_runtime: Any = None  # made on the first bundle loaded with "strict"
        self.builtin_checker = regopy.Interpreter()
        # key → (build interpreter, bundle, entrypoint, runtime): the interpreter stays referenced
        # while its bundle lives (freeing rego objects out of order is what crashes, hazard 2).
        self.bundles: OrderedDict[str, tuple[Any, Any, bytes, Any]] = OrderedDict()
        self.buffer = bytearray()

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

    def send(self, op: int, payload: bytes = b"") -> None:
        self.sock.sendall(P.frame(op, payload))

    def serve(self) -> None:
        self.send(P.OP_HELLO, json.dumps(_probe_capabilities()).encode())
        while True:
            header = self._recv_exact(P.HEADER.size)
            if header is None:
                return  # the kernel closed its end: shut down quietly
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
            else:
                self.fail(f"unknown op {op}")

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
        with _StdoutCapture() as capture:
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
        self.send(P.OP_OK, json.dumps({"builtins": builtins}).encode())

    def _trial(self, bundle: Any, entrypoint: bytes, runtime: Any = None) -> str:
        """Run the entrypoint once on an empty input: rego-cpp verifies a bundle's plans only
        when it first runs them, and a bundle that fails verification fails every step."""
        runtime = runtime or self.runtime
        p = _new_input()
        try:
            _in_object(p, 0)
            _set_input(runtime._impl, p)
        finally:
            _free_input(p)
        out = _query_entrypoint(runtime._impl, bundle._impl, entrypoint)
        if not out:
            return ""
        try:
            text = _rs.rego_output_string(out) if _output_ok(out) else ""
            if text[:1] in ("{", "[") or text == "undefined":
                return ""
            message = _error_text(_lib.regoOutputNode(out))
        finally:
            _free_output(out)
        if "bundle verify" not in message:
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
        if not self._set_document(runtime, document):
            return
        if capture:
            # rego-cpp writes print() lines to stdout; only `policy eval --explain` asks for them.
            with _StdoutCapture() as cap:
                out = _query_entrypoint(runtime._impl, bundle._impl, entrypoint)
            self.last_prints = cap.text
        else:
            out = _query_entrypoint(runtime._impl, bundle._impl, entrypoint)
        if not out:
            self.fail(_rs.rego_get_error(runtime._impl) or "rego-cpp returned no output")
            return
        try:
            text = _rs.rego_output_string(out) if _output_ok(out) else ""
            if text[:1] in ("{", "["):
                self.send(P.OP_VALUE, text.encode("utf-8"))
            elif text == "undefined":
                self.send(P.OP_UNDEFINED)
            else:
                self.fail(_error_text(_lib.regoOutputNode(out)))
        finally:
            _free_output(out)


    def _set_document(self, runtime: Any, document: Any) -> bool:
        """Give ``document`` to ``runtime`` as its input; answers OP_FAIL and returns False if
        rego-cpp cannot take it."""
        if self.test_hooks:
            _maybe_fault(document)
        p = _new_input()
        try:
            _add(p, document)
            if _set_input(runtime._impl, p):
                raise _BadInput("rego-cpp rejected the input document")
        except (_BadInput, UnicodeEncodeError) as exc:
            self.fail(f"input document cannot be given to rego-cpp: {exc}")
            return False
        finally:
            _free_input(p)
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
        results: list[dict[str, Any]] = []
        for name in req.get("entrypoints") or []:
            out = _query_entrypoint(runtime._impl, bundle._impl, str(name).encode("utf-8"))
            if not out:
                results.append({"error": _rs.rego_get_error(runtime._impl) or "no output"})
                continue
            try:
                text = _rs.rego_output_string(out) if _output_ok(out) else ""
                if text[:1] in ("{", "["):
                    results.append({"value": text})
                elif text == "undefined":
                    results.append({"undefined": True})
                else:
                    results.append({"error": _error_text(_lib.regoOutputNode(out))})
            finally:
                _free_output(out)
        self.send(P.OP_OK, json.dumps({"results": results}).encode("utf-8"))


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


def _bench(n: int) -> None:
    """Raw in-process evaluation, for bench.py: bundle + input on stdin, timings on stdout."""
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
        doc = json.loads(body)
        p = _new_input()
        try:
            _add(p, doc)
            _set_input(runtime._impl, p)
        finally:
            _free_input(p)
        out = _query_entrypoint(runtime._impl, bundle._impl, ep_bytes)
        try:
            return json.loads(_rs.rego_output_string(out))
        finally:
            _free_output(out)

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


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--bench":
        _bench(int(argv[1]))
        return 0
    fd = int(argv[0])
    test_hooks = "--test-hooks" in argv
    # No RLIMIT_AS/RLIMIT_DATA: rego-cpp's allocator (snmalloc) reserves ~256 GB of address space
    # at start-up and aborts under either limit. The pool watches resident memory instead.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not write a core file
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the kernel's to handle
    sock = socket.socket(fileno=fd)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the kernel went away
        Worker(sock, test_hooks=test_hooks).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
