"""The Rego package's modules import one another in one direction only (no circles, not even
through a function-level or TYPE_CHECKING import)."""

from __future__ import annotations

import ast
from pathlib import Path

import kernel.policy.rego

PACKAGE = Path(kernel.policy.rego.__file__).parent


def _imports(path: Path) -> set[str]:
    """Sibling modules ``path`` imports anywhere in its body."""
    found: set[str] = set()
    siblings = {p.stem for p in PACKAGE.glob("*.py")}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:
                names = [module.split(".")[0]] if module else [a.name for a in node.names]
            elif module.startswith("kernel.policy.rego."):
                names = [module.split(".")[3]]
            else:
                continue
            found.update(n for n in names if n in siblings)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kernel.policy.rego."):
                    found.add(a.name.split(".")[3])
    found.discard(path.stem)
    return found


def test_rego_package_has_no_import_circle() -> None:
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert graph["engine"] >= {"trace"}  # the engine locates errors with the trace module
    assert "engine" not in graph["trace"]

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [c for c in map(cycle_from, graph) if c]
    assert circles == []


def test_no_kernel_module_imports_the_scripts_that_load_regopy() -> None:
    """worker.py, native.py and rawbench.py run only as child processes (regopy-notes hazards)."""
    scripts = {"worker", "native", "rawbench"}
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
    assert {m: graph[m] & scripts for m in graph if graph[m] & scripts} == {}
    importers = {p.stem for p in PACKAGE.glob("*.py")
                 if any(line.startswith(("import regopy", "from regopy"))
                        for line in p.read_text(encoding="utf-8").splitlines())}
    assert importers == scripts
