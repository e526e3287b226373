"""`regent chaos`: the one way the product reaches reliability/ (which is not part of the package)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernel.errors import ConfigError


def cmd_chaos(args: argparse.Namespace) -> int:
    # reliability/ lives beside kernel/ in the source checkout, as bench/ does, and is not installed.
    root = Path(__file__).resolve().parents[2]
    if not (root / "reliability" / "run.py").is_file():
        raise ConfigError("regent chaos needs the source checkout (reliability/ is not part of the installed package)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from reliability.run import main as chaos_main  # type: ignore[import-not-found]

    return int(chaos_main(args.rest))


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    # Every flag (--quick, --only, --help, …) belongs to reliability/run.py's own parser.
    sp = sub.add_parser("chaos", help="run the reliability suite (reliability/): crashes, replicas, fuzz, "
                                      "overload, auth, dependencies down", prefix_chars="\x00", add_help=False)
    sp.add_argument("rest", nargs=argparse.REMAINDER)
    sp.set_defaults(fn=cmd_chaos)
