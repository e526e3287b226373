"""Opaque keyset cursors over (time, id): the decisions search and the approvals inbox page on them."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from kernel.errors import invalid


def encode_cursor(at: datetime, row_id: str) -> str:
    raw = f"{at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, what: str) -> tuple[datetime, str]:
    """(time, id) from an opaque cursor; ValidationError naming `what` ("a decisions cursor")
    when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, row_id = raw.partition("|")
        when = datetime.fromisoformat(at)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid(f"cursor is not {what}") from None
    if when.tzinfo is None or not row_id or len(row_id) > 36:
        raise invalid(f"cursor is not {what}")
    return when, row_id
