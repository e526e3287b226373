"""API key use cases (docs/audit.md): create (the secret shown once, only its SHA-256 stored), list,
revoke, and resolve a presented token to its principal, refusing revoked and expired keys.

The `regent keys` CLI and the `/v0/api-keys` routes both call these.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kernel.core.approvals import Principal
from kernel.core.kernel import Kernel
from kernel.errors import Forbidden, NotFound, invalid
from kernel.ids import new_uuid7
from kernel.text import check_text

SCOPES = frozenset(
    {
        "executions:read",
        "executions:write",
        "agents:read",
        "agents:write",
        "policies:write",
        "approvals:read",
        "approvals:write",
        "api_keys:manage",
        "decisions:read",
    }
)
TOKEN_PREFIX = "rbk_"
MAX_SCOPES = 64  # entries in a key's `scopes` (there are fewer scopes than this; duplicates allowed)
_SECRET_CHARS = 43  # secrets.token_urlsafe(32)
LAST_USED_EVERY_SECONDS = 60.0  # last_used_at is written at most this often per key and process


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key, never with its secret or hash."""

    id: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    created_by: str | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None

    def json(self) -> dict[str, Any]:
        from kernel.clock import rfc3339

        out: dict[str, Any] = {"id": self.id, "name": self.name, "scopes": list(self.scopes),
                               "created_at": rfc3339(self.created_at)}
        for key in ("created_by",):
            if getattr(self, key):
                out[key] = getattr(self, key)
        for key in ("expires_at", "revoked_at", "last_used_at"):
            value = getattr(self, key)
            if value is not None:
                out[key] = rfc3339(value)
        return out


def _to_key(row: Any) -> ApiKey:
    return ApiKey(id=row.id, name=row.name, scopes=tuple(sorted(json.loads(row.scopes))),
                  created_at=row.created_at, created_by=row.created_by, expires_at=row.expires_at,
                  revoked_at=row.revoked_at, last_used_at=row.last_used_at)


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def create_key(
    k: Kernel, name: str, scopes: list[str] | tuple[str, ...], *, expires_at: datetime | None = None,
    created_by: Principal | str | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key; returns it and its token (`rbk_<id>.<secret>`), which is not kept.

    `created_by`: the principal creating it (a scoped key may grant only scopes it holds itself),
    or a label such as "cli"."""
    name = check_text(name, "name").strip()
    if not 0 < len(name) <= 200:
        raise invalid("name must be 1-200 characters")
    if len(scopes) > MAX_SCOPES:  # 10 000 entries were accepted (and deduplicated) before
        raise invalid(f"scopes must list at most {MAX_SCOPES} entries")
    for s in scopes:
        check_text(s, "scopes")
    wanted = sorted(set(scopes))
    if not wanted:
        raise invalid("scopes must name at least one scope")
    unknown = [s for s in wanted if s not in SCOPES]
    if unknown:
        raise invalid(f"unknown scope(s) {', '.join(unknown)}; "
                              f"choose from {', '.join(sorted(SCOPES))}")
    now = k.clock.now()
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise invalid("expires_at must carry a time zone")
        if expires_at <= now:
            raise invalid("expires_at must be in the future")
    creator: str | None
    if isinstance(created_by, Principal):
        beyond = [s for s in wanted if not created_by.has(s)]
        if beyond:
            raise Forbidden(f"forbidden: a key cannot grant scopes it does not hold ({', '.join(beyond)})")
        creator = created_by.name if created_by.name is not None else created_by.credential.value
    else:
        creator = created_by
    key_id = new_uuid7()
    token = f"{TOKEN_PREFIX}{key_id}.{secrets.token_urlsafe(32)}"
    with k.store.transaction() as tx:
        tx.insert_api_key({
            "id": key_id, "name": name, "scopes": json.dumps(wanted), "secret_hash": _hash(token),
            "created_at": now, "revoked_at": None, "expires_at": expires_at, "created_by": creator,
            "last_used_at": None,
        })
    return ApiKey(key_id, name, tuple(wanted), now, creator, expires_at), token


def list_keys(k: Kernel, *, include_revoked: bool = True) -> list[ApiKey]:
    with k.store.read() as tx:
        rows = tx.list_api_keys()
    keys = [_to_key(r) for r in rows]
    return keys if include_revoked else [x for x in keys if x.revoked_at is None]


def revoke_key(k: Kernel, key_id: str, revoked_by: Principal | None = None) -> ApiKey:
    """Revoke at once (the next request with it is refused); revoking twice keeps the first time.

    A key revokes only keys whose every scope it holds itself, as it may only create those: a
    key manager cannot take away an admin's key (`revoked_by` None is the CLI, on the store)."""
    now = k.clock.now()
    with k.store.transaction() as tx:
        row = tx.get_api_key(key_id)
        if row is None:
            raise NotFound(f"api key {key_id} not found")
        if revoked_by is not None:
            beyond = [s for s in json.loads(row.scopes) if not revoked_by.has(s)]
            if beyond:
                raise Forbidden(f"forbidden: a key cannot revoke a key with scopes it does not hold "
                                f"({', '.join(beyond)})")
        if row.revoked_at is None:
            tx.set_api_key(key_id, revoked_at=now)
        row = tx.get_api_key(key_id)
    _forget_use(key_id)
    return _to_key(row)


_last_used: dict[str, float] = {}
_last_used_lock = threading.Lock()


def _forget_use(key_id: str) -> None:
    with _last_used_lock:
        _last_used.pop(key_id, None)


def _due_for_use_stamp(key_id: str) -> bool:
    now = time.monotonic()
    with _last_used_lock:
        last = _last_used.get(key_id)
        if last is not None and now - last < LAST_USED_EVERY_SECONDS:
            return False
        if len(_last_used) > 10_000:
            _last_used.clear()  # bounded; a few extra writes at worst
        _last_used[key_id] = now
        return True


def parse_token(token: str) -> str | None:
    """The key id of a well-formed token, else None."""
    if not token.startswith(TOKEN_PREFIX) or "." not in token:
        return None
    key_id, _, secret = token[len(TOKEN_PREFIX):].partition(".")
    if len(secret) != _SECRET_CHARS or len(key_id) != 36:
        return None
    return key_id.lower()


def token_principal(k: Kernel, token: str) -> Principal | None:
    """The principal of a presented key token; None when malformed, unknown, wrong, revoked or
    expired. Compares hashes in constant time; stamps `last_used_at` (at most once a minute)."""
    key_id = parse_token(token)
    if key_id is None:
        return None
    with k.store.read() as tx:
        row = tx.get_api_key(key_id)
    if row is None or not hmac.compare_digest(bytes(row.secret_hash), _hash(token)):
        return None
    now = k.clock.now()
    if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now):
        return None
    if _due_for_use_stamp(key_id):
        with k.store.transaction() as tx:
            tx.set_api_key(key_id, last_used_at=now)
    return Principal(name=row.name, scopes=frozenset(json.loads(row.scopes)), key_id=row.id)


def key_principal(k: Kernel, key_id: str) -> Principal | None:
    """A stored key's principal by id (a console session re-reads it per request), or None when
    unknown, revoked or expired."""
    with k.store.read() as tx:
        row = tx.get_api_key(key_id)
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= k.clock.now():
        return None
    return Principal(name=row.name, scopes=frozenset(json.loads(row.scopes)), key_id=row.id)
