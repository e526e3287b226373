"""`regent policy fmt --v0-v1 PATH…`: rewrites OPA v0 modules to v1 (as `opa fmt --v0-v1` does),
printing a unified diff, or writing the files with `--write`. Exit 0, or 2 under `--fail` when a
file would change; 1 for a usage error or a file that cannot be read."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from kernel.policy.rego.v0_syntax import rewrite_v0_v1, v1_problems

err = Console(stderr=True, soft_wrap=True)


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out += sorted(x for x in p.rglob("*.rego") if x.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return out


def _side(prefix: str, f: Path) -> str:
    return str(f) if f.is_absolute() else f"{prefix}/{f}"


def cmd_fmt(args: argparse.Namespace) -> int:
    if not args.v0_v1:
        err.print("regent policy fmt only rewrites OPA v0 modules to v1: pass --v0-v1", style="red",
                  markup=False, highlight=False)
        return 1
    try:
        files = _files(args.paths)
        changed = 0
        for f in files:
            before = f.read_text(encoding="utf-8")
            after = rewrite_v0_v1(before)
            for line, col, message in v1_problems(after):  # what the rewrite cannot decide
                err.print(f"{f}:{line}:{col}: {message}", style="yellow", markup=False, highlight=False)
            if after == before:
                continue
            changed += 1
            if args.write:
                f.write_text(after, encoding="utf-8")
                print(f"rewrote {f}")
            else:
                sys.stdout.writelines(difflib.unified_diff(
                    before.splitlines(keepends=True), after.splitlines(keepends=True),
                    fromfile=_side("a", f), tofile=_side("b", f)))
    except (OSError, UnicodeDecodeError) as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        return 1
    return 2 if changed and args.fail else 0


def add_fmt_command(ps: Any) -> None:
    f = ps.add_parser("fmt", help="rewrite OPA v0 Rego modules to v1 (`if`, `contains`), as `opa fmt --v0-v1`")
    f.add_argument("paths", nargs="+", help=".rego files or directories (searched for *.rego)")
    f.add_argument("--v0-v1", dest="v0_v1", action="store_true",
                   help="read the modules as OPA v0 and write them in v1 syntax (required)")
    f.add_argument("-w", "--write", action="store_true", help="rewrite the files in place instead of printing a diff")
    f.add_argument("--fail", action="store_true", help="exit 2 when a file needs rewriting (for CI)")
    f.set_defaults(fn=cmd_fmt)
