"""The agent-secret cache behind the signature check: a rotation is honoured at once, old secrets
stop working at once on the replica that changed them, and a change made behind the kernel's back
(another replica) is seen within the TTL."""

from __future__ import annotations

import time

from kernel.core.agents import register_agent
from kernel.core.kernel import Kernel
from kernel.domain import Agent
from tests.conftest import Running
from tests.support import AgentClient, ServerThread


def _register_over_http(server: ServerThread, agent_id: str, secret: str) -> None:
    import httpx

    r = httpx.post(server.url + "/v0/agents", json={
        "id": agent_id, "webhook_url": "http://127.0.0.1:9/webhook", "secret": secret,
    })
    assert r.status_code in (200, 201), r.text


def _change_secret_elsewhere(k: Kernel, agent_id: str, secret: str) -> None:
    """What another replica's registration looks like to this one: the row changes, no forget()."""
    with k.store.transaction() as tx:
        a = tx.get_agent(agent_id)
        assert isinstance(a, Agent)
        tx.upsert_agent(Agent(id=a.id, webhook_url=a.webhook_url, secret=secret, registered_at=a.registered_at))


def test_rotating_the_secret_over_the_admin_api_applies_at_once(server: ServerThread, running: Running) -> None:
    eid, did, att = running.start()
    old = AgentClient(server.url, running.agent_id, running.secret).lease(did, att)
    assert old.submit(eid, "t", {"n": 1}).status_code == 200  # the secret is now cached

    _register_over_http(server, running.agent_id, "rotated-secret")
    new = AgentClient(server.url, running.agent_id, "rotated-secret").lease(did, att)
    assert old.submit(eid, "t", {"n": 2}).status_code == 401
    assert new.submit(eid, "t", {"n": 3}).status_code == 200


def test_a_secret_changed_behind_the_kernel_works_at_once_and_the_old_one_expires(
    server: ServerThread, running: Running
) -> None:
    k = running.kernel
    eid, did, att = running.start()
    old = AgentClient(server.url, running.agent_id, running.secret).lease(did, att)
    assert old.submit(eid, "t", {"n": 1}).status_code == 200

    _change_secret_elsewhere(k, running.agent_id, "elsewhere")
    new = AgentClient(server.url, running.agent_id, "elsewhere").lease(did, att)
    assert new.submit(eid, "t", {"n": 2}).status_code == 200  # a failed check re-reads the store

    # The new secret's read replaced the cached entry, so the old one is refused from now on.
    assert old.submit(eid, "t", {"n": 3}).status_code == 401


def test_the_old_secret_is_accepted_no_longer_than_the_ttl(server: ServerThread, running: Running) -> None:
    k = running.kernel
    k.secrets.ttl = 0.3
    eid, did, att = running.start()
    old = AgentClient(server.url, running.agent_id, running.secret).lease(did, att)
    assert old.submit(eid, "t", {"n": 1}).status_code == 200
    _change_secret_elsewhere(k, running.agent_id, "elsewhere")
    time.sleep(0.35)
    assert old.submit(eid, "t", {"n": 2}).status_code == 401


def test_ttl_zero_reads_the_store_on_every_request(server: ServerThread, running: Running) -> None:
    k = running.kernel
    k.secrets.ttl = 0
    eid, did, att = running.start()
    c = AgentClient(server.url, running.agent_id, running.secret).lease(did, att)
    assert c.submit(eid, "t", {"n": 1}).status_code == 200
    assert k.secrets.get(running.agent_id) is None


def test_re_registering_through_the_core_forgets_the_cached_secret(running: Running) -> None:
    k = running.kernel
    k.secrets.put(running.agent_id, "cached")
    register_agent(k, running.agent_id, "http://127.0.0.1:9/webhook", "new", None, keep_policy=True)
    assert k.secrets.get(running.agent_id) is None
