"""Authentication: bearer tokens for client/admin routes, the v1 signature for agent routes."""

from __future__ import annotations

import functools
import hmac
import time
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request

from kernel.api.body import BodyTooLarge, read_body
from kernel.core import agents, api_keys
from kernel.core.api_keys import SCOPES
from kernel.core.approvals import Principal
from kernel.core.kernel import Kernel
from kernel.core.request_reuse import ReplayGuard, SharedReplays
from kernel.errors import Forbidden, Unauthorized, ValidationError, invalid
from kernel.ids import parse_uuid, whole_number
from kernel.lane import before_next_call, call
from kernel.signing import verify_request

ALL_SCOPES = SCOPES  # kernel/core/api_keys.py


# The signed request's headers, by their index in `Authenticator.agent`.
_AGENT_HEADERS = {
    b"rebuno-agent-id": 0,
    b"rebuno-signature": 1,
    b"rebuno-timestamp": 2,
    b"rebuno-dispatch-id": 3,
    b"rebuno-dispatch-attempt": 4,
    b"rebuno-nonce": 5,
}

# What a byte-identical repeat of a signed request may do (docs/api.md, Replayed requests):
# "read": nothing is recorded; "once": a repeat is refused 401; "repeatable": a repeat is refused
# only when the request carries a nonce, because the official SDK sends none and legitimately
# repeats these bytes within one second (two identical steps are two occurrences; metadata and
# suspend change nothing the second time).
Repeat = Literal["read", "once", "repeatable"]

REPLAYED = "unauthorized: request already seen (sign each request anew: a new timestamp or Rebuno-Nonce)"


@dataclass(frozen=True, slots=True)
class AgentCall:
    """An authenticated agent request: who, the raw body, and the dispatch lease headers."""

    agent_id: str
    body: bytes
    dispatch_id: str | None
    dispatch_attempt: str | None

    def lease(self) -> tuple[str, int]:
        """The two dispatch headers → (canonical dispatch id, attempt ≥ 1), or 400."""
        if not self.dispatch_id:
            raise invalid("bad or missing Rebuno-Dispatch-Id")
        try:
            did = parse_uuid(self.dispatch_id)
        except ValidationError:
            raise invalid("bad or missing Rebuno-Dispatch-Id") from None
        n = whole_number((self.dispatch_attempt or "").strip())
        if n is None or n < 1:
            raise invalid("bad or missing Rebuno-Dispatch-Attempt")
        return did, n


class Authenticator:
    def __init__(self, kernel: Kernel, *, bearer_token: str | None, dev: bool, max_body_bytes: int,
                 signature_window_seconds: int = 300, require_nonce: bool = False,
                 replay_cache_size: int = 200_000, replay_shared: bool = True):
        self.kernel = kernel
        self._token = bearer_token.encode() if bearer_token else None
        self.dev = dev
        self.max_body_bytes = max_body_bytes
        self.window = signature_window_seconds
        self.require_nonce = require_nonce
        self.replays = ReplayGuard(signature_window_seconds, replay_cache_size)
        # Replicas share a PostgreSQL database; a SQLite file has one kernel process (flock).
        shared = replay_shared and kernel.store.dialect == "postgresql"
        self.shared = SharedReplays(signature_window_seconds) if shared else None

    # -- bearer ---------------------------------------------------------------------------
    def principal(self, request: Request, *scopes: str) -> Principal:
        header = request.headers.get("authorization")
        if header is None:
            # An agent's signed request is never an operator's, not even in dev: a gateway signed
            # as its agent must not list or approve tool definitions (its own or another agent's).
            if is_agent_request(request):
                raise Unauthorized("unauthorized: this route takes a bearer token, not an agent's signature")
            if self.dev:
                return Principal(admin=True, dev=True)
            raise Unauthorized()
        # The scheme is case-insensitive (RFC 7235 §2.1: `bearer` is `Bearer`); Rebuno insists on
        # "Bearer " exactly, which refuses valid clients for nothing.
        scheme, _, token = header.partition(" ")
        token = token.strip(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized()
        principal = self.token_principal(token)
        if not principal.has(*scopes):
            raise Forbidden(f"forbidden: missing scope {' '.join(scopes)}")
        return principal

    def is_bootstrap(self, token: str) -> bool:
        return self._token is not None and hmac.compare_digest(token.encode(), self._token)

    def token_principal(self, token: str) -> Principal:
        """The bootstrap token or an API key → its principal; Unauthorized otherwise."""
        if self.is_bootstrap(token):
            return Principal(admin=True)
        return self._api_key(token)

    def _api_key(self, token: str) -> Principal:
        # rbk_<uuid>.<43 chars>; only SHA-256(token) is stored; revoked and expired keys fail.
        principal = api_keys.token_principal(self.kernel, token)
        if principal is None:
            raise Unauthorized()
        return principal

    # -- agent signature ------------------------------------------------------------------
    async def agent(self, request: Request, repeat: Repeat = "read", *, with_call: bool = False) -> AgentCall:
        """The signed agent request, verified. `with_call`: the route's use case follows (one
        `call`, or its first), so the replicas' shared replay record is checked on the lane in
        that call's job, just before the use case, instead of in a hop of its own; a request the
        route refuses before its use case (a malformed body) is then not recorded as accepted."""
        # One pass over the raw headers (ASGI names are lower-case bytes), as Starlette decodes them.
        found: list[str | None] = [None] * len(_AGENT_HEADERS)
        repeated = False
        for name, value in request.scope["headers"]:
            i = _AGENT_HEADERS.get(name)
            if i is not None:
                if found[i] is None:
                    found[i] = value.decode("latin-1")
                elif i:  # a second agent id is ignored, as before; any other header twice is refused
                    repeated = True
        agent_id, signature, timestamp, dispatch_id, dispatch_attempt, nonce = found
        if not agent_id or signature is None or repeated:
            raise Unauthorized()
        if nonce is None and self.require_nonce and repeat != "read":
            raise Unauthorized("unauthorized: this kernel requires Rebuno-Nonce on agent mutations")
        try:
            body = await read_body(request, self.max_body_bytes)
        except BodyTooLarge:
            raise Unauthorized() from None  # the signature covers the whole body (rebuno-v0 §8.3)
        raw_path = request.scope.get("raw_path")
        target = (raw_path.decode("latin-1") if raw_path is not None else request.url.path)
        qs = request.scope.get("query_string", b"")
        if qs:
            target += "?" + qs.decode("latin-1")

        now = int(time.time())

        def verify(secret: str) -> bool:
            return verify_request(
                secret,
                signature,
                method=request.method,
                target=target,
                timestamp=timestamp or "",
                dispatch_id=dispatch_id or "",
                dispatch_attempt=dispatch_attempt or "",
                body=body,
                now_unix=now,
                window_seconds=self.window,
                nonce=nonce,
            )

        secret = self.kernel.secrets.get(agent_id)
        ok = secret is not None and verify(secret)
        if not ok:
            # Not cached, or cached and failing (the secret may have been rotated elsewhere).
            secret = await call(agents.agent_secret, self.kernel, agent_id)
            ok = secret is not None and verify(secret)
        if not ok:
            raise Unauthorized()
        if repeat == "once" or (repeat == "repeatable" and nonce is not None):
            await self._first_sight(agent_id, int(timestamp or "0"), signature, now, with_call)
        return AgentCall(agent_id, body, dispatch_id, dispatch_attempt)

    async def _first_sight(self, agent_id: str, timestamp: int, signature: str, now: int,
                           with_call: bool = False) -> None:
        """Refuse a signed mutation this replica, or any replica sharing the store, accepted before."""
        if not self.replays.first_sight(agent_id, timestamp, signature, now):
            raise Unauthorized(REPLAYED)
        if self.shared is None:
            return
        check = functools.partial(self._shared_sight, agent_id, timestamp, signature)
        if with_call:
            before_next_call(check)
        else:
            await call(check)

    def _shared_sight(self, agent_id: str, timestamp: int, signature: str) -> None:
        """On the lane: record the request in the replicas' shared table, or refuse a repeat."""
        assert self.shared is not None
        if not self.shared.first_sight(self.kernel, agent_id, timestamp, signature):
            self.replays.count_refused()
            raise Unauthorized(REPLAYED)


def is_agent_request(request: Request) -> bool:
    """Dual routes use the signature when either agent header is present (rebuno-v0 §8.4)."""
    return "rebuno-agent-id" in request.headers or "rebuno-signature" in request.headers
