"""rego-cpp through its C API, for the worker processes: input documents, outputs, error text,
rego-cpp's own stdout, and the start-up probe of what this build has.

Loaded by path by `worker.py` and `rawbench.py`, after they imported regopy; the kernel never
imports this file (it must not load regopy: see regopy-notes.md).
"""

# ruff: noqa: I001
from __future__ import annotations

import regopy  # already imported first by the script that loads this file (hazard 3)
from regopy import rego_shared as _rs

import ctypes
import json
import json.encoder
import os
import tempfile
from typing import Any

__all__ = [
    "BadInput",
    "StdoutCapture",
    "add_value",
    "error_text",
    "last_error",
    "probe_capabilities",
    "query_entrypoint",
    "query_output",
    "set_empty_input",
    "set_input",
    "set_input_text",
]


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
_set_input_term = _lib.regoSetInputTerm
_query_entrypoint = _lib.regoBundleQueryEntrypoint
_output_ok = _lib.regoOutputOk
_free_output = _lib.regoFreeOutput
_INT64 = (-(1 << 63), (1 << 63) - 1)
_escape = json.encoder.encode_basestring  # type: ignore[attr-defined]
# Object keys repeat from one input document to the next (agent_id, kind, args, …): each one is
# escaped and encoded once.
_KEYS: dict[str, bytes] = {}
_MAX_KEYS = 4096

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


class BadInput(Exception):
    pass


class _NeedsText(Exception):
    """A value the builder cannot carry whole (a float, a big integer, a non-empty array): the
    document goes in as JSON text instead."""


def add_value(p: int, v: Any) -> None:
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
            key = _KEYS.get(k)
            if key is None:
                key = _escape(k)[1:-1].encode("utf-8")
                if len(_KEYS) < _MAX_KEYS and len(k) <= 64:
                    _KEYS[k] = key
            if _in_str(p, key):
                raise BadInput("rego-cpp rejected an object key")
            add_value(p, x)
            if _in_item(p):
                raise BadInput("rego-cpp rejected an object item")
        rc = _in_object(p, len(v))
    elif t is list:
        if v:
            # regoInputArray leaves its items unwrapped (no Term node): rego-cpp 1.5.2 then fails
            # to render them, so json.marshal(input.args) is undefined and an error is printed
            # on stdout. Read from JSON text, arrays are whole.
            raise _NeedsText
        rc = _in_array(p, 0)
    elif t is bool:
        rc = _in_bool(p, v)
    elif t is int:
        if not _INT64[0] <= v <= _INT64[1]:
            raise _NeedsText  # rego-cpp holds big integers exactly when it reads them as text
        rc = _in_int(p, v)
    elif t is float:
        # regoInputFloat formats the double with six decimals (1000.0000004 became 1000.0, 4e-7
        # became 0); read from JSON text, rego-cpp keeps every digit Python's repr writes (the
        # kernel answers the numbers rego-cpp cannot compute with first: kernel/policy/numbers.py).
        raise _NeedsText
    elif v is None:
        rc = _in_null(p)
    else:
        raise BadInput(f"unsupported JSON value of type {t.__name__}")
    if rc:
        raise BadInput(f"rego-cpp rejected a value (code {rc})")


def error_text(node: int) -> str:
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


class StdoutCapture:
    """Send fd 1 to a temp file for a while: rego-cpp prints its readable error report there."""

    def __enter__(self) -> StdoutCapture:
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


def probe_capabilities() -> dict[str, Any]:
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


def query_output(out: int) -> tuple[str, str]:
    """Read (and free) an entrypoint query's output: ("value", rego-cpp's JSON rendering),
    ("undefined", "") or ("error", message)."""
    try:
        try:
            text = _rs.rego_output_string(out) if _output_ok(out) else ""
        except UnicodeDecodeError:
            # rego-cpp's regexes work on bytes: `regex.find_n(".", "é", -1)` or
            # `regex.replace("é", "", "-")` splits a character, and reading that value killed the
            # worker (exit status 1) on every evaluation; it is an evaluation error instead.
            return "error", "rego-cpp returned a string that is not valid UTF-8 (a regex split a multi-byte character)"
        if text[:1] in ("{", "["):
            return "value", text
        if text == "undefined":
            return "undefined", ""
        return "error", error_text(_lib.regoOutputNode(out))
    finally:
        _free_output(out)


def set_input(runtime: Any, document: Any, text: bytes | None = None) -> None:
    """Give ``document`` (decoded JSON) to ``runtime`` as its input; raises BadInput (or
    UnicodeEncodeError) when rego-cpp cannot take it.

    Documents of objects, strings, int64 integers, booleans and null go through the C builder
    (about 50 µs for a step's document, a third of what rego-cpp's JSON parser takes). One holding
    a float, a bigger integer or a non-empty array goes in as JSON text (``text``, the compact
    ensure_ascii=False encoding of ``document``, or made here), which rego-cpp reads digit for
    digit; the text holds strings escaped exactly as the builder does, so both ways give rego-cpp
    the same values (tests/policy/test_differential.py compares them on generated documents).
    """
    if not _needs_text(document):
        p = _new_input()
        try:
            try:
                add_value(p, document)
            except _NeedsText:
                pass  # nested past the look-ahead's reach
            else:
                if _set_input(runtime._impl, p):
                    raise BadInput("rego-cpp rejected the input document")
                return
        finally:
            _free_input(p)
    if text is None:
        try:
            text = json.dumps(document, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode("utf-8")
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    set_input_text(runtime, text)


def _needs_text(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` holds what the builder cannot carry (see add_value): a look-ahead of a few
    µs that spares a text document the half-built input (up to 50 µs of C calls)."""
    t = type(v)
    if t is dict:
        if depth > 64:
            return False  # add_value still raises _NeedsText if it must
        for x in v.values():
            tx = type(x)
            if tx is str or tx is bool or x is None:
                continue
            if tx is int:
                if not _INT64[0] <= x <= _INT64[1]:
                    return True
                continue
            if _needs_text(x, depth + 1):
                return True
        return False
    if t is list:
        return bool(v)
    if t is float:
        return True
    return t is int and not _INT64[0] <= v <= _INT64[1]


def set_input_text(runtime: Any, text: bytes) -> None:
    """Give ``text`` (JSON, compact, ensure_ascii=False) to ``runtime`` as its input."""
    if b"\x00" in text:
        raise BadInput("the input text holds a NUL byte")  # C string: it would end the term there
    if _set_input_term(runtime._impl, text):
        raise BadInput(f"rego-cpp rejected the input document: {last_error(runtime)[:200]}")


def query_entrypoint(runtime: Any, bundle: Any, entrypoint: bytes) -> int:
    """The output handle of one entrypoint query (0 when rego-cpp gave none; see last_error)."""
    return int(_query_entrypoint(runtime._impl, bundle._impl, entrypoint) or 0)


def last_error(runtime: Any) -> str:
    return str(_rs.rego_get_error(runtime._impl) or "")


def set_empty_input(runtime: Any) -> None:
    p = _new_input()
    try:
        _in_object(p, 0)
        _set_input(runtime._impl, p)
    finally:
        _free_input(p)
