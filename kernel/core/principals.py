"""Who a stored API key is, by its id: what a console session re-reads on every request, so a
revoked key's sessions end at once. Never returns the key's hash."""

from __future__ import annotations

import json

from kernel.core.approvals import Principal
from kernel.core.kernel import Kernel


def key_principal(k: Kernel, key_id: str) -> Principal | None:
    """The key's principal (its name and scopes), or None when unknown or revoked."""
    with k.store.read() as tx:
        row = tx.get_api_key(key_id)
    if row is None or row.revoked_at is not None:
        return None
    return Principal(name=row.name, scopes=frozenset(json.loads(row.scopes)), key_id=row.id)
