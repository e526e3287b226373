"""Rego bundles in OPA's layout, from a directory, a `.tar.gz` or an in-memory mapping.

A bundle is `.manifest` (revision, roots, metadata.regent.{entrypoint, default_action}), `*.rego`
modules (`*_test.rego` skipped) and `data.json` / `data.yaml` files whose directory is their data
path, as in OPA. Loading checks structure only; `gate.compile_rego_bundle` is the load gate.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from kernel import yamldoc
from kernel.domain.decision import Verdict

from .bundle_files import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_FILES,
    MAX_TAR_BYTES,
    bundle_error,
    read_directory,
    read_tarball,
    safe_path,
    wanted,
)
from .idioms import IdiomRewrite, rewrite_idioms
from .instrument import Instrumented, instrument
from .scan import ModuleScan, scan_module

__all__ = [
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_FILES",
    "RegoBundle",
    "bundle_error",
    "load_rego_bundle",
    "parse_rego_bundle",
    "parse_rego_tarball",
]

_MANIFEST_KEYS = {"revision", "roots", "metadata", "rego_version", "wasm"}
_REGENT_KEYS = {"entrypoint", "default_action"}
_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, eq=False)
class RegoBundle:
    """A Rego bundle's content. `digest` (SHA-256 of the canonical content) keys compiled copies;
    `revision` is what decisions record (the manifest's, else the digest). Bundles are equal
    when their content is."""

    modules: Mapping[str, str]  # bundle path → Rego source
    data: dict[str, Any]
    manifest: dict[str, Any]
    revision: str
    digest: str
    roots: tuple[str, ...]
    entrypoint: str  # "shell/decision"
    default_action: Verdict
    size_bytes: int
    origin: str = ""  # directory or tarball path it came from, "" for a mapping
    from_directory: bool = field(default=False, repr=False)
    strict: bool = False  # evaluated with rego-cpp's strict builtin errors (`--strict`)
    extra_entrypoints: tuple[str, ...] = field(default=(), repr=False)  # built beside `entrypoint`

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RegoBundle) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def display_path(self, file: str) -> str:
        """How problems name a bundle file: under its directory when loaded from one."""
        return os.path.join(self.origin, file) if self.from_directory else file

    @cached_property
    def idioms(self) -> dict[str, IdiomRewrite]:
        """Each module as rego-cpp is given it (idioms.py: OPA idioms rewritten, same lines)."""
        return {path: rewrite_idioms(source) for path, source in self.modules.items()}

    @cached_property
    def runnable_modules(self) -> dict[str, str]:
        """What rego-cpp compiles: the author's modules (`modules`, what is stored, signed and
        shown) with the load-time rewrites of idioms.py applied."""
        return {path: rewrite.source for path, rewrite in self.idioms.items()}

    @cached_property
    def scans(self) -> dict[str, ModuleScan]:
        return {path: scan_module(source) for path, source in self.runnable_modules.items()}

    def variant(self, *, strict: bool | None = None) -> RegoBundle:
        """The same bundle evaluated with rego-cpp's strict builtin errors (its own worker key)."""
        strict = self.strict if strict is None else strict
        if strict == self.strict:
            return self
        return replace(self, strict=strict, digest=_derived(self.digest, f"strict={strict}"))

    @cached_property
    def instrumented(self) -> tuple[RegoBundle, Instrumented]:
        """The probed twin (see instrument.py) and how to read its probes; same revision."""
        probes = instrument(dict(self.runnable_modules), self.entrypoint)
        twin = replace(
            self,
            modules=probes.modules,
            digest=_derived(self.digest, "instrumented"),
            extra_entrypoints=probes.entrypoints,
        )
        return twin, probes

    @cached_property
    def worker_payload(self) -> bytes:
        """What a worker needs to compile this bundle (see worker.Worker.load)."""
        names = sorted({c.name for s in self.scans.values() for c in s.calls})
        return json.dumps(
            {
                "key": self.digest,
                "modules": self.runnable_modules,
                "data": self.data,
                "entrypoint": self.entrypoint,
                "names": names,
                **({"entrypoints": list(self.extra_entrypoints)} if self.extra_entrypoints else {}),
                **({"strict": True} if self.strict else {}),
            },
            ensure_ascii=False,
        ).encode("utf-8")


def _from_directory(root: Path) -> RegoBundle:
    return _from_files(read_directory(root), origin=str(root), from_directory=True)


def load_rego_bundle(path: str | os.PathLike[str]) -> RegoBundle:
    """Read a bundle directory or tarball from disk; raises ValidationError."""
    p = Path(path)
    if p.is_dir():
        return _from_directory(p)
    if not p.is_file():
        raise bundle_error(f"{p}: no such bundle directory or tarball")
    if p.stat().st_size > MAX_TAR_BYTES:
        raise bundle_error(f"{p}: tarball is larger than {MAX_TAR_BYTES} bytes")
    return parse_rego_tarball(p.read_bytes(), origin=str(p))


def parse_rego_bundle(mapping: Mapping[str, Any]) -> RegoBundle:
    """A bundle given in memory: {"modules": {path: source}, "data": {...}, "manifest": {...}}."""
    if not isinstance(mapping, Mapping):
        raise bundle_error("a bundle must be an object with modules, data and manifest")
    problems = [
        f"unknown bundle key {k!r}" for k in mapping if k not in ("modules", "data", "manifest")
    ]
    modules_in = mapping.get("modules") or {}
    data = mapping.get("data") or {}
    manifest = mapping.get("manifest") or {}
    if not isinstance(modules_in, Mapping):
        problems.append("modules must be an object of path → Rego source")
        modules_in = {}
    if not isinstance(data, dict):
        problems.append("data must be an object")
        data = {}
    if not isinstance(manifest, dict):
        problems.append("manifest must be an object")
        manifest = {}
    modules: dict[str, str] = {}
    for raw_path, source in modules_in.items():
        path = safe_path(raw_path, problems)
        if path is None:
            continue
        if not path.endswith(".rego"):
            problems.append(f"{path}: module paths must end in .rego")
        elif not isinstance(source, str):
            problems.append(f"{path}: module source must be a string")
        elif not path.endswith("_test.rego"):
            modules[path] = source
    size = sum(len(s.encode("utf-8")) for s in modules.values()) + len(_canonical(data))
    return _build(modules, data, manifest, size, problems, origin="")


def parse_rego_tarball(raw: bytes, *, origin: str = "") -> RegoBundle:
    """A `.tar.gz` (or plain `.tar`) bundle, read in memory; nothing is written to disk."""
    files = read_tarball(raw, origin or "tarball")
    return _from_files(files, origin=origin, from_directory=False)


def _from_files(files: dict[str, bytes], *, origin: str, from_directory: bool) -> RegoBundle:
    problems: list[str] = []
    manifest: dict[str, Any] = {}
    modules: dict[str, str] = {}
    data: dict[str, Any] = {}
    size = sum(len(v) for v in files.values())
    for path in sorted(files):
        raw = files[path]
        if not wanted(path):
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{path}: not UTF-8 text")
            continue
        if path == ".manifest":
            try:
                manifest = json.loads(text)
            except ValueError as exc:
                problems.append(f".manifest: not valid JSON ({exc})")
                continue
            if not isinstance(manifest, dict):
                problems.append(".manifest: must be a JSON object")
                manifest = {}
        elif path.endswith(".rego"):
            modules[path] = text
        else:
            try:
                value = json.loads(text) if path.endswith(".json") else yamldoc.safe_load(text)
            except yaml.YAMLError as exc:
                problems.append(f"cannot be parsed: {yamldoc.describe_error(path, exc)}")
                continue
            except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
                problems.append(f"{path}: cannot be parsed ({' '.join(str(exc).split())})")
                continue
            if value is None:
                continue
            prefix = [s for s in posixpath.dirname(path).split("/") if s]
            _merge_at(data, prefix, value, path, problems)
    return _build(
        modules, data, manifest, size, problems, origin=origin, from_directory=from_directory
    )


def _merge_at(
    data: dict[str, Any], prefix: list[str], value: Any, path: str, problems: list[str]
) -> None:
    node = data
    for seg in prefix:
        nxt = node.setdefault(seg, {})
        if not isinstance(nxt, dict):
            problems.append(
                f"{path}: data path {'/'.join(prefix)} conflicts with another data file"
            )
            return
        node = nxt
    if not prefix and not isinstance(value, dict):
        problems.append(f"{path}: a root data file must hold an object")
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: data files must hold an object")
        return
    _deep_merge(node, value, path, prefix, problems)


def _deep_merge(
    into: dict[str, Any], value: dict[str, Any], path: str, at: list[str], problems: list[str]
) -> None:
    for k, v in value.items():
        if not isinstance(k, str):
            problems.append(f"{path}: data keys must be strings (got {k!r})")
            continue
        if k in into:
            if isinstance(into[k], dict) and isinstance(v, dict):
                _deep_merge(into[k], v, path, [*at, k], problems)
            else:
                problems.append(f"{path}: data at {'/'.join([*at, k])} is defined twice")
        else:
            into[k] = v


def _build(
    modules: dict[str, str],
    data: dict[str, Any],
    manifest: dict[str, Any],
    size: int,
    problems: list[str],
    *,
    origin: str,
    from_directory: bool = False,
) -> RegoBundle:
    if size > MAX_BUNDLE_BYTES:
        problems.append(f"bundle is larger than {MAX_BUNDLE_BYTES} bytes ({size})")
    for path, source in modules.items():
        if "\x00" in source:
            problems.append(f"{path}: contains a NUL character")
    try:
        _canonical(data)
    except (TypeError, ValueError) as exc:
        problems.append(f"data is not JSON-compatible ({exc})")
        data = {}
    roots, entrypoint, default_action, revision = _manifest_fields(_implied_roots(manifest, modules), problems)
    if problems:
        raise bundle_error(problems)
    digest = hashlib.sha256(
        _canonical({"modules": modules, "data": data, "manifest": manifest})
    ).hexdigest()
    return RegoBundle(
        modules=dict(sorted(modules.items())),
        data=data,
        manifest=manifest,
        revision=revision or digest,
        digest=digest,
        roots=roots,
        entrypoint=entrypoint,
        default_action=default_action,
        size_bytes=size,
        origin=origin,
        from_directory=from_directory,
    )


def _implied_roots(manifest: dict[str, Any], modules: dict[str, str]) -> dict[str, Any]:
    """A bundle without a manifest (or one naming neither `roots` nor an entrypoint) is rooted at
    its modules' top-level package when they all share one: `package payments` gives the root
    `payments` and the entrypoint `payments/decision`, as the manifest would have said."""
    metadata = manifest.get("metadata")
    regent = metadata.get("regent") if isinstance(metadata, dict) else None
    if "roots" in manifest or (isinstance(regent, dict) and regent.get("entrypoint")):
        return manifest
    tops = {scan_module(source).package.split(".", 1)[0] for source in modules.values()}
    tops.discard("")
    if len(tops) != 1:
        return manifest
    return {**manifest, "roots": [tops.pop()]}


def _manifest_fields(
    manifest: dict[str, Any], problems: list[str]
) -> tuple[tuple[str, ...], str, Verdict, str]:
    for key in manifest:
        if key not in _MANIFEST_KEYS:
            problems.append(f".manifest: unknown key {key!r}")
    if manifest.get("rego_version", 1) != 1:
        problems.append(".manifest: only Rego v1 bundles are supported (rego_version 1)")
    revision = manifest.get("revision", "")
    if not isinstance(revision, str):
        problems.append(".manifest: revision must be a string")
        revision = ""
    raw_roots = manifest.get("roots", [""])
    roots: tuple[str, ...] = ()
    if not isinstance(raw_roots, list) or not all(isinstance(r, str) for r in raw_roots):
        problems.append(".manifest: roots must be a list of strings")
    else:
        roots = tuple(r.strip("/") for r in raw_roots)
    metadata = manifest.get("metadata", {})
    regent = metadata.get("regent", {}) if isinstance(metadata, dict) else None
    if not isinstance(metadata, dict) or not isinstance(regent, dict):
        problems.append(".manifest: metadata.regent must be an object")
        regent = {}
    for key in regent:
        if key not in _REGENT_KEYS:
            problems.append(f".manifest: unknown key metadata.regent.{key}")
    action = regent.get("default_action", "deny")
    if action in ("", None):
        action = "deny"
    if action not in ("allow", "deny"):
        problems.append(
            f'.manifest: metadata.regent.default_action must be "allow" or "deny", not {action!r}'
        )
        action = "deny"
    entrypoint = regent.get("entrypoint", "")
    if not isinstance(entrypoint, str):
        problems.append(".manifest: metadata.regent.entrypoint must be a string")
        entrypoint = ""
    entrypoint = entrypoint.strip("/")
    if entrypoint.startswith("data/"):
        entrypoint = entrypoint[len("data/") :]
    if not entrypoint:
        named = [r for r in roots if r]
        if len(named) == 1 and len(roots) == 1:
            entrypoint = f"{named[0]}/decision"
        else:
            problems.append(
                ".manifest: metadata.regent.entrypoint is required unless the bundle has exactly "
                f"one root (roots: {list(roots)}); a bundle without roots takes its modules' "
                "top-level package as its root when they all share one"
            )
    elif not all(_SEGMENT.match(s) for s in entrypoint.split("/")) or "/" not in entrypoint:
        problems.append(
            f'.manifest: entrypoint {entrypoint!r} must be a rule path such as "shell/decision"'
        )
    return roots, entrypoint, Verdict(action), revision


def _derived(digest: str, what: str) -> str:
    return hashlib.sha256(f"{digest}:{what}".encode()).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
