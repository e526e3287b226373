"""Discovery and loading for the policy test runner: which bundles a PATH names (YAML files, Rego
directories or tarballs, or a tree such as `bundles/` + `policy_tests/`) and which tests each has."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.errors import ValidationError
from kernel.policy.resolver import RegoCompiled, yaml_revision

_RULE_ID = re.compile(r'"rule_id"\s*:\s*"([^"]+)"')


@dataclass
class LoadedBundle:
    path: Path
    kind: str  # yaml | rego
    compiled: Any  # CompiledBundle
    rule_ids: tuple[str, ...]
    shadowed: list[tuple[str, str]] = field(default_factory=list)  # YAML: (rule, shadowed by)
    modules: dict[str, str] = field(default_factory=dict)  # Rego: path → source
    data: dict[str, Any] = field(default_factory=dict)


def _is_rego(p: Path) -> bool:
    if p.is_dir():
        # A bundle root has a .manifest or policy files of its own (a tree like bundles/ has neither).
        return (p / ".manifest").exists() or any(not x.name.endswith("_test.rego") for x in p.glob("*.rego"))
    return p.name.endswith((".tar.gz", ".tgz"))


def discover(paths: list[str]) -> list[Path]:
    """Bundles named by PATHs, in order; a directory that is not itself a Rego bundle is searched."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ValidationError(f"{p}: no such file or directory")
        if p.is_dir() and not _is_rego(p):
            for x in sorted(p.iterdir()):
                if _wanted_in_tree(x):
                    found.append(x)
        else:
            found.append(p)
    return found


def _wanted_in_tree(x: Path) -> bool:
    if x.is_dir():
        return x.name != "policy_tests" and _is_rego(x)
    if x.suffix in (".yaml", ".yml"):
        return not x.name.endswith(".policytest.yaml") and x.name != "regent.yaml"
    return _is_rego(x)


def rego_rule_ids(modules: dict[str, str]) -> tuple[str, ...]:
    """Rule ids a Rego bundle can produce: the string literals given as `"rule_id"`, in order."""
    seen: dict[str, None] = {}
    for source in modules.values():
        for rid in _RULE_ID.findall(source):
            seen.setdefault(rid)
    return tuple(seen)


def load_bundle(path: Path, rego_engine: Any, *, strict: bool = False) -> LoadedBundle:
    """Compile a bundle through the same load gate the kernel uses; ValidationError names the file.

    ``strict``: Rego bundles get the strict-mode checks and strict builtin errors, and literal
    times rego-cpp cannot parse become load errors; a YAML bundle's authoring warnings (`lints`)
    become load errors.
    """
    yaml_text: str | None = None
    if path.name.endswith((".tar.gz", ".tgz")):
        from kernel.policy.signature import read_bundle_files, yaml_bundle_file

        files = read_bundle_files(path)  # a tarball holding one YAML bundle (as a bundle server serves it)
        name = yaml_bundle_file(files)
        if name is not None:
            try:
                yaml_text = files[name].decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError(f"{path}: {name}: a YAML bundle must be UTF-8 text") from None
    if yaml_text is None and (path.is_dir() or path.name.endswith((".tar.gz", ".tgz"))):
        from kernel.policy.rego import compile_rego_bundle, load_rego_bundle

        try:
            bundle = compile_rego_bundle(load_rego_bundle(path), engine=rego_engine.get(), strict=strict)
        except ValidationError as exc:
            raise ValidationError(f"{path}: {exc.message}") from None
        modules = dict(bundle.runnable_modules)  # as rego-cpp runs them: idioms.py's rewrites applied
        if strict:
            from kernel.policy.rego.timelint import time_literal_lints

            authored = dict(bundle.modules)  # the author's text, so lines and columns are theirs
            times = time_literal_lints(authored, {m: bundle.display_path(m) for m in authored})
            if times:
                raise ValidationError(f"{path}: invalid policy bundle (strict): "
                                      + "; ".join(f"{x.file}:{x.line}:{x.col}: {x.message}" for x in times))
        return LoadedBundle(path, "rego", RegoCompiled(bundle, rego_engine.get()), rego_rule_ids(modules),
                            modules=modules, data=bundle.data)
    from kernel.policy.yaml import compile_yaml_bundle

    text = yaml_text if yaml_text is not None else path.read_text(encoding="utf-8")
    try:
        compiled = compile_yaml_bundle(text, revision=yaml_revision(text))
    except ValidationError as exc:
        raise ValidationError(f"{path}: {exc.message}") from None
    if strict:
        lints = compiled.lints()
        if lints:
            raise ValidationError(f"{path}: invalid policy bundle (strict): "
                                  + "; ".join(f"line {x.line}: rule \"{x.rule_id}\": {x.message}" for x in lints))
    return LoadedBundle(path, "yaml", compiled, compiled.rule_ids, shadowed=compiled.shadowed_rules())


def bundle_name(path: Path) -> str:
    name = path.name
    for suffix in (".tar.gz", ".tgz", ".yaml", ".yml"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def case_file_for(path: Path) -> Path | None:
    """`<bundle>.policytest.yaml` beside it, else `policy_tests/<name>.policytest.yaml` in it or a
    parent; a Rego twin `<name>-rego` falls back to `<name>`'s cases (the same cases, both kinds)."""
    name = bundle_name(path)
    names = [name] + ([name[: -len("-rego")]] if name.endswith("-rego") else [])
    for n in names:
        beside = path.parent / f"{n}.policytest.yaml"
        if beside.exists():
            return beside
        inside = path / "bundle.policytest.yaml"
        if path.is_dir() and inside.exists():
            return inside
        for root in [path.parent, *path.parent.parents]:
            candidate = root / "policy_tests" / f"{n}.policytest.yaml"
            if candidate.exists():
                return candidate
    return None


def rego_test_files(path: Path) -> list[Path]:
    """`*_test.rego` inside the bundle directory and under `policy_tests/<name>/`."""
    files = sorted(path.rglob("*_test.rego")) if path.is_dir() else []
    name = bundle_name(path)
    for root in [path.parent, *path.parent.parents]:
        d = root / "policy_tests" / name
        if d.is_dir():
            files += sorted(d.rglob("*_test.rego"))
            break
    return files
