"""Request signing: the v1 agent request signature and the outbound webhook signature (§8.3, §8.5)."""

from __future__ import annotations

import hashlib
import hmac
import re

# Go's strconv.ParseInt(s, 10, 64) spelling: an optional sign, then ASCII digits (leading zeros fine).
_INTEGER = re.compile(r"[+-]?[0-9]+")
# A Regent extension (docs/api.md, Replayed requests): 16 to 128 URL-safe characters, unique per
# request of an agent within the signature window. Any other spelling fails the check.
NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
# The first line of a message that carries a nonce. It differs from v1's at its 18th byte, so no
# v1 message (nonce header stripped, the nonce moved into the body) can equal a nonce message.
_NONCE_HEAD = "rebuno-request-v1-nonce"


def signature_message(method: str, target: str, timestamp: str, dispatch_id: str, dispatch_attempt: str,
                      body: bytes, nonce: str | None = None) -> bytes:
    """The v1 HMAC input: six `\\n`-terminated lines, then the raw body bytes. With a nonce, the
    first line is `rebuno-request-v1-nonce` and the nonce is a seventh line before the body."""
    if nonce is None:
        head = f"rebuno-request-v1\n{method}\n{target}\n{timestamp}\n{dispatch_id}\n{dispatch_attempt}\n"
    else:
        head = f"{_NONCE_HEAD}\n{method}\n{target}\n{timestamp}\n{dispatch_id}\n{dispatch_attempt}\n{nonce}\n"
    return head.encode("utf-8") + body


def sign_request(secret: str, method: str, target: str, timestamp: str, dispatch_id: str = "",
                 dispatch_attempt: str = "", body: bytes = b"", nonce: str | None = None) -> str:
    """`v1=` + lowercase hex HMAC-SHA256(secret, signature_message(…))."""
    msg = signature_message(method, target, timestamp, dispatch_id, dispatch_attempt, body, nonce)
    return "v1=" + hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def _parse_timestamp(value: str) -> int | None:
    if _INTEGER.fullmatch(value) is None:  # `1700000000.0`, empty, spaces, `0x…`, `1_0` all fail
        return None
    return int(value)


def verify_request(secret: str, presented: str, *, method: str, target: str, timestamp: str,
                   dispatch_id: str, dispatch_attempt: str, body: bytes, now_unix: int,
                   window_seconds: int = 300, nonce: str | None = None) -> bool:
    """Whether `presented` is the v1 signature of this request, signed within now ± window (inclusive).

    The header values are checked as sent (absent dispatch headers are "", an absent nonce None);
    whether a header was repeated is the caller's to check, since only it sees the raw header list.
    """
    if nonce is not None and NONCE.fullmatch(nonce) is None:
        return False
    for value in (timestamp, dispatch_id, dispatch_attempt):
        # A line break could move text from one signed line to the next and keep the same HMAC.
        if "\r" in value or "\n" in value:
            return False
    ts = _parse_timestamp(timestamp)
    if ts is None or abs(now_unix - ts) > window_seconds:
        return False
    expected = sign_request(secret, method, target, timestamp, dispatch_id, dispatch_attempt, body, nonce)
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("ascii"))


def webhook_signature(secret: str, body: bytes) -> str:
    """The outbound `Rebuno-Signature` value: `sha256=` + hex HMAC-SHA256(secret, body)."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_webhook_signature(secret: str, presented: str, body: bytes) -> bool:
    """Whether `presented` is exactly the webhook signature of `body` (constant-time)."""
    return hmac.compare_digest(presented.encode("utf-8", "replace"), webhook_signature(secret, body).encode("ascii"))
