"""The Rego engine: bundles in OPA's layout, a load gate, and evaluation in worker processes.

The kernel process never imports regopy; only the scripts run as child processes do: `worker.py` (with
`native.py`, its rego-cpp glue), `rawbench.py` and `kernel/policy/testing/rego_child.py`.
"""

from .bundle import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_FILES,
    RegoBundle,
    load_rego_bundle,
    parse_rego_bundle,
    parse_rego_tarball,
)
from .decision import decision_from_output
from .document import input_document
from .engine import DEFAULT_TIMEOUT_SECONDS, CompileReport, RegoEngine
from .gate import UNSUPPORTED_BUILTINS, compile_rego_bundle

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_FILES",
    "UNSUPPORTED_BUILTINS",
    "CompileReport",
    "RegoBundle",
    "RegoEngine",
    "compile_rego_bundle",
    "decision_from_output",
    "input_document",
    "load_rego_bundle",
    "parse_rego_bundle",
    "parse_rego_tarball",
]
