"""Request signing: the v1 agent request signature and the outbound webhook signature (§8.3, §8.5)."""

from __future__ import annotations

import hashlib
import hmac


def signature_message(method: str, target: str, timestamp: str, dispatch_id: str, dispatch_attempt: str,
                      body: bytes) -> bytes:
    head = f"rebuno-request-v1\n{method}\n{target}\n{timestamp}\n{dispatch_id}\n{dispatch_attempt}\n"
    return head.encode("utf-8") + body


def sign_request(secret: str, method: str, target: str, timestamp: str, dispatch_id: str = "",
                 dispatch_attempt: str = "", body: bytes = b"") -> str:
    msg = signature_message(method, target, timestamp, dispatch_id, dispatch_attempt, body)
    return "v1=" + hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def _parse_timestamp(value: str) -> int | None:
    text = value[1:] if value.startswith("+") else value
    if not text.isdigit() or not text.isascii():
        return None
    return int(text)


def verify_request(secret: str, presented: str, *, method: str, target: str, timestamp: str,
                   dispatch_id: str, dispatch_attempt: str, body: bytes, now_unix: int,
                   window_seconds: int = 300) -> bool:
    for value in (timestamp, dispatch_id, dispatch_attempt):
        if "\r" in value or "\n" in value:
            return False
    ts = _parse_timestamp(timestamp)
    if ts is None or abs(now_unix - ts) > window_seconds:
        return False
    expected = sign_request(secret, method, target, timestamp, dispatch_id, dispatch_attempt, body)
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("utf-8"))


def webhook_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_webhook_signature(secret: str, presented: str, body: bytes) -> bool:
    return hmac.compare_digest(presented.encode("utf-8", "replace"), webhook_signature(secret, body).encode())
