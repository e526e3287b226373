"""R11 hostile console forms: every state-changing console form posted, as a signed-in operator's
browser would (session cookie, CSRF token, same Origin), with what a form field can carry: NUL,
undecodable bytes, 5 000-digit integers, JSON nested 10 000 deep, 20 000-character text, numbers
past int64, ids that are not ids, a form past the size limit. Each must be answered with a page
(a form error, 4xx) or a redirect, never a 500 or a cut connection, and the kernel must log no
traceback. The playground's args were a 500 (json.loads' RecursionError and int-digit ValueError)."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from reliability.atrest import AGENT, POLICY, Webhooks
from reliability.procs import TOKEN, Kernel, write_manifest
from reliability.report import Outcome

HUGE_INT = "9" * 5000
DEEP = "[" * 10_000 + "]" * 10_000
RANDOM_ID = str(uuid.uuid4())


def cases(execution_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, fields) — each posted with the session's CSRF token added."""
    step = {"agent_id": AGENT, "kind": "tool_call", "target": "tool"}
    rego = {**step, "args": "{}", "candidate_kind": "rego", "candidate": "package regent\ndefault allow := true\n"}
    return [
        ("playground: a 5 000-digit integer in args", "/console/playground", {**step, "args": f'{{"n": {HUGE_INT}}}'}),
        ("playground: args nested 10 000 deep", "/console/playground", {**step, "args": f'{{"a": {DEEP}}}'}),
        ("playground: args nested 600 deep", "/console/playground", {**step, "args": "[" * 600 + "]" * 600}),
        ("playground: a lone surrogate and NUL in args", "/console/playground",
         {**step, "args": '{"\\ud800": "a\\u0000b"}'}),
        ("playground: args that are not JSON", "/console/playground", {**step, "args": "{'x':"}),
        ("playground: NUL in the agent id and target", "/console/playground",
         {**step, "agent_id": "a\x00b", "target": "t\x00", "args": "{}"}),
        ("playground: an unknown step kind", "/console/playground", {**step, "kind": "\x00nope", "args": "{}"}),
        ("playground: a YAML candidate that is not YAML", "/console/playground",
         {**step, "args": "{}", "candidate": "rules: [\x00{{{" + "a" * 20_000}),
        ("playground: a Rego candidate with data nested 10 000 deep", "/console/playground",
         {**rego, "candidate_data": f'{{"a": {DEEP}}}'}),
        ("playground: a Rego candidate with a 5 000-digit manifest number", "/console/playground",
         {**rego, "candidate_manifest": f'{{"n": {HUGE_INT}}}'}),
        ("playground: a candidate kind that does not exist", "/console/playground",
         {**step, "args": "{}", "candidate_kind": "\x00"}),
        ("replay: n past int64", "/console/playground/replay", {"agent_id": AGENT, "n": str(2**70)}),
        ("replay: n a Unicode digit", "/console/playground/replay", {"agent_id": AGENT, "n": "\u00b2"}),
        ("replay: n negative", "/console/playground/replay", {"agent_id": AGENT, "n": "-1"}),
        ("policies: upload for agent a%00b", "/console/policies/a%00b", {"kind": "yaml", "source": "default_action: allow\n"}),
        ("policies: upload for an agent id of undecodable bytes", "/console/policies/%ED%A0%80",
         {"kind": "yaml", "source": "default_action: allow\n"}),
        ("policies: a bundle holding NUL", f"/console/policies/{AGENT}", {"kind": "yaml", "source": "a: \x00\n"}),
        ("policies: a bundle of 20 000 nested lists", f"/console/policies/{AGENT}", {"kind": "yaml", "source": DEEP}),
        ("policies: kind rego as pasted text", f"/console/policies/{AGENT}", {"kind": "rego", "source": "package x"}),
        ("policies: activate seq 2^70", f"/console/policies/{AGENT}/revisions/{2**70}/activate", {}),
        ("policies: activate seq -1", f"/console/policies/{AGENT}/revisions/-1/activate", {}),
        ("approvals: grant an approval that does not exist", f"/console/approvals/{RANDOM_ID}/grant",
         {"rationale": "r"}),
        ("approvals: grant with a 20 000-character rationale", f"/console/approvals/{RANDOM_ID}/grant",
         {"rationale": "r" * 20_000, "decided_by": "d" * 500}),
        ("approvals: an id that is not a UUID, and an unknown verb", "/console/approvals/a%00b/nope", {}),
        ("executions: cancel an id that is not a UUID", "/console/executions/a%00b/cancel", {}),
        ("executions: cancel a finished execution", f"/console/executions/{execution_id}/cancel", {}),
    ]


def run(tmp: Path, *, db_url: str, label: str) -> Outcome:
    out = Outcome("R11", f"hostile console forms ({label})",
                  tried="every state-changing console form, signed in with a CSRF token, carrying NUL, "
                        "5 000-digit integers, 10 000-deep JSON, 20 000-character text, ids past int64, a 3 MB form")
    started = time.monotonic()
    hooks = Webhooks()
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    manifest = write_manifest(tmp / "regent.yaml", {AGENT: hooks.port}, policy={AGENT: str(policy)})
    k = Kernel(db_url, tmp / "kernel.log", manifest=manifest, REGENT_DISPATCH_POLL_INTERVAL="50ms")
    problems: list[str] = []
    answered: dict[int, int] = {}
    seen: list[str] = []
    try:
        k.start()
        eid = httpx.post(f"{k.url}/v0/executions", json={"agent_id": AGENT, "input": None},
                         headers=k.bearer(), timeout=30).json()["id"]
        with httpx.Client(base_url=k.url, timeout=60, headers={"Origin": k.url}) as c:
            r = c.post("/console/sign-in", data={"token": TOKEN, "next": "/console/playground"})
            token = re.search(r'name="csrf" value="([^"]+)"', c.get("/console/playground").text)
            if r.status_code != 303 or token is None:
                raise RuntimeError(f"console sign-in → {r.status_code}")
            csrf = token.group(1)
            todo = [(n, p, {"csrf": csrf, **f}) for n, p, f in cases(eid)]
            todo.append(("a form past the size limit", "/console/playground", {"csrf": csrf, "args": "x" * (3 << 20)}))
            for name, path, fields in todo:
                try:
                    t0 = time.monotonic()
                    r = c.post(path, data=fields)
                    took = time.monotonic() - t0
                except httpx.HTTPError as exc:
                    problems.append(f"{name}: {type(exc).__name__} (connection cut)")
                    continue
                answered[r.status_code] = answered.get(r.status_code, 0) + 1
                seen.append(f"{name} → {r.status_code} ({took:.2f} s)")
                page = r.headers.get("content-type", "").startswith("text/html") or r.status_code in (303, 204)
                if r.status_code >= 500 or not page:
                    problems.append(f"{name} → {r.status_code} {r.headers.get('content-type')} {r.text[:120]!r}")
            last = c.get("/console/playground")
            alive = last.status_code == 200
            seen.append(f"afterwards GET /console/playground → {last.status_code} {last.headers.get('location')}")
        log = k.log.read_text(errors="replace")
        out.check(f"every form answered with a page or a redirect ({len(todo)})", not problems,
                  f"{len(problems)}: {problems[:2]}" if problems else "", items=problems)
        out.check("no traceback in the kernel's log", "Traceback" not in log,
                  log[log.find("Traceback") - 200:][:400] if "Traceback" in log else "")
        out.check("the console still answers after", alive and k.alive())
        out.figures = {"forms": len(todo), "statuses": " ".join(f"{s}×{n}" for s, n in sorted(answered.items()))}
        out.details = {"answers": seen}
    finally:
        k.stop()
        hooks.close()
        out.seconds = time.monotonic() - started
    return out


def problems(tmp: Path, db_url: str) -> list[str]:
    """For the test suite: every problem the scenario found (empty when every form held)."""
    o = run(tmp, db_url=db_url, label="test")
    return [f"{c.name}: {c.detail}" for c in o.checks if not c.ok] + [i for c in o.checks for i in (c.items or [])]
