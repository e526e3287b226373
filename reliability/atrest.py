"""R10 hostile values at rest: store each hostile value through the API, then read it back through
every surface (API GETs, console pages as a signed-in user, the audit exports, the event stream,
the decision-log file, webhook deliveries), counting 5xx, cut answers and values read back wrong.

One execution with `"\\ud800"` as its input made /console/executions a 500 for every user while
it was on the first page; the values below are each legal to store (docs/api.md, "Text")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from reliability.fuzz import agent_headers
from reliability.procs import TOKEN, Kernel, http_receiver, write_manifest
from reliability.report import Outcome

AGENT = "hostile"
POLICY = """default_action: allow
rules:
  - id: ask-a-human
    when:
      target: ask
    then:
      decision: require_approval
      reason: a human looks at every ask
      approval_config:
        approvers: [oncall]
        timeout: 15m
"""


def _nested(depth: int) -> Any:
    value: Any = "\ud800"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


# Each may be stored (docs/api.md, "Text", "Bounds"); none may break a page, an answer or a log.
HOSTILE: dict[str, Any] = {
    "lone surrogate": "\ud800",
    "lone surrogates as keys": {"\udfff": ["x\ud800y", "\udbff\udbff"], "ok": "\U0001f600"},
    "NUL": "a\x00b",
    "100 KB string": "</textarea><script>alert(1)</script>&amp;\u202e" * 2000,
    "deep nesting": _nested(400),
    "huge integer": -(10 ** 4299),
    "huge float": 1.7976931348623157e308,
    "markup": {"<img src=x onerror=alert(1)>": "{{ 7*7 }}{% raw %}", "\"'": "\u2028\u2029"},
}
# Numbers neither engine can compute with: a step carrying one is denied `eval-error` in both
# (docs/policy.md, "Numbers"), so it asks for no approval; it is stored and read back all the same.
OUT_OF_RANGE = frozenset({"huge float"})
# Text stored in typed columns: the widest a client may send (docs/api.md, "Bounds").
RATIONALE = "<b>why</b> \u202e " + "r" * 4000
STREAM_DATA = "\ud800 a\x00b <script>"


class Webhooks:
    """The hostile agent's webhook: records each delivery's raw body (so a body the kernel could
    not encode shows up as missing or undecodable) and its lease."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.leases: dict[str, tuple[str, int]] = {}
        self.arrived = threading.Condition()
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with rec.arrived:
                    rec.bodies.append(raw)
                    try:
                        msg = json.loads(raw)
                        rec.leases[msg["execution_id"]] = (msg["dispatch_id"], int(msg["dispatch_attempt"]))
                    except (ValueError, KeyError, TypeError):
                        pass
                    rec.arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.port, serving = http_receiver(Handler)
        serving.start()

    def lease(self, execution_id: str, after: tuple[str, int] | None = None,
              timeout: float = 30.0) -> tuple[str, int] | None:
        """The execution's lease (a newer one than `after`, when given), waiting for its delivery."""
        with self.arrived:
            self.arrived.wait_for(lambda: self.leases.get(execution_id, after) != after, timeout)
            got = self.leases.get(execution_id)
            return got if got != after else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Walk:
    """What was stored (ids per hostile value) and what each read surface answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"})
        self.problems: list[str] = []
        self.reads = 0
        self.executions: dict[str, str] = {}  # hostile name → execution id
        self.steps: dict[str, list[str]] = {}  # execution id → step ids
        self.approvals: list[str] = []
        self.document: Any = None  # the served OpenAPI document, read on first use

    def note(self, ok: bool, what: str) -> bool:
        if not ok:
            self.problems.append(what[:300])
        return ok

    def signed(self, method: str, path: str, body: Any, lease: tuple[str, int] | None) -> httpx.Response:
        raw = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **agent_headers(method, path, raw, lease, agent_id=AGENT)}
        return self.http.request(method, path, content=raw, headers=headers)

    def post(self, path: str, body: Any) -> httpx.Response:
        # json.dumps escapes every non-ASCII character, so a lone surrogate goes out as `\ud800`.
        return self.http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})

    def get(self, path: str, op: str | None = None, **params: Any) -> httpx.Response | None:
        """GET `path`; with `op` (its path template) a 2xx body must match the served document."""
        self.reads += 1
        try:
            r = self.http.get(path, params=params or None)
        except httpx.HTTPError as exc:
            self.note(False, f"GET {path} {params}: {type(exc).__name__} (answer cut)")
            return None
        self.note(r.status_code < 500, f"GET {path} {params} → {r.status_code} {r.text[:120]!r}")
        if op is not None and r.status_code < 300:
            self.conforms("GET", op, r)
        return r

    def conforms(self, method: str, op: str, r: httpx.Response) -> None:
        import schemathesis

        if self.document is None:
            self.document = schemathesis.openapi.from_dict(self.http.get("/openapi.json").json())
        try:
            self.document[op][method].validate_response(r)
        except BaseExceptionGroup as exc:  # schemathesis' FailureGroup
            why = " | ".join(" ".join(str(e).split())[:240] for e in exc.exceptions)
            self.note(False, f"{method} {op} → {r.status_code}: not as the document says: {why}")


def store(w: Walk, hooks: Webhooks) -> None:
    """Every hostile value into every place the API keeps one."""
    for name, value in HOSTILE.items():
        r = w.post("/v0/executions", {"agent_id": AGENT, "input": value})
        if not w.note(r.status_code == 201, f"create with {name} → {r.status_code} {r.text[:120]!r}"):
            continue
        eid = r.json()["id"]
        w.executions[name] = eid
        lease = hooks.lease(eid)
        if not w.note(lease is not None, f"no webhook delivery for the execution holding {name}"):
            continue
        base = f"/v0/executions/{eid}"
        ids: list[str] = []
        done = w.signed("POST", f"{base}/steps", {"kind": "tool_call", "target": "tool", "args": value}, lease)
        if w.note(done.status_code == 200, f"submit args {name} → {done.status_code} {done.text[:120]!r}"):
            sid = done.json()["step_id"]
            ids.append(sid)
            w.signed("POST", f"{base}/steps/{sid}/stream", {"seq": 1, "data": STREAM_DATA}, lease)
            r = w.signed("POST", f"{base}/steps/{sid}/complete", {"result": value}, lease)
            w.note(r.status_code < 300, f"complete with result {name} → {r.status_code} {r.text[:120]!r}")
        failed = w.signed("POST", f"{base}/steps", {"kind": "tool_call", "target": "tool2", "args": None}, lease)
        if w.note(failed.status_code == 200, f"submit → {failed.status_code}"):
            sid = failed.json()["step_id"]
            ids.append(sid)
            r = w.signed("POST", f"{base}/steps/{sid}/fail", {"error": value}, lease)
            w.note(r.status_code < 300, f"fail with error {name} → {r.status_code} {r.text[:120]!r}")
        ask = w.signed("POST", f"{base}/steps", {"kind": "tool_call", "target": "ask", "args": {"v": value}}, lease)
        if name in OUT_OF_RANGE and ask.status_code == 200 and ask.json().get("rule_id") == "eval-error":
            pass  # denied before any rule, as docs/policy.md ("Numbers") says: stored, but never asked
        elif w.note(ask.status_code == 200 and ask.json().get("approval_id"),
                  f"submit ask {name} → {ask.status_code} {ask.text[:160]!r}"):
            ids.append(ask.json()["step_id"])
            aid = ask.json()["approval_id"]
            w.approvals.append(aid)
            r = w.post(f"/v0/approvals/{aid}/grant", {"decided_by": "oncall", "rationale": RATIONALE})
            w.note(r.status_code < 300, f"grant with a long rationale → {r.status_code} {r.text[:120]!r}")
            lease = hooks.lease(eid, after=lease)  # a grant redelivers the execution under a new lease
            if not w.note(lease is not None, f"no redelivery after the grant ({name})"):
                continue
        w.steps[eid] = ids
        r = w.signed("POST", f"{base}/complete", {"output": value}, lease)
        w.note(r.status_code < 300, f"complete execution with output {name} → {r.status_code} {r.text[:120]!r}")
    path = f"/v0/agents/{AGENT}/metadata"
    r = w.signed("PUT", path, {"description": "<script>", "input_schema": HOSTILE["lone surrogates as keys"],
                               "output_schema": HOSTILE["deep nesting"]}, None)
    w.note(r.status_code < 300, f"agent metadata → {r.status_code} {r.text[:120]!r}")


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _as_args(value: Any) -> Any:
    """`value` as a step's args read it back: lone surrogates become U+FFFD, as in the step's
    identity (docs/api.md, "Text"; rebuno-v0 §1.2)."""
    if isinstance(value, str):
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)
    if isinstance(value, list):
        return [_as_args(v) for v in value]
    if isinstance(value, dict):
        return {_as_args(k): _as_args(v) for k, v in value.items()}
    return value


def walk_api(w: Walk) -> None:
    for name, eid in w.executions.items():
        value = HOSTILE[name]
        r = w.get(f"/v0/executions/{eid}", "/v0/executions/{execution_id}")
        if r is not None and r.status_code == 200:
            body = r.json()
            w.note(_same(body.get("input"), value), f"GET execution: input {name} read back differently")
            w.note(_same(body.get("output"), value), f"GET execution: output {name} read back differently")
        r = w.get(f"/v0/executions/{eid}/steps", "/v0/executions/{execution_id}/steps")
        if r is not None and r.status_code == 200:
            args = [s.get("args") for s in r.json() if s.get("target") == "tool"]
            w.note(bool(args) and _same(args[0], _as_args(value)), f"GET steps: args {name} read back differently")
        for sid in w.steps.get(eid, []):
            w.get(f"/v0/executions/{eid}/steps/{sid}", "/v0/executions/{execution_id}/steps/{step_id}")
        for path in ("events", "previous", "fork-points", "resources"):
            w.get(f"/v0/executions/{eid}/{path}", f"/v0/executions/{{execution_id}}/{path}")
        w.get("/v0/decisions", "/v0/decisions", execution_id=eid)
    for path in ("/v0/executions", "/v0/decisions", "/v0/agents", "/v0/api-keys", "/metrics"):
        w.get(path, path)
    for path in ("/v0/agents/{agent_id}", "/v0/policies/{agent_id}", "/v0/policies/{agent_id}/revisions",
                 "/v0/policies/{agent_id}/events", "/v0/policies/{agent_id}/shadow/report"):
        w.get(path.replace("{agent_id}", AGENT), path)
    w.get("/v0/executions", "/v0/executions", limit=200)
    w.get("/v0/approvals", "/v0/approvals", status="all")
    for aid in w.approvals:
        w.get(f"/v0/approvals/{aid}", "/v0/approvals/{approval_id}")


@contextmanager
def signed_in(url: str) -> Iterator[httpx.Client]:
    """A console session, as a browser gets one: the bootstrap token posted to the sign-in form."""
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/console/sign-in", data={"token": TOKEN, "next": "/console/executions"})
        if r.status_code != 303:
            raise RuntimeError(f"console sign-in → {r.status_code} {r.text[:200]!r}")
        yield c


def walk_console(w: Walk) -> None:
    pages = ["/console/executions", "/console/approvals", "/console/approvals?status=all", "/console/audit",
             "/console/audit/chart.svg", "/console/audit/export.jsonl", "/console/audit/export.csv",
             "/console/policies", "/console/playground"]
    for eid in w.executions.values():
        pages += [f"/console/executions/{eid}", f"/console/executions/{eid}/live",
                  f"/console/audit?execution_id={eid}", f"/console/audit/export.jsonl?execution_id={eid}",
                  f"/console/audit/export.csv?execution_id={eid}", f"/console/playground?execution_id={eid}"]
    with signed_in(w.url) as c:
        for p in pages:
            w.reads += 1
            try:
                r = c.get(p)
            except httpx.HTTPError as exc:
                w.note(False, f"console {p}: {type(exc).__name__} (answer cut)")
                continue
            w.note(r.status_code in (200, 204), f"console {p} → {r.status_code} {r.text[:160]!r}")
            if p.startswith("/console/audit/export.jsonl") and r.status_code == 200:
                for line in filter(None, r.text.split("\n")):
                    try:
                        json.loads(line)
                    except ValueError:
                        w.note(False, f"console {p}: a line that is not JSON {line[:80]!r}")
                        break


def walk_stream(w: Walk, hooks: Webhooks) -> None:
    """An event-stream frame carrying a hostile delta reaches a subscriber whole."""
    r = w.post("/v0/executions", {"agent_id": AGENT, "input": None})
    eid = r.json()["id"]
    lease = hooks.lease(eid)
    if not w.note(lease is not None, "no webhook delivery for the stream execution"):
        return
    base = f"/v0/executions/{eid}"
    sid = w.signed("POST", f"{base}/steps", {"kind": "tool_call", "target": "tool", "args": None}, lease).json()["step_id"]
    frames: list[str] = []
    ready, got = threading.Event(), threading.Event()

    def listen() -> None:
        try:
            with w.http.stream("GET", f"{base}/stream", timeout=30) as s:
                ready.set()
                for line in s.iter_lines():
                    if line.startswith("data:"):
                        frames.append(line[5:].strip())
                        got.set()
                        return
        except httpx.HTTPError as exc:
            frames.append(f"cut: {type(exc).__name__}")
            got.set()
        finally:
            ready.set()

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    ready.wait(30)
    deadline = time.monotonic() + 30
    while not got.is_set() and time.monotonic() < deadline:  # until the subscription is live
        w.signed("POST", f"{base}/steps/{sid}/stream", {"seq": 1, "data": STREAM_DATA}, lease)
        got.wait(0.2)
    t.join(5)
    w.reads += 1
    if w.note(bool(frames), "no event-stream frame for a hostile delta"):
        try:
            frame = json.loads(frames[0])
            w.note(frame.get("data") == STREAM_DATA, f"stream frame data read back as {frame.get('data')!r}")
        except ValueError:
            w.note(False, f"a stream frame that is not JSON: {frames[0][:80]!r}")


def walk_logs(w: Walk, hooks: Webhooks, decision_log: Path, kernel_log: Path) -> dict[str, int]:
    # The file sink writes on an interval: read until two reads 0.3 s apart agree and end whole.
    deadline = time.monotonic() + 20
    raw, previous = b"", None
    while time.monotonic() < deadline:
        raw = decision_log.read_bytes() if decision_log.exists() else b""
        if raw == previous and raw.endswith(b"\n") and raw.count(b"\n") >= len(w.executions):
            break
        previous = raw
        time.sleep(0.3)
    # Split on newlines only: str.splitlines also breaks at U+2028, which JSON keeps raw in strings.
    lines = [line.decode("utf-8", errors="replace") for line in raw.split(b"\n") if line]
    bad = 0
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            bad += 1
    w.note(len(lines) >= len(w.executions), f"decision log: {len(lines)} entries for {len(w.executions)} executions")
    w.note(bad == 0, f"decision log: {bad} entries that are not JSON")
    undecodable = 0
    for raw in hooks.bodies:
        try:
            json.loads(raw)
        except ValueError:
            undecodable += 1
    w.note(undecodable == 0, f"{undecodable} webhook bodies that are not JSON")
    text = kernel_log.read_text(errors="replace")
    w.note("Traceback" not in text, f"the kernel logged a traceback: {text[text.find('Traceback') - 200:][:600]!r}")
    return {"decision_log_entries": len(lines), "webhooks": len(hooks.bodies)}


def run(tmp: Path, *, db_url: str, label: str) -> Outcome:
    out = Outcome("R10", f"hostile values at rest ({label})",
                  tried=f"{len(HOSTILE)} hostile values stored as input, args, result, error, output, approval "
                        "args and metadata, then every read surface walked")
    started = time.monotonic()
    hooks = Webhooks()
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    manifest = write_manifest(tmp / "regent.yaml", {AGENT: hooks.port}, policy={AGENT: str(policy)})
    decision_log = tmp / "decisions.jsonl"
    k = Kernel(db_url, tmp / "kernel.log", manifest=manifest, REGENT_DECISION_LOG_FILE=str(decision_log),
               REGENT_DECISION_LOG_FLUSH_INTERVAL="100ms", REGENT_DISPATCH_POLL_INTERVAL="50ms",
               REGENT_DISPATCH_LEASE_TIMEOUT="1h")
    w = Walk(k.url)
    try:
        k.start()
        store(w, hooks)
        walk_api(w)
        walk_console(w)
        walk_stream(w, hooks)
        figures = walk_logs(w, hooks, decision_log, k.log)
        health = httpx.get(k.url + "/v0/health", timeout=5).status_code
        out.check(f"every value stored ({len(HOSTILE)})", len(w.executions) == len(HOSTILE),
                  f"{len(w.executions)} stored")
        out.check("every read surface answered (< 500, whole, values read back exactly)", not w.problems,
                  f"{len(w.problems)}: {w.problems[:2]}" if w.problems else f"{w.reads} reads",
                  items=w.problems or None)
        out.check("kernel alive after", health == 200 and k.alive())
        out.figures = {"reads": w.reads, **figures}
    finally:
        w.http.close()
        k.stop()
        hooks.close()
        out.seconds = time.monotonic() - started
    return out


def problems(tmp: Path, db_url: str) -> list[str]:
    """For the test suite: every problem the walk found (empty when every surface held)."""
    o = run(tmp, db_url=db_url, label="test")
    return [f"{c.name}: {c.detail}" for c in o.checks if not c.ok] + [i for c in o.checks for i in (c.items or [])]
