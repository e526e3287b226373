"""Policy admin use cases: store a bundle revision (compiled first), read, list, re-activate; who
and when each revision was stored and made active; the rule for agents whose bundle is pulled."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kernel.core.kernel import Kernel
from kernel.domain import PolicyEventType
from kernel.domain.policy_event import ACTIVATIONS
from kernel.errors import Conflict, NotFound, invalid
from kernel.text import check_text

MAX_REVISION_SEQ = 999_999_999  # a revision number any store column holds
BUNDLE_PULL = "bundle"  # the credential of the bundle puller's activations; their actor is the source URL
# How far back a revision history looks for who stored and activated each revision (per agent).
MAX_TRAIL_EVENTS = 10_000


@dataclass(frozen=True, slots=True)
class Actor:
    """Who changed an agent's policy, for the audit trail: the API key's name (credential `key`),
    else only the credential (`bootstrap` token, anonymous `dev` access, the provisioning
    `manifest`)."""

    name: str | None = None
    credential: str = "bootstrap"


MANIFEST = Actor(None, "manifest")  # the provisioning manifest (provision names its file)


def bundle_source(url: str) -> str:
    """A bundle server URL as the audit trail names it: without user info, query or fragment,
    which may carry a credential (a signed URL's signature)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def puller(url: str) -> Actor:
    """The bundle puller acting for a source: its activations are credited to the URL."""
    return Actor(bundle_source(url), BUNDLE_PULL)


def refuse_if_pulled(k: Kernel, agent_id: str, actor: Actor, what: str) -> None:
    """An agent whose bundle is pulled has one source of truth, its bundle server: no one else
    changes which revision is active (docs/policy-rollout.md, "Pulled agents")."""
    url = k.pulled_bundles.get(agent_id)
    if url is not None and actor.credential != BUNDLE_PULL:
        raise Conflict(f"conflict: agent {agent_id!r} pulls its bundle from {bundle_source(url)}, which decides its "
                       f"active revision; {what} is refused (publish the bundle there, or stop pulling it)")


@dataclass(frozen=True, slots=True)
class Activation:
    """One entry of the policy audit trail that stored or re-activated a revision."""

    type: str  # policy.activated | policy.promoted | policy.rolled_back
    at: datetime
    actor: str | None
    credential: str | None
    via: str | None = None  # policy.activated: upload, reactivate, manifest, bundle_pull

    @property
    def by(self) -> str:
        """Who, in one word: the key's name (or a bundle's source URL), else the credential."""
        return self.actor or self.credential or "unknown"


@dataclass(frozen=True, slots=True)
class PolicyRevision:
    agent_id: str
    seq: int
    kind: str
    revision: str
    content: str
    active: bool
    created_at: datetime
    # SHA-256 of `content`: the `policy_hash` of every decision this revision made (docs/audit.md)
    content_hash: str = ""
    stored: Activation | None = None  # the trail entry that stored it (None: stored before the trail)
    activated: Activation | None = None  # the latest that made it active


def _to_revision(row: Any) -> PolicyRevision:
    return PolicyRevision(row.agent_id, row.seq, row.kind, row.revision, row.content, bool(row.active),
                          row.created_at, row.content_hash)


def rego_content(mapping_or_bundle: Any) -> str:
    """What is stored for a Rego bundle (a parsed bundle or its {modules, data, manifest}
    mapping): the canonical JSON of that mapping."""
    import json

    from kernel.policy.rego import parse_rego_bundle

    try:
        b = mapping_or_bundle if hasattr(mapping_or_bundle, "modules") else parse_rego_bundle(mapping_or_bundle)
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800") in a module or in data: not UTF-8
        raise invalid("bundle must be valid Unicode (a lone surrogate is not)") from None
    return json.dumps({"modules": dict(b.modules), "data": b.data, "manifest": b.manifest},
                      sort_keys=True, ensure_ascii=False)


def _via(who: Actor) -> str:
    return {"manifest": "manifest", BUNDLE_PULL: "bundle_pull"}.get(who.credential, "upload")


def store_policy(k: Kernel, agent_id: str, kind: str, content: str,
                 actor: Actor | None = None) -> PolicyRevision | None:
    """Validate and store a new active revision. Empty YAML text clears the policy (permissive).
    Each change of the active revision is an audit event (`policy.activated`, `policy.cleared`)
    naming who (`actor`) and how (`via`)."""
    who = actor or Actor()
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
    refuse_if_pulled(k, agent_id, who, "storing a bundle through the API" if content else "clearing its policy")
    now = k.clock.now()
    if kind == "yaml" and content == "":
        with k.store.transaction(lock=f"policy:{agent_id}") as tx:
            if tx.active_policy(agent_id) is not None:
                tx.clear_policy(agent_id)
                tx.add_policy_event(agent_id, PolicyEventType.CLEARED, now, actor=who.name, credential=who.credential)
        return None
    revision = k.policy.check(kind, content)  # the active revision keeps deciding if this fails
    with k.store.transaction(lock=f"policy:{agent_id}") as tx:
        active = tx.active_policy(agent_id)
        if active is not None and active.kind == kind and active.content == content:
            return _to_revision(active)  # same bundle again: no new revision
        seq = tx.add_policy_revision(agent_id, kind, revision, content, now)
        tx.add_policy_event(agent_id, PolicyEventType.ACTIVATED, now, actor=who.name, credential=who.credential,
                            seq=seq, payload={"kind": kind, "revision": revision, "via": _via(who),
                                              "from_seq": active.seq if active is not None else None})
        return _with_trail(tx, agent_id, [next(r for r in tx.list_policy_revisions(agent_id) if r.seq == seq)])[0]


def active_policy(k: Kernel, agent_id: str) -> PolicyRevision:
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        row = tx.active_policy(agent_id)
        if row is None:
            raise NotFound(f"agent {agent_id!r} has no policy bundle")
        return _with_trail(tx, agent_id, [row])[0]


def list_revisions(k: Kernel, agent_id: str) -> list[PolicyRevision]:
    """Every stored revision, oldest first, each with who stored it and who last made it active,
    and when (from the policy audit trail)."""
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        return _with_trail(tx, agent_id, tx.list_policy_revisions(agent_id))


def _with_trail(tx: Any, agent_id: str, rows: Iterable[Any]) -> list[PolicyRevision]:
    revisions = [_to_revision(r) for r in rows]
    if not revisions:
        return revisions
    stored: dict[int, Activation] = {}
    activated: dict[int, Activation] = {}
    for e in tx.policy_events(agent_id, MAX_TRAIL_EVENTS, ACTIVATIONS):  # newest first
        if e.seq is None:
            continue
        a = Activation(e.type, e.occurred_at, e.actor, e.credential, _payload(e).get("via"))
        activated.setdefault(int(e.seq), a)
        stored[int(e.seq)] = a  # the oldest one wins: the entry that stored the revision
    return [replace(r, stored=stored.get(r.seq), activated=activated.get(r.seq)) for r in revisions]


def _payload(e: Any) -> dict[str, Any]:
    import json

    try:
        value = json.loads(e.payload or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def revision_by_hash(k: Kernel, agent_id: str, policy_hash: str) -> PolicyRevision:
    """The stored bundle whose content hash is `policy_hash` (the newest, if stored more than once):
    the bundle behind any decision that recorded that hash."""
    h = policy_hash.lower()
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise invalid("a policy hash is 64 hex digits (SHA-256)")
    with k.store.read() as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        row = tx.policy_revision_by_hash(agent_id, h)
    if row is None:
        raise NotFound(f"agent {agent_id!r} has no revision with hash {h}")
    return _to_revision(row)


def policy_hash_of(k: Kernel, bundle: str, agent_id: str | None = None) -> str:
    """The policy hash a decision search means by `bundle`: a policy hash as given, the hash of
    the bundle stored under that revision name (of `agent_id` when given), or the one stored hash
    that starts with it (8 or more hex digits: the console shows a hash's first 12). ValidationError
    when no stored bundle, or more than one, answers to it."""
    text = check_text(bundle.strip(), "bundle")
    hexadecimal = all(c in "0123456789abcdef" for c in text.lower())
    if len(text) == 64 and hexadecimal:
        return text.lower()
    with k.store.read() as tx:
        hashes = tx.policy_hashes_of_revision(text, agent_id)
        what = "revision"
        if not hashes and 8 <= len(text) < 64 and hexadecimal:
            hashes = tx.policy_hashes_with_prefix(text.lower(), agent_id)
            what = "policy hash prefix"
    if not hashes:
        raise invalid(f"no stored bundle has the revision {text!r} "
                              "(give a revision, a policy hash or its first 8 or more digits)")
    if len(hashes) > 1:
        raise invalid(f"the {what} {text!r} names {len(hashes)} different bundles; "
                              f"pick an agent or give one of their policy hashes: {', '.join(h[:12] for h in hashes)}…")
    return hashes[0]


def activate_revision(k: Kernel, agent_id: str, seq: int, actor: Actor | None = None) -> None:
    check_text(agent_id, "agent id")
    if not 1 <= seq <= MAX_REVISION_SEQ:
        raise invalid(f"a revision is numbered 1-{MAX_REVISION_SEQ}")
    who = actor or Actor()
    with k.store.transaction(lock=f"policy:{agent_id}") as tx:
        if tx.get_agent(agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        refuse_if_pulled(k, agent_id, who, f"re-activating revision {seq}")
        active = tx.active_policy(agent_id)
        row = next((r for r in tx.list_policy_revisions(agent_id) if r.seq == seq), None)
        if row is None or not tx.activate_policy_revision(agent_id, seq):
            raise NotFound(f"agent {agent_id!r} has no revision {seq}")
        tx.add_policy_event(agent_id, PolicyEventType.ACTIVATED, k.clock.now(), actor=who.name,
                            credential=who.credential, seq=seq,
                            payload={"kind": row.kind, "revision": row.revision, "via": "reactivate",
                                     "from_seq": active.seq if active is not None else None})
