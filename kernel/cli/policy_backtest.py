"""`regent policy test BUNDLE --execution ID | --last N --agent-id A`: replay recorded executions of a
running kernel against a local candidate bundle (POST /v0/policies/{agent_id}/test) and list the
decisions that would change. Exit 0 no change, 2 some change, 1 load, usage or connection error."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from kernel.errors import ValidationError

# A terminal gets rich's width; a pipe or a file gets whole lines (execution and step ids intact).
out = Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)
err = Console(stderr=True)

MAX_LAST = 100  # executions replayed by one --last
TIMEOUT_SECONDS = 60.0


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("replay (against a running kernel)")
    g.add_argument("--execution", help="replay this recorded execution (needs --agent-id)")
    g.add_argument("--last", type=int, help=f"replay the agent's last N executions, newest first (≤ {MAX_LAST})")
    g.add_argument("--kernel", default="http://127.0.0.1:8080", help="the kernel's base URL")
    g.add_argument("--token", default=None, help="bearer token (default: $REGENT_BEARER_TOKEN)")


def _candidate(path: Path) -> dict[str, Any]:
    """The test endpoint's bundle fields for a YAML file or a Rego directory/tarball."""
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        return {"bundle": path.read_text(encoding="utf-8"), "kind": "yaml"}
    if path.exists():
        from kernel.policy.rego import load_rego_bundle

        try:
            b = load_rego_bundle(path)
        except ValidationError as exc:
            raise ValidationError(f"{path}: {exc.message}") from None
        return {"bundle": {"modules": dict(b.modules), "data": b.data, "manifest": b.manifest}, "kind": "rego"}
    raise ValidationError(f"{path}: no such bundle")


def _check(args: argparse.Namespace) -> None:
    if not args.agent_id:
        raise ValidationError("--execution/--last needs --agent-id")
    if args.execution and args.last is not None:
        raise ValidationError("--execution and --last are exclusive")
    if getattr(args, "cases", None):
        raise ValidationError("--execution/--last cannot be combined with --cases")
    if len(args.paths) != 1:
        raise ValidationError("replay takes exactly one bundle PATH")
    if args.last is not None and not 1 <= args.last <= MAX_LAST:
        raise ValidationError(f"--last must be between 1 and {MAX_LAST}")


def _fail(r: httpx.Response) -> ValidationError:
    try:
        body = r.json()
        msg = f"{body.get('code')}: {body.get('message')}"
    except ValueError:
        msg = r.text[:200]
    return ValidationError(f"kernel answered {r.status_code}: {msg}")


def _execution_ids(c: httpx.Client, args: argparse.Namespace) -> list[str]:
    if args.execution:
        return [args.execution]
    r = c.get("/v0/executions", params={"agent_id": args.agent_id, "limit": args.last})
    if r.status_code != 200:
        raise _fail(r)
    return [e["id"] for e in r.json().get("executions", [])][: args.last]


def run_replay(args: argparse.Namespace) -> int:
    try:
        _check(args)
        candidate = _candidate(Path(args.paths[0]))
        token = args.token or os.environ.get("REGENT_BEARER_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        reports: list[dict[str, Any]] = []
        with httpx.Client(base_url=args.kernel.rstrip("/"), headers=headers, timeout=TIMEOUT_SECONDS) as c:
            for eid in _execution_ids(c, args):
                r = c.post(f"/v0/policies/{args.agent_id}/test", json={**candidate, "execution_id": eid})
                if r.status_code != 200:
                    raise _fail(r)
                reports.append({"execution_id": eid, **r.json()})
    except ValidationError as exc:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False)
        return 1
    except httpx.HTTPError as exc:
        err.print(f"[red]error:[/red] cannot reach the kernel at {args.kernel}: {exc}", highlight=False)
        return 1
    changed = sum(rep["failed"] for rep in reports)
    if args.format == "json":
        print(json.dumps({"executions": reports, "changed": changed}, indent=2))
    else:
        _render(reports, changed)
    return 2 if changed else 0


def _render(reports: list[dict[str, Any]], changed: int) -> None:
    steps = sum(len(rep["results"]) for rep in reports)
    if changed:
        t = Table(title="decisions that would change", title_justify="left")
        for col in ("execution", "seq", "step", "was", "now", "reason"):
            t.add_column(col)
        for rep in reports:
            for x in rep["results"]:
                if x["pass"]:
                    continue
                label = x["target"] + (" " + json.dumps(x["args"], separators=(",", ":")) if x.get("args") else "")
                if len(label) > 56:
                    label = label[:55] + "…"
                t.add_row(rep["execution_id"], str(x.get("seq", "")), label,
                          f"[green]{x['expect']}[/green] {x['was_rule']}",
                          f"[red]{x['decision']}[/red] {x['rule_id']}", x.get("reason", ""))
        out.print(t)
    truncated = [rep["execution_id"] for rep in reports if rep.get("truncated")]
    if truncated:
        out.print(f"  [yellow]truncated (step cap reached):[/yellow] {', '.join(truncated)}")
    out.print(f"  {changed} of {steps} replayed decisions would change across {len(reports)} execution(s)")
