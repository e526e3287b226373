"""Replayed signed requests (docs/api.md, Replayed requests), over real HTTP on SQLite and
PostgreSQL: a byte-identical repeat of a signed mutation is refused 401, except a step submit
without a nonce (the official SDK repeats those bytes for two identical steps in one second);
a nonce-signed request is refused on any repeat; two replicas on one PostgreSQL share the record."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from kernel.core.request_reuse import ReplayGuard
from kernel.signing import sign_request, signature_message
from kernel.store import SqlStore, open_store
from tests.conftest import Running
from tests.support import ServerThread

NONCE = "n0nce-0123456789abcdef"


class Signed:
    """Exactly the bytes a signed request puts on the wire, so a test can send them again."""

    def __init__(self, running: Running, did: str, att: int):
        self.agent_id, self.secret = running.agent_id, running.secret
        self.did, self.att = did, str(att)

    def request(self, method: str, path: str, body: Any = None, *, nonce: str | None = None,
                ts: int | None = None) -> tuple[str, str, bytes, dict[str, str]]:
        data = b"" if body is None else json.dumps(body).encode()
        stamp = str(ts if ts is not None else int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "Rebuno-Agent-Id": self.agent_id,
            "Rebuno-Timestamp": stamp,
            "Rebuno-Dispatch-Id": self.did,
            "Rebuno-Dispatch-Attempt": self.att,
            "Rebuno-Signature": sign_request(self.secret, method, path, stamp, self.did, self.att, data, nonce),
        }
        if nonce is not None:
            headers["Rebuno-Nonce"] = nonce
        return method, path, data, headers


def send(http: httpx.Client, req: tuple[str, str, bytes, dict[str, str]]) -> httpx.Response:
    method, path, data, headers = req
    return http.request(method, path, content=data, headers=headers)


def submit_body(target: str = "echo", args: Any = None) -> dict[str, Any]:
    return {"kind": "tool_call", "target": target, "args": args or {"x": 1}, "idempotency": "safe_to_retry",
            "resources": []}


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def refused_as_replay(r: httpx.Response) -> bool:
    return r.status_code == 401 and r.json()["code"] == "unauthorized" and "already seen" in r.json()["message"]


def test_the_nonce_message_layout_and_its_separation_from_v1() -> None:
    msg = signature_message("POST", "/v0/x", "1700000000", "d", "1", b"{}", NONCE)
    assert msg == f"rebuno-request-v1-nonce\nPOST\n/v0/x\n1700000000\nd\n1\n{NONCE}\n{{}}".encode()
    want = hmac.new(b"k", msg, hashlib.sha256).hexdigest()
    assert sign_request("k", "POST", "/v0/x", "1700000000", "d", "1", b"{}", NONCE) == "v1=" + want
    # the nonce moved into the body of a v1 message is not the same message
    v1 = signature_message("POST", "/v0/x", "1700000000", "d", "1", f"{NONCE}\n{{}}".encode())
    assert v1 != msg


def test_a_replayed_step_complete_is_refused_and_records_nothing(http: httpx.Client, running: Running) -> None:
    eid, did, att = running.start()
    s = Signed(running, did, att)
    sid = send(http, s.request("POST", f"/v0/executions/{eid}/steps", submit_body())).json()["step_id"]
    complete = s.request("POST", f"/v0/executions/{eid}/steps/{sid}/complete", {"result": {"ok": True}})
    assert send(http, complete).json() == {"decision": "recorded"}
    events = http.get(f"/v0/executions/{eid}/events").json()
    r = send(http, complete)
    assert refused_as_replay(r), r.text
    assert http.get(f"/v0/executions/{eid}/events").json() == events
    metrics = http.get("/metrics").text
    assert "regent_replays_refused_total 1.0" in metrics
    assert "regent_replay_cache_entries 1.0" in metrics  # the complete; a nonce-less submit is not kept


@pytest.mark.parametrize("route", ["heartbeat", "fail", "complete"], ids=lambda r: f"execution-{r}")
def test_a_replayed_execution_mutation_is_refused(http: httpx.Client, running: Running, route: str) -> None:
    eid, did, att = running.start()
    s = Signed(running, did, att)
    body = {"error": "agent_error: x"} if route == "fail" else ({"output": 1} if route == "complete" else None)
    req = s.request("POST", f"/v0/executions/{eid}/{route}", body)
    assert send(http, req).status_code == 204
    assert refused_as_replay(send(http, req))


def test_identical_submits_without_a_nonce_are_two_occurrences(http: httpx.Client, running: Running) -> None:
    """What the official SDK sends for two identical steps within one second: the same bytes."""
    eid, did, att = running.start()
    s = Signed(running, did, att)
    submit = s.request("POST", f"/v0/executions/{eid}/steps", submit_body())
    first, second = send(http, submit).json(), send(http, submit).json()
    assert first["decision"] == second["decision"] == "proceed"
    assert first["step_id"] != second["step_id"]
    assert sorted(st["occurrence"] for st in http.get(f"/v0/executions/{eid}/steps").json()) == [0, 1]


def test_a_replayed_submit_with_a_nonce_is_refused_and_a_new_nonce_is_a_new_occurrence(
    http: httpx.Client, running: Running,
) -> None:
    eid, did, att = running.start()
    s = Signed(running, did, att)
    path = f"/v0/executions/{eid}/steps"
    ts = int(time.time())
    submit = s.request("POST", path, submit_body(), nonce=NONCE, ts=ts)
    assert send(http, submit).json()["decision"] == "proceed"
    assert refused_as_replay(send(http, submit))
    again = send(http, s.request("POST", path, submit_body(), nonce=NONCE[::-1], ts=ts)).json()
    assert again["decision"] == "proceed"
    assert len(http.get(f"/v0/executions/{eid}/steps").json()) == 2


def test_a_nonce_cannot_be_stripped_or_moved_into_the_body(http: httpx.Client, running: Running) -> None:
    eid, did, att = running.start()
    s = Signed(running, did, att)
    _, path, data, headers = s.request("POST", f"/v0/executions/{eid}/heartbeat", nonce=NONCE)
    stripped = {k: v for k, v in headers.items() if k != "Rebuno-Nonce"}
    assert http.post(path, content=data, headers=stripped).status_code == 401
    assert http.post(path, content=f"{NONCE}\n".encode(), headers=stripped).status_code == 401
    assert http.post(path, content=data, headers={**headers, "Rebuno-Nonce": NONCE.upper()}).status_code == 401
    assert http.post(path, content=data, headers=headers).status_code == 204


@pytest.mark.parametrize("nonce", ["short", "x" * 129, "has space 0123456789", "dots.are.not.allowed"])
def test_a_malformed_nonce_is_401(http: httpx.Client, running: Running, nonce: str) -> None:
    eid, did, att = running.start()
    req = Signed(running, did, att).request("POST", f"/v0/executions/{eid}/heartbeat", nonce=nonce)
    assert send(http, req).status_code == 401


def test_a_repeated_nonce_header_is_401(http: httpx.Client, running: Running) -> None:
    eid, did, att = running.start()
    _, path, data, headers = Signed(running, did, att).request("POST", f"/v0/executions/{eid}/heartbeat",
                                                                     nonce=NONCE)
    r = http.post(path, content=data, headers=[*headers.items(), ("Rebuno-Nonce", NONCE)])
    assert r.status_code == 401


def test_reads_repeat_freely(http: httpx.Client, running: Running) -> None:
    eid, did, att = running.start()
    read = Signed(running, did, att).request("GET", f"/v0/executions/{eid}")
    assert [send(http, read).status_code for _ in range(3)] == [200, 200, 200]


def test_a_kernel_that_requires_a_nonce_refuses_mutations_without_one(kernel: Kernel, running: Running) -> None:
    app = create_app(kernel, dev=True, require_request_nonce=True)
    eid, did, att = running.start()
    s = Signed(running, did, att)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as http:
        r = send(http, s.request("POST", f"/v0/executions/{eid}/steps", submit_body()))
        assert r.status_code == 401 and "Rebuno-Nonce" in r.json()["message"]
        assert send(http, s.request("GET", f"/v0/executions/{eid}")).status_code == 200
        ok = send(http, s.request("POST", f"/v0/executions/{eid}/steps", submit_body(), nonce=NONCE))
        assert ok.json()["decision"] == "proceed"


@contextlib.contextmanager
def two_replicas(pg_database: str, **app: Any) -> Iterator[tuple[Replicas, httpx.Client]]:
    """Two kernels on one (truncated) PostgreSQL database, each served over loopback, and one
    running execution of the first's agent."""
    from tests.conftest import _truncate

    stores = [open_store(pg_database), open_store(pg_database)]
    _truncate(stores[0])
    try:
        kernels = [Kernel(store=st) for st in stores]
        running = Running(kernels[0])
        eid, did, att = running.start()
        with ServerThread(create_app(kernels[0], dev=True, **app)) as a, \
                ServerThread(create_app(kernels[1], dev=True, **app)) as b, httpx.Client(timeout=10) as http:
            yield Replicas(stores[0], running, eid, did, att, a.url, b.url), http
    finally:
        for st in stores:
            st.close()


@dataclasses.dataclass
class Replicas:
    store: SqlStore
    running: Running
    eid: str
    did: str
    att: int
    a: str  # the two replicas' base URLs
    b: str


@pytest.mark.postgres
def test_two_replicas_on_one_postgresql_share_the_record(pg_database: str) -> None:
    with two_replicas(pg_database) as (r, http):
        s = Signed(r.running, r.did, r.att)
        _, path, data, headers = s.request("POST", f"/v0/executions/{r.eid}/heartbeat")
        assert http.post(r.a + path, content=data, headers=headers).status_code == 204
        refused = http.post(r.b + path, content=data, headers=headers)
        assert refused_as_replay(refused), refused.text
        submit = s.request("POST", f"/v0/executions/{r.eid}/steps", submit_body(), nonce=NONCE)
        assert http.post(r.b + submit[1], content=submit[2], headers=submit[3]).json()["decision"] == "proceed"
        assert refused_as_replay(http.post(r.a + submit[1], content=submit[2], headers=submit[3]))


@pytest.mark.postgres
def test_the_shared_record_is_checked_in_the_use_cases_lane_job(pg_database: str) -> None:
    """Hot routes check the shared record on the lane in their use case's job, just before it
    (kernel/lane.py `before_next_call`): a refused request's use case never runs, one
    whose use case fails stays recorded, and one refused before its use case (a malformed body)
    is not recorded as accepted."""
    with two_replicas(pg_database) as (r, http):
        eid = r.eid

        def on(url: str, req: tuple[str, str, bytes, dict[str, str]]) -> httpx.Response:
            return send(http, (req[0], url + req[1], req[2], req[3]))

        s = Signed(r.running, r.did, r.att)
        stale = Signed(r.running, r.did, r.att + 1)  # a lease the kernel never granted: 409
        beat = stale.request("POST", f"/v0/executions/{eid}/heartbeat")
        assert on(r.a, beat).status_code == 409
        assert refused_as_replay(on(r.b, beat))
        submit = s.request("POST", f"/v0/executions/{eid}/steps", submit_body(), nonce=NONCE)
        sid = on(r.a, submit).json()["step_id"]
        bad = s.request("POST", f"/v0/executions/{eid}/steps/{sid}/complete", {"result": 1, "nope": 2})
        assert on(r.a, bad).status_code == 400
        assert on(r.b, bad).status_code == 400  # not recorded
        done = s.request("POST", f"/v0/executions/{eid}/steps/{sid}/complete", {"result": {"ok": True}})
        assert refused_as_replay(on(r.a, done)) is False
        assert refused_as_replay(on(r.b, done))
        with r.store.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM request_signatures")).scalar_one() == 3
            n = c.execute(text("SELECT count(*) FROM events WHERE execution_id = :e AND type = 'step.succeeded'"),
                          {"e": eid}).scalar_one()
            assert n == 1


@pytest.mark.postgres
def test_replay_shared_off_keeps_the_record_per_replica(pg_database: str) -> None:
    """REGENT_REPLAY_SHARED=false: each replica refuses its own repeats; the table stays empty."""
    with two_replicas(pg_database, replay_shared=False) as (r, http):
        _, path, data, headers = Signed(r.running, r.did, r.att).request("POST", f"/v0/executions/{r.eid}/heartbeat")
        assert http.post(r.a + path, content=data, headers=headers).status_code == 204
        assert refused_as_replay(http.post(r.a + path, content=data, headers=headers))
        assert http.post(r.b + path, content=data, headers=headers).status_code == 204  # the documented cost
        with r.store.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM request_signatures")).scalar_one() == 0


# -- the bounded cache ---------------------------------------------------------------------------

def test_the_guard_refuses_a_repeat_and_forgets_it_once_the_window_has_passed() -> None:
    g = ReplayGuard(window_seconds=300, max_entries=10)
    assert g.first_sight("a", 1000, "s", now_unix=1000)
    assert not g.first_sight("a", 1000, "s", now_unix=1200)
    assert g.first_sight("b", 1000, "s", now_unix=1200)  # another agent's key
    assert g.first_sight("a", 1001, "s", now_unix=1200)  # another timestamp
    assert not g.first_sight("a", 1000, "s", now_unix=1300)  # still inside the window (inclusive)
    assert g.first_sight("z", 1301, "t", now_unix=1301) and len(g) == 2  # 1000 entries gone
    assert g.refused == 2


def test_a_full_guard_drops_the_oldest_and_refuses_at_or_below_it() -> None:
    g = ReplayGuard(window_seconds=300, max_entries=3)
    for ts in (100, 101, 102):
        assert g.first_sight("a", ts, f"s{ts}", now_unix=102)
    assert g.first_sight("a", 103, "s103", now_unix=103) and len(g) == 3
    assert g.floor == 100
    assert not g.first_sight("a", 100, "s100", now_unix=103)  # dropped, yet still refused
    assert not g.first_sight("a", 100, "other", now_unix=103)  # at the floor: fail closed
    assert g.first_sight("a", 104, "s104", now_unix=104)
    assert g.floor == 101 and len(g) == 3
