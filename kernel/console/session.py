"""The console's session: a signed, expiring cookie naming who signed in, and its CSRF token.

The cookie holds no secret: the API key's id (never the key), or a fingerprint of the bootstrap
token, an expiry and a random nonce, signed with HMAC-SHA256 under the session key. Every request
re-reads the key (a revoked key ends its sessions at once); a changed bootstrap token ends the
sessions made with the old one. The CSRF token is an HMAC of the nonce, so it is bound to one
session and checked in constant time on every state-changing form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from kernel.core.approvals import Principal

COOKIE = "regent_console"
BOOTSTRAP = "*bootstrap"
ANONYMOUS = "*dev"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """The bytes of canonical unpadded base64url text, else ValueError. The decoder alone skips
    characters outside the alphabet and ignores a last character's spare bits, so many cookie
    texts decoded to one MAC; only the text `_b64` writes is accepted."""
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


@dataclass(frozen=True, slots=True)
class Session:
    """A verified cookie: `who` is an API key id, BOOTSTRAP or ANONYMOUS (regent dev)."""

    who: str
    expires: int
    nonce: str
    fingerprint: str = ""  # of the bootstrap token the session was made with


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in visitor as the pages see it: the principal and the form token."""

    principal: Principal
    label: str  # the key's name, "bootstrap token" or "dev (anonymous admin)"
    csrf: str
    signed_in: bool  # False for regent dev's anonymous admin (no sign-out)

    def can(self, *scopes: str) -> bool:
        return self.principal.has(*scopes)


class Sessions:
    def __init__(self, key: bytes | None, ttl_seconds: float):
        # No configured key: one per process, so sessions end with the process (docs/console.md).
        self.key = key or secrets.token_bytes(32)
        self.ttl = ttl_seconds

    def _mac(self, purpose: str, data: bytes) -> bytes:
        return hmac.new(self.key, purpose.encode() + b"\0" + data, hashlib.sha256).digest()

    def fingerprint(self, token: str) -> str:
        return _b64(self._mac("bootstrap", token.encode()))[:22]

    def issue(self, who: str, fingerprint: str = "") -> Session:
        return Session(who, int(time.time() + self.ttl), secrets.token_urlsafe(16), fingerprint)

    def encode(self, s: Session) -> str:
        body = json.dumps({"w": s.who, "e": s.expires, "n": s.nonce, "f": s.fingerprint},
                          separators=(",", ":")).encode()
        return f"{_b64(body)}.{_b64(self._mac('cookie', body))}"

    def verify(self, cookie: str | None) -> Session | None:
        if not cookie or "." not in cookie or len(cookie) > 1024:
            return None
        body_text, _, mac_text = cookie.partition(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
        except (ValueError, TypeError):
            return None
        if not hmac.compare_digest(mac, self._mac("cookie", body)):
            return None
        try:
            d = json.loads(body)
            s = Session(str(d["w"]), int(d["e"]), str(d["n"]), str(d.get("f", "")))
        except (ValueError, KeyError, TypeError):
            return None
        return s if s.expires > time.time() else None

    def csrf(self, s: Session) -> str:
        return _b64(self._mac("csrf", s.nonce.encode()))

    def csrf_ok(self, s: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token).encode(), self.csrf(s).encode())
