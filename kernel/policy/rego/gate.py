"""The Rego load gate: every reason a bundle is refused at store time, one line per problem.

Structure (roots, packages, data, entrypoint, calls) is checked here in the kernel; compilation
happens in a worker, because rego-cpp must never run in the kernel process. rego-cpp's compiler is
lenient (it accepts calls to functions it lacks and entrypoints that do not exist, and answers
"undefined" at evaluation), so the structural checks are what make those load errors.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .bundle import RegoBundle, bundle_error, load_rego_bundle, parse_rego_bundle
from .engine import CompileReport, RegoEngine
from .scan import scan_module
from .v0_syntax import v1_problems

__all__ = ["UNSUPPORTED_BUILTINS", "compile_rego_bundle", "dialect_problems", "rewrite_notes", "static_problems"]

# Builtins rego-cpp does not implement (regopy-notes.md); it compiles calls to them and then
# quietly answers "undefined", so a policy would silently lose whatever the call decided.
UNSUPPORTED_BUILTINS = frozenset(
    {
        "http.send",
        "json.match_schema",
        "json.verify_schema",
        "providers.aws.sign_req",
        "rego.metadata.chain",
        "rego.metadata.rule",
        "rego.parse_module",
        "strings.render_template",
        "crypto.x509.parse_and_verify_certificates_with_options",
    }
)
UNSUPPORTED_PREFIXES = ("net.", "graphql.")
# Compiled and evaluated by rego-cpp, although `is_builtin` does not list them.
_SPECIAL_CALLS = frozenset({"print", "set"})


def compile_rego_bundle(
    source: RegoBundle | Mapping[str, Any] | str | os.PathLike[str],
    *,
    engine: RegoEngine | None = None,
    strict: bool = False,
) -> RegoBundle:
    """Load (if needed) and gate a bundle; returns it ready to evaluate or raises
    ValidationError("invalid policy bundle: <one line per problem>").

    ``strict`` adds OPA's strict-mode checks that can be made here (unused and duplicate imports,
    deprecated builtins) and returns the bundle's strict variant, which rego-cpp evaluates with
    strict builtin errors (a builtin's type error or a division by zero is an error, not undefined).

    Compiles in `engine`'s workers (which then hold the compiled copy); without one, a
    single-worker engine is started for the check and closed after it.
    """
    if isinstance(source, RegoBundle):
        bundle = source
    elif isinstance(source, Mapping):
        bundle = parse_rego_bundle(source)
    else:
        bundle = load_rego_bundle(source)
    own = engine is None
    runner = engine or RegoEngine(size=1)
    try:
        report = runner.compile(bundle)
        unavailable = set(runner.capabilities.get("unavailable", []))
    finally:
        if own:
            runner.close()
    problems = static_problems(bundle, report=report, unavailable=unavailable)
    if strict:
        problems += strict_problems(bundle)
    if problems:
        raise bundle_error(problems)
    return bundle.variant(strict=True) if strict else bundle


# OPA's deprecated builtins (an error in OPA's strict mode; rego-cpp 1.5.2 has none of them).
DEPRECATED_BUILTINS = {
    "any": "use `some x in xs` or `count(…) > 0`",
    "all": "use `every x in xs`",
    "re_match": "use regex.match",
    "net.cidr_overlap": "use net.cidr_contains",
    "set_diff": "use the - operator",
    "cast_array": "", "cast_set": "", "cast_string": "", "cast_boolean": "", "cast_null": "",
    "cast_object": "",
}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strict_problems(bundle: RegoBundle) -> list[str]:
    """OPA strict-mode errors that a lexical scan can find: duplicate and unused imports.
    (OPA's deprecated builtins are refused without --strict: rego-cpp has none of them.)"""
    problems = []
    for path, source in bundle.modules.items():
        shown = bundle.display_path(path)
        scan = bundle.scans[path]
        seen: dict[str, int] = {}
        for number, text in enumerate(source.splitlines(), start=1):
            stripped = text.strip()
            if not stripped.startswith("import "):
                continue
            ref = stripped.split("#", 1)[0].split()[1] if len(stripped.split()) > 1 else ""
            if ref in seen:
                problems.append(f"{shown}:{number}:1: import {ref} is a duplicate of line {seen[ref]} (strict)")
            seen.setdefault(ref, number)
        body_words = _words_outside_imports(source)
        for alias, ref in scan.imports.items():
            if ref in ("rego.v1",) or ref.startswith("future."):
                continue
            if alias not in body_words:
                line = seen.get(ref, 0)
                problems.append(f"{shown}:{line}:1: import {ref} is never used (strict)")
    return problems


def _words_outside_imports(source: str) -> set[str]:
    words: set[str] = set()
    for text in source.splitlines():
        if text.strip().startswith(("import ", "package ")):
            continue
        words.update(_WORD.findall(text.split("#", 1)[0]))
    return words


def static_problems(
    bundle: RegoBundle,
    *,
    report: CompileReport | None = None,
    unavailable: Iterable[str] = (),
) -> list[str]:
    """Every problem with `bundle`; `report` is a worker's compile result, when there is one."""
    problems = _root_problems(bundle) + dialect_problems(bundle)
    if report is not None:
        problems += _compile_problems(bundle, report)
    problems += _call_problems(bundle, report.builtins if report else {}, set(unavailable))
    problems += _format_problems(bundle)
    problems += _entrypoint_problems(bundle)
    return problems


def dialect_problems(bundle: RegoBundle) -> list[str]:
    """OPA v0 heads, names OPA v1 reserves (v0_syntax.py) and idioms no rewrite can carry over
    (idioms.py), each with where it is and how OPA v1 writes it."""
    out = []
    for path, source in bundle.modules.items():
        shown = bundle.display_path(path)
        found = v1_problems(source) + list(bundle.idioms[path].problems)
        out += [f"{shown}:{line}:{col}: {message}" for line, col, message in sorted(found)]
    return out


def rewrite_notes(bundle: RegoBundle) -> list[str]:
    """What idioms.py rewrote at load (`regent policy check` prints these as notes)."""
    return [
        f"{bundle.display_path(path)}:{line}:{col}: {message}"
        for path, rewrite in bundle.idioms.items()
        for line, col, message in rewrite.notes
    ]


def _under(path: str, root: str) -> bool:
    return root == "" or path == root or path.startswith(root + "/")


def _root_problems(bundle: RegoBundle) -> list[str]:
    problems = []
    roots = bundle.roots
    for i, a in enumerate(roots):
        for b in roots[i + 1 :]:
            if _under(a, b) or _under(b, a):
                problems.append(f".manifest: roots {a!r} and {b!r} overlap")
    for path, scan in bundle.scans.items():
        shown = bundle.display_path(path)
        if not scan.package:
            problems.append(f"{shown}: no package declaration")
            continue
        data_path = scan.package.removeprefix("data.").replace(".", "/")
        if not any(_under(data_path, r) for r in roots):
            problems.append(
                f"{shown}:{scan.package_line}:1: package {scan.package} is outside the "
                f"manifest roots {list(roots)}"
            )
    problems += _data_problems(bundle, [], bundle.data)
    return problems


def _data_problems(bundle: RegoBundle, at: list[str], value: Any) -> list[str]:
    path = "/".join(at)
    if any(_under(path, r) for r in bundle.roots):
        return []
    if isinstance(value, dict) and any(r.startswith(path + "/") or not path for r in bundle.roots):
        out: list[str] = []
        for k, v in value.items():
            out += _data_problems(bundle, [*at, k], v)
        return out
    return [f"data: {path or '(root)'} is outside the manifest roots {list(bundle.roots)}"]


def _compile_problems(bundle: RegoBundle, report: CompileReport) -> list[str]:
    problems = []
    for err in report.errors:
        file = bundle.display_path(err.file) if err.file else ""
        problems.append(str(type(err)(err.message, file, err.line, err.col)))
    if report.crash:
        problems.append(f"the Rego compiler {report.crash} on this bundle")
        for path, scan in bundle.scans.items():
            for line, col in scan.whole_input_with:
                problems.append(
                    f"{bundle.display_path(path)}:{line}:{col}: `with input as …` replaces the "
                    "whole input document, which crashes rego-cpp; use `with input.<field> as …`"
                )
    return problems


def _call_problems(
    bundle: RegoBundle, builtins: dict[str, bool], unavailable: set[str]
) -> list[str]:
    heads_by_package: dict[str, set[str]] = {}
    for scan in bundle.scans.values():
        heads_by_package.setdefault(scan.package, set()).update(scan.heads)
    problems = []
    for path, scan in bundle.scans.items():
        shown = bundle.display_path(path)
        local = heads_by_package.get(scan.package, set())
        for call in scan.calls:
            name = call.name
            where = f"{shown}:{call.line}:{call.col}"
            if name in UNSUPPORTED_BUILTINS or name.startswith(UNSUPPORTED_PREFIXES):
                problems.append(f"{where}: builtin {name} is not supported by rego-cpp")
            elif name in unavailable:
                problems.append(
                    f"{where}: builtin {name} is not available in this rego-cpp build "
                    "(it failed the start-up probe)"
                )
            elif (
                name.startswith("data.")
                or name.split(".", 1)[0] in scan.imports
                or name in local
                or name in _SPECIAL_CALLS
            ):
                continue
            elif name in DEPRECATED_BUILTINS and builtins.get(name) is not True:
                hint = DEPRECATED_BUILTINS[name]
                problems.append(f"{where}: builtin {name} is deprecated in OPA and rego-cpp does not have it"
                                + (f"; {hint}" if hint else ""))
            elif builtins.get(name) is False:
                problems.append(f"{where}: unknown function {name}")
    return problems


# sprintf verbs and flags rego-cpp 1.5.2 does not implement: it prints the verb literally (`%q`
# gives "%q") or drops the flag, so a reason or a key built with one is silently wrong.
_UNSUPPORTED_VERBS = {
    "q": 'it prints "%q" literally (quote with \\"%s\\" instead)',
    "T": 'it prints "%T" literally (use type_name(x))',
    "c": 'it prints "%c" literally',
    "U": 'it prints "%U" literally',
    "b": "the evaluation fails",
}
_VERB = re.compile(r"%([-+# 0]*)(\d+|\*)?(?:\.(\d+|\*))?([A-Za-z%])")


def format_problems(fmt: str) -> list[str]:
    """What rego-cpp would get wrong in a sprintf format string."""
    found = []
    for m in _VERB.finditer(fmt):
        flags, verb = m.group(1), m.group(4)
        if verb in _UNSUPPORTED_VERBS:
            found.append(f"sprintf verb %{verb} is not supported by rego-cpp: {_UNSUPPORTED_VERBS[verb]}")
        elif "-" in flags:
            found.append(f"sprintf flag - in {m.group()} is ignored by rego-cpp (no left-justified padding)")
    return found


def _format_problems(bundle: RegoBundle) -> list[str]:
    # The author's text, not what rego-cpp runs: guards.py renames `sprintf` to its helper.
    return [
        f"{bundle.display_path(path)}:{line}:{col}: {problem}"
        for path, source in bundle.modules.items()
        for line, col, fmt in scan_module(source).formats
        for problem in format_problems(fmt)
    ]


def _entrypoint_problems(bundle: RegoBundle) -> list[str]:
    segments = bundle.entrypoint.split("/")
    for scan in bundle.scans.values():
        package = scan.package.removeprefix("data.")
        for k in range(1, len(segments)):
            if package == ".".join(segments[:k]) and ".".join(segments[k:]) in scan.heads:
                return []
    package, rule = ".".join(segments[:-1]), segments[-1]
    return [
        f".manifest: entrypoint {bundle.entrypoint} is not defined: no module declares rule "
        f"{rule} in package {package}"
    ]
