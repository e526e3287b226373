"""Who a stored API key is, by its id: what a console session re-reads on every request, so a
revoked or expired key's sessions end at once. Never returns the key's hash."""

from __future__ import annotations

from kernel.core.api_keys import key_principal

__all__ = ["key_principal"]
