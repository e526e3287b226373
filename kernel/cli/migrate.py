"""`regent migrate`: apply the pending numbered schema migrations."""

from __future__ import annotations

import argparse

from kernel.cli.common import console, settings_from
from kernel.errors import ConfigError


def cmd_migrate(args: argparse.Namespace) -> int:
    from kernel.store import open_store
    from kernel.store.migrations import LATEST, migrate

    settings = settings_from(args)
    if not settings.db_url:
        raise ConfigError("regent migrate needs --db-url or REGENT_DB_URL")
    store = open_store(settings.db_url)
    try:
        applied = migrate(store)
    finally:
        store.close()
    for m in applied:
        console.print(f"applied {m.version:03d} {m.name}")
    console.print(f"schema at version {LATEST}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("migrate", help="apply pending schema migrations")
    sp.add_argument("--db-url", dest="db_url")
    sp.set_defaults(fn=cmd_migrate)
