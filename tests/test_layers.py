"""The layers point one way (docs/architecture.md): each room imports nothing from the rooms above
it, not even through a function-level or TYPE_CHECKING import. The exceptions that doc lists are
outside these rooms."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kernel

KERNEL = Path(kernel.__file__).parent

# room (a package or a module under kernel/) -> the modules it must not import (prefixes)
RULES = {
    "core": ("kernel.store", "sqlalchemy", "kernel.api", "kernel.console", "kernel.cli", "kernel.bootstrap",
             "kernel.mcp", "kernel.gateway", "kernel.manifest"),
    "console": ("kernel.api", "kernel.store", "kernel.cli", "kernel.bootstrap", "sqlalchemy"),
    "domain": ("kernel.", "sqlalchemy"),
    "errors.py": ("kernel.",),
    "policy": ("kernel.store", "kernel.core", "kernel.api", "sqlalchemy"),
    "ratelimit": ("kernel.store", "kernel.core", "kernel.api", "sqlalchemy"),
    "store": ("kernel.core", "kernel.api", "kernel.console", "kernel.policy", "kernel.ratelimit"),
    "manifest.py": ("kernel.mcp", "kernel.gateway", "kernel.store", "kernel.api"),
    "manifest_mcp.py": ("kernel.",),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("room", sorted(RULES), ids=sorted(RULES))
def test_a_room_imports_nothing_from_the_rooms_above_it(room: str) -> None:
    where = KERNEL / room
    files = [where] if where.suffix == ".py" else sorted(where.rglob("*.py"))
    assert files
    own = f"kernel.{room.removesuffix('.py')}"
    crossings = [f"{f.relative_to(KERNEL.parent)}:{line}: {name}"
                 for f in files for line, name in _imports(f)
                 if name.startswith(RULES[room]) and not name.startswith(own)]
    assert crossings == []
