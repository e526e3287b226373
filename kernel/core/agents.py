"""Agent registration use cases (the admin agents API and the provisioning manifest)."""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

import idna

from kernel.core.kernel import MAX_LEASE_SECONDS, Kernel
from kernel.core.policies import Actor
from kernel.domain import Agent, PolicyEventType
from kernel.errors import Conflict, NotFound, invalid

MIN_LEASE_SECONDS = 10

log = logging.getLogger("kernel.agents")


def validate_lease(lease_timeout_seconds: int | None) -> int | None:
    """The lease to store: None (kernel default) for unset, 0 and values below the minimum (as
    Rebuno does); 400 for negative values and values over MAX_LEASE_SECONDS."""
    if lease_timeout_seconds is None:
        return None
    if isinstance(lease_timeout_seconds, bool) or not isinstance(lease_timeout_seconds, int):
        raise invalid("lease_timeout_seconds must be a whole number of seconds")
    if not 0 <= lease_timeout_seconds <= MAX_LEASE_SECONDS:
        raise invalid(
            f"lease_timeout_seconds must be 0-{MAX_LEASE_SECONDS} "
            f"(values below {MIN_LEASE_SECONDS} mean the kernel default)")
    return lease_timeout_seconds if lease_timeout_seconds >= MIN_LEASE_SECONDS else None


# The agent id grammar (docs/api.md): it appears in URL paths, headers, logs and policy bundles,
# so it is a plain token: an ASCII letter or digit, then letters, digits and `. _ - : @`.
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# An HMAC key past the hash's block size (64 bytes) is hashed first, so length adds nothing; a
# 1 MB secret was accepted, stored and read on every signed request (docs/api.md, "Bounds").
MAX_SECRET_CHARS = 1024


# The longest webhook URL an agent may register. The delivery client refuses URLs past 64 KiB, and
# one of ~64 KiB was accepted here and then failed every delivery; 2 048 characters is what
# browsers and most proxies take, ample for a host, a path and a token.
MAX_WEBHOOK_URL_CHARS = 2048
# Characters no URL carries as they are: ASCII control characters, space and DEL (the delivery
# client refuses them, so such a URL would fail every delivery).
_NOT_IN_URL = re.compile("[\x00-\x20\x7f]")


def validate_webhook_url(webhook_url: str) -> None:
    """400 unless `webhook_url` is an http(s) URL the delivery client can send to, at most
    MAX_WEBHOOK_URL_CHARS long."""
    if len(webhook_url) > MAX_WEBHOOK_URL_CHARS:
        raise invalid(f"webhook_url must be at most {MAX_WEBHOOK_URL_CHARS} characters "
                              f"(got {len(webhook_url)})")
    shown = webhook_url if len(webhook_url) <= 200 else webhook_url[:200] + "…"
    bad = invalid(f"webhook_url must be an http(s) URL with a host, not {shown!r}")
    if _NOT_IN_URL.search(webhook_url):
        raise bad
    try:
        u = urlsplit(webhook_url)
        u.port  # noqa: B018 - raises ValueError for a port that is not one (e.g. 99999, "x")
        host = u.hostname
    except ValueError:
        raise bad from None
    if u.scheme not in ("http", "https") or not host:
        raise bad
    if not host.isascii():
        try:
            idna.encode(host.lower())  # IDNA 2008, as the delivery client encodes a host name
        except idna.IDNAError:
            raise bad from None


def validate_agent_fields(agent_id: str, webhook_url: str, secret: str) -> None:
    if AGENT_ID.fullmatch(agent_id) is None:
        raise invalid("id must be 1-200 characters: an ASCII letter or digit, then "
                              "letters, digits, '.', '_', '-', ':' or '@'")
    if _UNSTORABLE.search(webhook_url) or _UNSTORABLE.search(secret):
        raise invalid("webhook_url and secret must be valid Unicode without NUL")
    validate_webhook_url(webhook_url)
    if not secret:
        raise invalid("secret must not be empty")
    if len(secret) > MAX_SECRET_CHARS:
        raise invalid(f"secret must be at most {MAX_SECRET_CHARS} characters")


def register_agent(
    k: Kernel, agent_id: str, webhook_url: str, secret: str, lease_timeout_seconds: int | None,
    *, keep_policy: bool = False, actor: Actor | None = None,
) -> tuple[Agent, bool]:
    """Upsert an agent: a full replace that resets `registered_at` and (unless `keep_policy`,
    used by the manifest) clears its policy, as Rebuno's registration does. A policy cleared so
    is a `policy.cleared` audit event by `actor` (reason `agent_reregistered`) and a warning in
    the log: the agent decides permissively until a bundle is posted or a revision re-activated."""
    validate_agent_fields(agent_id, webhook_url, secret)
    lease = validate_lease(lease_timeout_seconds)
    now = k.clock.now()
    with k.store.transaction() as tx:
        created = tx.get_agent(agent_id) is None
        existing = None if created else tx.get_agent(agent_id)
        agent = Agent(
            id=agent_id, webhook_url=webhook_url, secret=secret, registered_at=now,
            lease_timeout_seconds=lease,
            description=existing.description if existing else None,
            input_schema=existing.input_schema if existing else None,
            output_schema=existing.output_schema if existing else None,
        )
        tx.upsert_agent(agent)
        # A pulled agent's bundle is its bundle server's to change (core/policies.py): re-registering
        # it keeps the active revision rather than leave the agent permissive until the source changes.
        keep = keep_policy or agent_id in k.pulled_bundles
        cleared = not created and not keep and tx.active_policy(agent_id) is not None
        if cleared:
            who = actor or Actor()
            tx.clear_policy(agent_id)
            tx.add_policy_event(agent_id, PolicyEventType.CLEARED, now, actor=who.name, credential=who.credential,
                                payload={"reason": "agent_reregistered"})
    k.secrets.forget(agent_id)
    if cleared:
        log.warning("agent %s re-registered: its active policy was cleared, so it is permissive until a "
                    "bundle is posted or a revision re-activated (docs/policy.md)", agent_id)
    return agent, created


def agent_secret(k: Kernel, agent_id: str) -> str | None:
    """The agent's signing secret, read from the store (and kept in `k.secrets`); None if unknown."""
    with k.store.read() as tx:
        a = tx.get_agent(agent_id)
    if a is None:
        k.secrets.forget(agent_id)
        return None
    k.secrets.put(agent_id, a.secret)
    return a.secret


def get_agent(k: Kernel, agent_id: str) -> Agent:
    with k.store.read() as tx:
        a = tx.get_agent(agent_id)
    if a is None:
        raise NotFound(f"agent {agent_id!r} not found")
    return a


def list_agents(k: Kernel) -> list[Agent]:
    with k.store.read() as tx:
        return tx.list_agents()


def delete_agent(k: Kernel, agent_id: str) -> None:
    with k.store.transaction() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        if tx.agent_has_executions(agent_id):
            raise Conflict("conflict: agent still has executions (they are removed by retention)")
        tx.delete_agent(agent_id)
    k.secrets.forget(agent_id)
