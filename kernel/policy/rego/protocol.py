"""The kernel ↔ Rego worker wire format: length-prefixed frames over a Unix socketpair.

Stdlib only: the worker loads this file by path after importing regopy, and the kernel imports it
as a module, so it must not pull in anything else of ours.

A frame is a 5-byte header (big-endian payload length, one op byte) followed by the payload.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">IB")
MAX_FRAME_BYTES = 64 * 1024 * 1024
KEY_BYTES = 64  # a bundle key is the 64-hex SHA-256 content digest

# kernel → worker
OP_LOAD = 1  # JSON {"key", "modules", "data", "entrypoint", "names"[, "entrypoints", "strict"]}
OP_EVAL = 2  # key (64 ASCII bytes) + input document JSON
OP_EVAL_PRINTS = 3  # as OP_EVAL, keeping what the policy's print() calls wrote (policy eval --explain)
OP_LAST_PRINTS = 4  # → OP_OK with the print() output of the last OP_EVAL_PRINTS (UTF-8, ≤ 64 KiB)
# key + JSON {"input": DOC, "entrypoints": [...]} → OP_OK JSON {"results": [R, ...]}, one R per
# entrypoint: {"value": TEXT} (rego-cpp's rendering), {"undefined": true} or {"error": MESSAGE}.
# The traces, line coverage and error locations of the instrumented twins (instrument.py).
OP_PROBE = 5
# key + JSON {"inputs": [DOC, ...][, "entrypoint": NAME]} → OP_OK JSON {"results": [R, ...]}, one R
# per document as for OP_PROBE: the bundle's entrypoint (or NAME) evaluated on each in turn (the
# policy test runner's cases, in batches; with --coverage, the twin's combined probe).
OP_EVAL_BATCH = 6

# worker → kernel
OP_HELLO = 10  # JSON capabilities, sent once at start-up
OP_OK = 11  # JSON (load) or empty
OP_FAIL = 12  # JSON {"error", ...}
OP_VALUE = 13  # the entrypoint's output, as rego-cpp renders it: {"expressions":[VALUE]}
OP_UNDEFINED = 14  # the entrypoint is undefined for this input
OP_MISSING = 15  # the worker does not hold this bundle (never loaded, or evicted)

# Inputs carrying this key in `args` make a worker started with test hooks fault on purpose; a
# bundle whose data.json maps it to "forget" is dropped by such a worker as soon as it loads.
TEST_FAULT_KEY = "__regent_test_fault__"


def frame(op: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), op) + payload
