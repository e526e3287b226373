"""`regent`: one module per command group; each adds its subcommands to the one parser.

The commands parse flags, read the environment once, render results and pick exit codes.
Library code never prints.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from kernel.cli import bench, chaos, gateway, keys, mcp, migrate, policy, server
from kernel.cli.common import console
from kernel.errors import ConfigError

GROUPS = (server, migrate, bench, chaos, policy, gateway, keys, mcp)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="regent", description="A policy-engine-centric durable kernel for AI agents.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("REGENT_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per webhook otherwise
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ConfigError as exc:
        console.print(f"[red]regent: {exc.message}[/]")
        return 2
    except KeyboardInterrupt:
        return 130

