"""`regent policy shadow set|show|report|clear|promote|rollback --agent-id A`: an agent's shadow
bundle on a running kernel (docs/policy-rollout.md). `report` exits 2 when the shadow disagreed or
faulted on any step (a gate for a promotion script), 0 when it agreed on all; 1 on any error."""

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

from kernel.cli.policy_backtest import _candidate, _fail
from kernel.errors import ValidationError

# A terminal gets rich's width; a pipe or a file gets whole lines (execution and step ids intact).
out = Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)
err = Console(stderr=True)
TIMEOUT_SECONDS = 30.0


def _client(args: argparse.Namespace) -> httpx.Client:
    token = args.token or os.environ.get("REGENT_BEARER_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=args.kernel.rstrip("/"), headers=headers, timeout=TIMEOUT_SECONDS)


def _call(args: argparse.Namespace, method: str, tail: str, **kw: Any) -> Any:
    with _client(args) as c:
        r = c.request(method, f"/v0/policies/{args.agent_id}{tail}", **kw)
    if r.status_code >= 400:
        raise _fail(r)
    return r.json() if r.content else None


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.action(args))
    except ValidationError as exc:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False)
        return 1
    except httpx.HTTPError as exc:
        err.print(f"[red]error:[/red] cannot reach the kernel at {args.kernel}: {exc}", highlight=False)
        return 1


def _set(args: argparse.Namespace) -> int:
    s = _call(args, "PUT", "/shadow", json=_candidate(Path(args.bundle)))
    out.print(f"shadow {s['id']} for {args.agent_id}: {s['kind']} revision {s['revision']} ({s['status']})",
              highlight=False)
    return 0


def _show(args: argparse.Namespace) -> int:
    print(json.dumps(_call(args, "GET", "/shadow"), indent=2))
    return 0


def _clear(args: argparse.Namespace) -> int:
    _call(args, "DELETE", "/shadow")
    out.print(f"shadow of {args.agent_id} cleared")
    return 0


def _promote(args: argparse.Namespace) -> int:
    r = _call(args, "POST", "/shadow/promote")
    out.print(f"promoted: {args.agent_id} now runs revision seq {r['seq']} ({r['revision']})", highlight=False)
    return 0


def _rollback(args: argparse.Namespace) -> int:
    r = _call(args, "POST", "/rollback")
    out.print(f"rolled back: {args.agent_id} now runs revision seq {r['seq']} ({r['revision']})", highlight=False)
    return 0


def _report(args: argparse.Namespace) -> int:
    params = {"samples": str(args.samples)}
    if args.shadow_id is not None:
        params["shadow_id"] = str(args.shadow_id)
    rep = _call(args, "GET", "/shadow/report", params=params)
    if args.format == "json":
        print(json.dumps(rep, indent=2, ensure_ascii=False))
    else:
        render(rep)
    t = rep["totals"]
    return 2 if t["disagreed"] or t["errors"] else 0


def render(rep: dict[str, Any]) -> None:
    s, t = rep["shadow"], rep["totals"]
    out.print(f"[bold]shadow {s['id']}[/bold] of {rep['agent_id']}: {s['kind']} revision {s['revision']}, "
              f"{s['status']} since {s['created_at']}", highlight=False)
    out.print(f"  evaluated {t['evaluated']}: [green]agreed {t['agreed']}[/green], "
              f"[red]disagreed {t['disagreed']}[/red], [yellow]errors {t['errors']}[/yellow]"
              + (f", dropped {t['dropped']}" if t["dropped"] else "")
              + (f", skipped while paused {t['skipped']}" if t.get("skipped") else "")
              + (f" ({rep['pending']} pending)" if rep.get("pending") else ""), highlight=False)
    for title, items in (("disagreements", rep["disagreements"]), ("shadow errors", rep["errors"])):
        if items:
            out.print(f"  {title}: " + ", ".join(f"{k} {n}" for k, n in items.items()), highlight=False)
    if s.get("last_error"):
        out.print(f"  last error: {s['last_error']}", highlight=False)
    for title, key, field in (("targets", "top_targets", "target"), ("active rules", "top_active_rules", "rule_id"),
                              ("shadow rules", "top_shadow_rules", "rule_id")):
        if rep[key]:
            out.print(f"  top disagreeing {title}: " + ", ".join(f"{x[field]} {x['count']}" for x in rep[key]),
                      highlight=False)
    if rep["samples"]:
        table = Table(title="latest disagreements", title_justify="left")
        for col in ("step", "target", "active", "shadow", "reason"):
            table.add_column(col)
        for x in rep["samples"]:
            a, sh = x["active"], x["shadow"]
            table.add_row(x["links"]["step"], x["target"], f"{a['decision']} {a['rule_id']}",
                          f"{sh['decision']} {sh['rule_id']}", sh.get("reason", ""))
        out.print(table)


def add_shadow_commands(ps: Any) -> None:
    p = ps.add_parser("shadow", help="an agent's shadow bundle on a running kernel: set, report, promote, roll back")
    sub = p.add_subparsers(dest="shadow_command", required=True)

    def command(name: str, help: str, action: Any) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help)
        c.add_argument("--agent-id", dest="agent_id", required=True)
        c.add_argument("--kernel", default="http://127.0.0.1:8080", help="the kernel's base URL")
        c.add_argument("--token", default=None, help="bearer token (default: $REGENT_BEARER_TOKEN)")
        c.set_defaults(fn=_run, action=action)
        return c

    command("set", "store BUNDLE (YAML file, Rego directory or .tar.gz) as the agent's shadow", _set).add_argument("bundle")
    command("show", "print the shadow bundle", _show)
    r = command("report", "totals, disagreement pairs, top targets and rules, latest samples", _report)
    r.add_argument("--format", choices=["pretty", "json"], default="pretty")
    r.add_argument("--samples", type=int, default=10)
    r.add_argument("--shadow-id", dest="shadow_id", type=int, default=None, help="an earlier shadow's report")
    command("clear", "stop shadowing (the report stays readable)", _clear)
    command("promote", "make the shadow the active revision", _promote)
    command("rollback", "re-activate the revision active before the current one", _rollback)
