"""`regent keys create|list|revoke --db-url …`: API key management straight on the store, for the
first key before any exists (the `/v0/api-keys` routes do the same over HTTP). docs/audit.md."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

from rich.table import Table

from kernel.cli.common import console, settings_from
from kernel.errors import ConfigError, RegentError

if TYPE_CHECKING:  # the store and the core are imported when a keys command runs, not for every command
    from kernel.core.kernel import Kernel


@contextmanager
def _kernel(args: argparse.Namespace) -> Iterator[Kernel]:
    from kernel.core.kernel import Kernel
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    settings = settings_from(args)
    if not settings.db_url:
        raise ConfigError("regent keys needs --db-url or REGENT_DB_URL")
    store = open_store(settings.db_url)
    try:
        migrate(store)  # the first key may come before the first `regent serve`
        yield Kernel(store=store)
    finally:
        store.close()


def _scopes(values: list[str]) -> list[str]:
    return [s.strip() for v in values for s in v.split(",") if s.strip()]


def cmd_create(args: argparse.Namespace) -> int:
    from kernel.core import api_keys

    scopes = _scopes(args.scope or [])
    with _kernel(args) as k:
        expires = None
        if args.expires_in:
            try:
                from kernel.config import seconds

                expires = k.clock.now() + timedelta(seconds=seconds(args.expires_in))
            except ValueError as exc:
                raise ConfigError(f"--expires-in: {exc}") from None
        key, token = api_keys.create_key(k, args.name, scopes, expires_at=expires, created_by="cli")
    if args.json:
        print(json.dumps({**key.json(), "token": token}))
    else:
        print(token)
        console.print(f"created key {key.id} ({key.name}; {', '.join(key.scopes)}"
                      f"{'; expires ' + key.json()['expires_at'] if key.expires_at else ''}). "
                      "The token above is shown once: only its SHA-256 is stored.")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from kernel.core import api_keys

    with _kernel(args) as k:
        keys = api_keys.list_keys(k, include_revoked=args.all)
    if args.json:
        print(json.dumps([x.json() for x in keys]))
        return 0
    t = Table("id", "name", "scopes", "created", "expires", "last used", "revoked")
    for x in keys:
        j = x.json()
        t.add_row(x.id, x.name, ", ".join(x.scopes), j["created_at"], j.get("expires_at", ""),
                  j.get("last_used_at", ""), j.get("revoked_at", ""))
    from rich.console import Console

    out = Console(soft_wrap=True)
    if not out.is_terminal:
        out = Console(soft_wrap=True, width=200)  # piped: do not squeeze ids and times to 80 columns
    out.print(t)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from kernel.core import api_keys
    from kernel.ids import parse_uuid

    try:
        key_id = parse_uuid(args.key_id)
    except RegentError:
        raise ConfigError(f"not a key id: {args.key_id!r} (see regent keys list)") from None
    with _kernel(args) as k:
        key = api_keys.revoke_key(k, key_id)
    console.print(f"revoked key {key.id} ({key.name}) at {key.json()['revoked_at']}")
    return 0


def _run(fn: object) -> object:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return fn(args)  # type: ignore[operator,no-any-return]
        except ConfigError:
            raise
        except RegentError as exc:  # bad name/scope/expiry, unknown key: the core's message
            console.print(f"[red]regent keys: {exc.message}[/]")
            return 1
    return wrapped


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("keys", help="create, list and revoke API keys (straight on the store)")
    ks = sp.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="create a key; prints its token once")
    c.add_argument("--name", required=True, help="the key's name: what approvals record as the decider")
    c.add_argument("--scope", action="append", help="a scope (repeat, or comma-separate)", required=True)
    c.add_argument("--expires-in", help="lifetime, e.g. 720h (default: no expiry)")
    c.add_argument("--json", action="store_true", help="print the key and its token as JSON")
    c.add_argument("--db-url", dest="db_url")
    c.set_defaults(fn=_run(cmd_create))
    ls = ks.add_parser("list", help="list keys (never their secrets)")
    ls.add_argument("--all", action="store_true", help="include revoked keys")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--db-url", dest="db_url")
    ls.set_defaults(fn=_run(cmd_list))
    r = ks.add_parser("revoke", help="revoke a key at once")
    r.add_argument("key_id")
    r.add_argument("--db-url", dest="db_url")
    r.set_defaults(fn=_run(cmd_revoke))


__all__ = ["add_commands"]
