"""R3 fuzz: schemathesis over the kernel's own OpenAPI document, then a hand list of hostile inputs.

Every operation gets its share of the request budget. Agent routes are signed (the v1 signature,
with a live lease when the id is a live execution's), client and admin routes carry the bearer
token, and path ids are often replaced by live ones so the fuzzer reaches past lookups. Every
answer must be < 500 and every 4xx must be the `{code, message}` envelope; the requests go over
one keep-alive connection, so a reset after an error shows up as a failed request. The hand list
(10 MB body, 10 000-deep JSON, NUL and lone surrogates, 2^70, path traversal, unknown agents)
must each get a clear 4xx (or, for 2^70, be stored losslessly) and write nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import random
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from reliability.audit import first
from reliability.procs import SECRET, Kernel, http_receiver, write_manifest
from reliability.report import Outcome

AGENT = "fuzz"


class Receiver:
    """The fuzz agent's webhook: records each lease (execution → dispatch id, attempt)."""

    def __init__(self) -> None:
        self.leases: dict[str, tuple[str, int]] = {}
        self.got: queue.Queue[str] = queue.Queue()
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                rec.leases[msg["execution_id"]] = (msg["dispatch_id"], int(msg["dispatch_attempt"]))
                rec.got.put(msg["execution_id"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.port, serving = http_receiver(Handler)
        serving.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sign(secret: str, method: str, target: str, ts: str, did: str, attempt: str, body: bytes,
         nonce: str | None = None) -> str:
    """The v1 signature; with a nonce, Regent's nonce message (docs/api.md, Replayed requests)."""
    if nonce is None:
        msg = f"rebuno-request-v1\n{method}\n{target}\n{ts}\n{did}\n{attempt}\n".encode() + body
    else:
        msg = f"rebuno-request-v1-nonce\n{method}\n{target}\n{ts}\n{did}\n{attempt}\n{nonce}\n".encode() + body
    return "v1=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def agent_headers(method: str, target: str, body: bytes, lease: tuple[str, int] | None,
                  agent_id: str = AGENT, secret: str = SECRET, ts: int | None = None,
                  nonce: str | None = None) -> dict[str, str]:
    stamp = str(ts if ts is not None else int(time.time()))
    did, att = (lease[0], str(lease[1])) if lease else ("", "")
    h = {"Rebuno-Agent-Id": agent_id, "Rebuno-Timestamp": stamp,
         "Rebuno-Signature": sign(secret, method, target, stamp, did, att, body, nonce)}
    if lease:
        h["Rebuno-Dispatch-Id"], h["Rebuno-Dispatch-Attempt"] = did, att
    if nonce is not None:
        h["Rebuno-Nonce"] = nonce
    return h


# The routes an agent signs (the dual GET routes take either; the fuzzer picks one at random).
def is_agent_route(method: str, path: str) -> bool:
    if path == "/v0/agents/{agent_id}/metadata":
        return True
    if not path.startswith("/v0/executions/{execution_id}"):
        return False
    tail = path.removeprefix("/v0/executions/{execution_id}")
    if method == "POST":
        return tail in ("/steps", "/heartbeat", "/complete", "/fail") or tail.startswith("/steps/{step_id}/")
    return False


def is_dual_route(method: str, path: str) -> bool:
    return method == "GET" and path in ("/v0/executions/{execution_id}", "/v0/executions/{execution_id}/steps",
                                        "/v0/executions/{execution_id}/steps/{step_id}")


def envelope_ok(r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("code"), str) and isinstance(body.get("message"), str)


class Fuzzer:
    def __init__(self, kernel: Kernel, receiver: Receiver, live: list[str], seed: int):
        self.seed = seed
        rnd = random.Random(seed)
        self.k = kernel
        self.rec = receiver
        self.live = live
        self.rnd = rnd
        self.http = httpx.Client(base_url=kernel.url, timeout=30)
        self.statuses: Counter[int] = Counter()
        self.by_op: dict[str, Counter[int]] = {}
        self.bad: list[str] = []  # ≥ 500, or a 4xx without the envelope, or a transport failure
        self.sent = 0
        self.last_status = 0
        self.dropped = 0  # connections that ended without an answer
        # Against the document: a 2xx body the schema does not describe, and a 400 for a request
        # the generator drew from the schema (a client generated from it would send the same).
        self.nonconforming: list[str] = []
        self.refused: list[str] = []

    def step_ids(self, eid: str) -> list[str]:
        r = self.http.get(f"/v0/executions/{eid}/steps", headers=self.k.bearer())
        return [s["step_id"] for s in r.json()] if r.status_code == 200 else []

    def send(self, case: Any) -> None:
        op = f"{case.method.upper()} {case.path}"
        params = dict(case.path_parameters or {})
        lease = None
        if "execution_id" in params and self.rnd.random() < 0.6:
            params["execution_id"] = self.rnd.choice(self.live)
            lease = self.rec.leases.get(params["execution_id"])
            if "step_id" in params and self.rnd.random() < 0.6:
                ids = self.step_ids(params["execution_id"])
                if ids:
                    params["step_id"] = self.rnd.choice(ids)
        if "agent_id" in params and self.rnd.random() < 0.5:
            params["agent_id"] = AGENT
        if lease is None and self.live:
            lease = self.rec.leases.get(self.rnd.choice(self.live))
        path = case.path
        for name, value in params.items():
            path = path.replace("{" + name + "}", quote(str(value).encode("utf-8", "surrogatepass"), safe=""))
        body = b""
        headers: dict[str, str] = {}
        if case.body is not None and type(case.body).__name__ != "NotSet":
            value = case.body
            if isinstance(value, dict) and self.rnd.random() < 0.5:
                # Names the fuzzer cannot guess, so some creates and registrations get through.
                if "agent_id" in value:
                    value = {**value, "agent_id": AGENT}
                if "webhook_url" in value:
                    value = {**value, "webhook_url": f"http://127.0.0.1:{self.rec.port}/webhook"}
            body = json.dumps(value).encode()
            headers["Content-Type"] = "application/json"
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                tag = " (lone surrogate in body)"
            else:
                tag = " (NUL in body)" if b"\\u0000" in body else ""
        else:
            tag = ""
        query = {k: v for k, v in (case.query or {}).items()}
        qs = httpx.QueryParams(query)
        target = path + (f"?{qs}" if query else "")
        method = case.method.upper()
        signed = is_agent_route(method, case.path) or (is_dual_route(method, case.path) and self.rnd.random() < 0.5)
        if signed:
            headers.update(agent_headers(method, target, body, lease if method != "GET" else None))
        else:
            headers.update(self.k.bearer())
        self.sent += 1
        after_500 = self.last_status == 500
        try:
            if case.path.endswith("/stream") and method == "GET":
                with self.http.stream(method, target, headers=headers, timeout=10) as r:
                    status = r.status_code
                    if status >= 400:
                        r.read()
            else:
                r = self.http.request(method, target, content=body, headers=headers)
                status = r.status_code
        except httpx.HTTPError as exc:
            self.bad.append(f"{op}: {type(exc).__name__}" + (" (after a 500: keep-alive reset)" if after_500 else ""))
            self.dropped += 1
            self.last_status = 0
            self.http.close()
            self.http = httpx.Client(base_url=self.k.url, timeout=30)
            return
        self.statuses[status] += 1
        self.last_status = status
        self.by_op.setdefault(op, Counter())[status] += 1
        if status >= 500:
            self.bad.append(f"{op} → {status}{tag} {r.text[:60]!r} for {target[:80]!r} {body[:160]!r}")
        elif status >= 400 and not envelope_ok(r):
            self.bad.append(f"{op} → {status} without the envelope {r.text[:80]!r}")
        elif status == 400 and r.json().get("code") == "validation_error":
            self.refused.append(f"{op}: {r.json().get('message', '')[:120]} for {target[:80]!r} {body[:100]!r}")
        elif status < 300 and r.headers.get("content-type", "").startswith("application/json"):
            self.conforms(case, op, r)

    def conforms(self, case: Any, op: str, r: httpx.Response) -> None:
        from schemathesis.specs.openapi.checks import response_schema_conformance

        try:
            case.validate_response(r, checks=[response_schema_conformance])
        except BaseExceptionGroup as exc:  # schemathesis' FailureGroup: what the document does not describe
            why = " | ".join(" ".join(str(e).split())[:200] for e in exc.exceptions)
            self.nonconforming.append(f"{op} → {r.status_code}: {why}")


def fuzz(fz: Fuzzer, doc: dict[str, Any], requests: int, seconds: float) -> int:
    import schemathesis
    from hypothesis import HealthCheck, given, seed, settings

    schema = schemathesis.openapi.from_dict(doc)
    ops = [r.ok() for r in schema.get_all_operations()]
    per_op = max(20, requests // max(1, len(ops)) + 1)
    deadline = time.monotonic() + seconds
    # Hypothesis stops early on an operation whose inputs it has exhausted (no parameters, a small
    # enum): further passes, each with its own seed, until the budget is spent (bounded).
    for n in range(10):
        if fz.sent >= requests or time.monotonic() > deadline:
            break
        for op in ops:
            if time.monotonic() > deadline:
                break

            @seed(fz.seed + n)
            @given(op.as_strategy())
            @settings(max_examples=per_op, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def t(case: Any) -> None:
                if time.monotonic() < deadline:
                    fz.send(case)

            t()
    return len(ops)


def hand_list(k: Kernel, live: str, lease: tuple[str, int] | None) -> list[tuple[str, int, str, bool]]:
    """(case, status, detail, held) for each hostile input."""
    out: list[tuple[str, int, str, bool]] = []
    bearer = {**k.bearer(), "Content-Type": "application/json"}
    deep = ("[" * 10_000 + "]" * 10_000).encode()
    cases: list[tuple[str, str, str, bytes, bool]] = [
        # name, method, path, body, signed
        ("10 MB body (create)", "POST", "/v0/executions", b'{"agent_id":"fuzz","input":"' + b"x" * (10 * 1024 * 1024) + b'"}', False),
        ("10 MB body (submit)", "POST", f"/v0/executions/{live}/steps",
         b'{"kind":"tool_call","target":"t","args":"' + b"x" * (10 * 1024 * 1024) + b'"}', True),
        ("JSON nested 10 000 deep (create)", "POST", "/v0/executions", b'{"agent_id":"fuzz","input":' + deep + b"}", False),
        ("JSON nested 10 000 deep (submit)", "POST", f"/v0/executions/{live}/steps",
         b'{"kind":"tool_call","target":"t","args":' + deep + b"}", True),
        ("NUL in agent_id", "POST", "/v0/executions", b'{"agent_id":"fu\\u0000zz"}', False),
        ("NUL in path", "GET", "/v0/agents/fu%00zz", b"", False),
        ("lone surrogate in target", "POST", f"/v0/executions/{live}/steps",
         b'{"kind":"tool_call","target":"\\udfff","args":null}', True),
        ("raw invalid UTF-8", "POST", "/v0/executions", b'{"agent_id":"fuzz","input":"\xff\xfe"}', False),
        ("integer of 5 000 digits in input", "POST", "/v0/executions",
         b'{"agent_id":"fuzz","input":' + b"9" * 5000 + b"}", False),
        ("after_seq = 2^63", "GET", f"/v0/executions/{live}/events?after_seq=9223372036854775808", b"", False),
        ("path traversal in agent id (GET)", "GET", "/v0/agents/..%2F..%2Fetc%2Fpasswd", b"", False),
        ("path traversal in agent id (register)", "POST", "/v0/agents",
         b'{"id":"../x","webhook_url":"http://127.0.0.1:9/w","secret":"s"}', False),
        ("path traversal in execution id", "GET", "/v0/executions/..%2F..%2Fagents", b"", False),
        ("unknown agent (create)", "POST", "/v0/executions", b'{"agent_id":"no-such-agent"}', False),
        ("unknown agent (signed)", "GET", f"/v0/executions/{live}", b"", True),
        ("huge lease_timeout_seconds", "POST", "/v0/agents",
         b'{"id":"fuzz-lease","webhook_url":"http://127.0.0.1:9/w","secret":"s","lease_timeout_seconds":4611686018427387904}',
         False),
        ("NUL in a decisions filter", "GET", "/v0/decisions?agent_id=fu%00zz", b"", False),
        ("superscript digit as a number", "GET", "/v0/policies/fuzz/shadow/report?samples=%C2%B2", b"", False),
        ("superscript digit as the dispatch attempt", "POST", f"/v0/executions/{live}/steps",
         b'{"kind":"tool_call","target":"t","args":null}', True),
    ]
    for name, method, path, body, signed in cases:
        # A fresh connection per case: one case's reset must not be charged to the next.
        with httpx.Client(base_url=k.url, timeout=60) as http:
            headers = dict(bearer)
            if signed:
                agent = "no-such-agent" if name.startswith("unknown agent") else AGENT
                signed_lease: Any = lease if method == "POST" else None
                if name.endswith("dispatch attempt") and lease is not None:
                    signed_lease = (lease[0], "\u00b2")  # "²": str.isdigit() says yes, int() no
                headers = {"Content-Type": "application/json",
                           **agent_headers(method, path, body, signed_lease, agent_id=agent)}
            try:
                # Header values as the wire carries them (latin-1), so "²" is sent as one byte.
                r = http.request(method, path, content=body,
                                 headers={h: v.encode("latin-1") for h, v in headers.items()})
            except httpx.HTTPError as exc:
                out.append((name, 0, type(exc).__name__, False))
                continue
        ok = 400 <= r.status_code < 500 and envelope_ok(r)
        out.append((name, r.status_code, (r.json().get("code", "") if envelope_ok(r) else r.text[:60]), ok))
    with httpx.Client(base_url=k.url, timeout=60) as http:
        # A lone surrogate in a JSON value: a clear 4xx, or (docs/api.md, "Text") stored as an
        # escape and read back exactly.
        r = http.post("/v0/executions", content=b'{"agent_id":"fuzz","input":"\\ud800"}', headers=bearer)
        if r.status_code in (200, 201):
            back = http.get(f"/v0/executions/{r.json()['id']}", headers=bearer).json()
            out.append(("lone surrogate in input", r.status_code, "stored, read back exactly"
                        if back["input"] == "\ud800" else f"read back as {back['input']!r}", back["input"] == "\ud800"))
        else:
            out.append(("lone surrogate in input", r.status_code, "", 400 <= r.status_code < 500 and envelope_ok(r)))
        # 2^70: a clear 4xx, or stored and read back exactly.
        big = 2 ** 70
        r = http.post("/v0/executions", content=b'{"agent_id":"fuzz","input":{"n":%d}}' % big, headers=bearer)
        if r.status_code in (200, 201):
            back = http.get(f"/v0/executions/{r.json()['id']}", headers=bearer).json()
            out.append(("2^70 in input", r.status_code, "stored, read back exactly" if back["input"] == {"n": big}
                        else f"read back as {back['input']!r}", back["input"] == {"n": big}))
        else:
            out.append(("2^70 in input", r.status_code, "", 400 <= r.status_code < 500 and envelope_ok(r)))
    return out


def counts(k: Kernel) -> tuple[int, int]:
    with httpx.Client(base_url=k.url, headers=k.bearer(), timeout=30) as http:
        agents = len(http.get("/v0/agents").json())
        n, cursor = 0, None
        for _ in range(1000):
            page = http.get("/v0/executions", params={"limit": 200, **({"cursor": cursor} if cursor else {})}).json()
            n += len(page["executions"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
    return agents, n


def run(tmp: Path, *, requests: int, seed: int, seconds: float = 150.0, db_url: str | None = None,
        label: str = "SQLite") -> Outcome:
    out = Outcome("R3", f"fuzz ({label})", tried=f"schemathesis over /openapi.json, ≥ {requests} requests, "
                                                 "signed agent routes; then the hand list")
    started = time.monotonic()
    rec = Receiver()
    manifest = write_manifest(tmp / "regent.yaml", {AGENT: rec.port})
    k = Kernel(db_url or f"sqlite:///{tmp}/r3.db", tmp / "kernel.log", manifest=manifest,
               REGENT_DISPATCH_LEASE_TIMEOUT="1h", REGENT_DISPATCH_POLL_INTERVAL="50ms").start()
    try:
        with httpx.Client(base_url=k.url, headers=k.bearer(), timeout=30) as http:
            live = [http.post("/v0/executions", json={"agent_id": AGENT, "input": {"i": i}}).json()["id"]
                    for i in range(4)]
            doc = http.get("/openapi.json").json()
        deadline = time.monotonic() + 30
        while len(rec.leases) < len(live) and time.monotonic() < deadline:
            time.sleep(0.05)
        fz = Fuzzer(k, rec, live, seed)
        n_ops = fuzz(fz, doc, requests, seconds)
        fz.http.close()
        health = httpx.get(k.url + "/v0/health", timeout=5).status_code
        before = counts(k)
        hand = hand_list(k, live[0], rec.leases.get(live[0]))
        after = counts(k)
        two_xx = sum(n for s, n in fz.statuses.items() if s < 300)
        out.check(f"≥ {requests} requests over {n_ops} operations", fz.sent >= requests, f"{fz.sent} sent")
        out.check("0 answers ≥ 500, every 4xx in the envelope, no reset",
                  not fz.bad, f"{len(fz.bad)}: {first(fz.bad, 2)}" if fz.bad else "", items=fz.bad)
        out.check("past validation (2xx answers)", two_xx > 0, f"{two_xx}")
        out.check("every 2xx answer as the document describes it", not fz.nonconforming,
                  f"{len(fz.nonconforming)}: {first(fz.nonconforming, 2)}" if fz.nonconforming else "",
                  items=fz.nonconforming)
        out.check("kernel alive after", health == 200 and k.alive())
        failed = [f"{n} → {s} {d}" for n, s, d, ok in hand if not ok]
        out.check(f"hand list: a clear 4xx each ({len(hand)})", not failed, first(failed, 4), items=failed)
        # 2^70 and a lone surrogate in a JSON value may be stored (one execution each, read back
        # exactly); nothing else may be.
        kept = ("2^70 in input", "lone surrogate in input")
        stored_big = sum(1 for n, s, _, _ in hand if n in kept and s in (200, 201))
        written = [f"{n} → {s}" for n, s, _, _ in hand if s in (200, 201) and n not in kept]
        out.check("hand list wrote nothing", after[0] == before[0] and after[1] - before[1] == stored_big,
                  f"agents {before[0]}→{after[0]}, executions {before[1]}→{after[1]}", items=written or None)
        out.figures = {"requests": fz.sent, "operations": n_ops,
                       "statuses": " ".join(f"{s}×{n}" for s, n in sorted(fz.statuses.items())),
                       "5xx": sum(n for s, n in fz.statuses.items() if s >= 500), "dropped": fz.dropped,
                       "envelope violations": sum(1 for b in fz.bad if "without the envelope" in b),
                       # Drawn from the schema yet refused: mostly rules no schema states (an agent
                       # with no bundle, an unregistered resource, a fork past the last event).
                       "schema-valid refused": len(fz.refused)}
        out.details = {"hand": hand, "bad": fz.bad[:50], "by_op": {o: dict(c) for o, c in fz.by_op.items()},
                       "nonconforming": fz.nonconforming, "refused": fz.refused}
    finally:
        k.stop()
        rec.close()
        out.seconds = time.monotonic() - started
    return out
