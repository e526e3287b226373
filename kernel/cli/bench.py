"""`regent bench`: the one way the product reaches bench/ (which is not part of the package)."""

from __future__ import annotations

import argparse
import sys

from kernel.errors import ConfigError


def cmd_bench(args: argparse.Namespace) -> int:
    # bench/ lives beside kernel/ in the source checkout and is not installed with the package:
    # the console script's sys.path has neither the checkout nor the working directory on it.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / "bench" / "run.py").is_file():
        raise ConfigError("regent bench needs the source checkout (bench/ is not part of the installed package)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.run import main as bench_main  # type: ignore[import-not-found]

    return int(bench_main(args.rest))


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    # Every bench flag (--quick, --help, …) belongs to bench/run.py's own parser: no prefix here,
    # or argparse would reject `regent bench --quick` before REMAINDER could collect it.
    sp = sub.add_parser("bench", help="run the benchmarks (bench/), printing ratios side by side",
                        prefix_chars="\x00", add_help=False)
    sp.add_argument("rest", nargs=argparse.REMAINDER)
    sp.set_defaults(fn=cmd_bench)
