"""`regent policy test | check | eval`: renders what the policy library returns; picks exit codes
(0 all passed, 2 some failed, 1 a bundle or case file could not be loaded or a usage error)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from rich.console import Console
from rich.table import Table

from kernel.domain import PolicyInput
from kernel.errors import ValidationError
from kernel.policy.cases import Report, parse_cases, run_cases
from kernel.policy.resolver import yaml_revision
from kernel.policy.yaml import compile_yaml_bundle

out = Console()
err = Console(stderr=True)


def _load_yaml(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    try:
        return compile_yaml_bundle(text, revision=yaml_revision(text))
    except ValidationError as exc:
        raise ValidationError(f"{path}: {exc.message}") from None


def _bundles(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(x for x in p.rglob("*.yaml") if not x.name.endswith(".policytest.yaml")
                            and x.name != "regent.yaml")
        elif p.exists():
            found.append(p)
        else:
            raise ValidationError(f"{p}: no such file or directory")
    return found


def _cases_for(bundle: Path, explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    beside = bundle.with_suffix(".policytest.yaml") if bundle.suffix else bundle.parent / "bundle.policytest.yaml"
    if beside.exists():
        return beside
    for root in [bundle.parent, *bundle.parents]:
        candidate = root / "policy_tests" / f"{bundle.stem}.policytest.yaml"
        if candidate.exists():
            return candidate
    return None


def cmd_test(args: argparse.Namespace) -> int:
    if args.execution or args.last:
        from kernel.cli_policy_replay import run_replay

        return run_replay(args)
    try:
        suites: list[tuple[Path, Report]] = []
        for bundle_path in _bundles(args.paths):
            bundle = _load_yaml(bundle_path)
            cases_path = _cases_for(bundle_path, args.cases)
            if cases_path is None:
                if len(args.paths) == 1 and Path(args.paths[0]).is_file():
                    raise ValidationError(f"no cases: expected {bundle_path.with_suffix('.policytest.yaml')}, or pass --cases")
                continue
            cases = parse_cases(cases_path.read_text(encoding="utf-8"), source=str(cases_path),
                                default_agent=args.agent_id or "")
            if args.run:
                rx = re.compile(args.run)
                cases = [c for c in cases if rx.search(c.name or c.target)]
            suites.append((bundle_path, run_cases(bundle, cases, bundle.rule_ids)))
    except (ValidationError, OSError, re.error) as exc:
        err.print(f"[red]{getattr(exc, 'message', exc)}[/]")
        return 1
    total = sum(len(r.results) for _, r in suites)
    failed = sum(r.failed for _, r in suites)
    if args.format == "json":
        print(json.dumps({"suites": [_json(p, r) for p, r in suites], "failed": failed, "total": total}, indent=2))
    elif args.format == "junit":
        print(_junit(suites))
    else:
        _pretty(suites)
    if total == 0 and args.fail_on_empty:
        err.print("[red]no cases ran (--fail-on-empty)[/]")
        return 1
    return 2 if failed else 0


def _json(path: Path, r: Report) -> dict[str, Any]:
    results = []
    for x in r.results:
        row: dict[str, Any] = {"name": x.case.name, "target": x.case.target, "kind": x.case.kind,
                               "decision": x.decision, "rule_id": x.rule_id, "pass": x.passed}
        for key in ("agent_id", "expect", "expect_rule"):
            if getattr(x.case, key):
                row[key] = getattr(x.case, key)
        if x.case.args is not None:
            row["args"] = x.case.args
        if x.reason:
            row["reason"] = x.reason
        if x.failure:
            row["failure"] = x.failure
        results.append(row)
    body: dict[str, Any] = {"bundle": str(path), "results": results, "failed": r.failed}
    if r.unexercised_rules:
        body["unexercised_rules"] = r.unexercised_rules
    return body


def _junit(suites: list[tuple[Path, Report]]) -> str:
    root = ET.Element("testsuites")
    for path, r in suites:
        s = ET.SubElement(root, "testsuite", name=str(path), tests=str(len(r.results)), failures=str(r.failed))
        for x in r.results:
            tc = ET.SubElement(s, "testcase", classname=path.stem, name=x.case.name or x.case.target)
            if not x.passed:
                f = ET.SubElement(tc, "failure", message=x.failure)
                f.text = f"decision {x.decision} by rule {x.rule_id}"
    return ET.tostring(root, encoding="unicode")


def _label(x: Any) -> str:
    if x.case.name:
        return str(x.case.name)
    label = x.case.target
    if x.case.args:
        label += " " + json.dumps(x.case.args, separators=(",", ":"), sort_keys=True)
    return label if len(label) <= 56 else label[:55] + "…"


def _pretty(suites: list[tuple[Path, Report]]) -> None:
    for path, r in suites:
        t = Table(title=str(path), show_header=False, box=None, padding=(0, 2))
        ordered = sorted(r.results, key=lambda x: x.passed)  # failures first
        for x in ordered:
            status = "[green]PASS[/]" if x.passed else "[red]FAIL[/]"
            t.add_row(status, _label(x), x.decision if x.passed else x.failure, x.rule_id)
        out.print(t)
        if r.unexercised_rules:
            out.print(f"  rules never exercised: {', '.join(r.unexercised_rules)}")
        n = len(r.results)
        out.print(f"  {r.failed} of {n} cases failed" if r.failed else f"  {n} cases passed")
        out.print()


def cmd_check(args: argparse.Namespace) -> int:
    bad = 0
    try:
        paths = _bundles(args.paths)
    except ValidationError as exc:
        err.print(f"[red]{exc.message}[/]")
        return 1
    for p in paths:
        try:
            _load_yaml(p)
            out.print(f"[green]ok[/]  {p}")
        except ValidationError as exc:
            bad += 1
            err.print(f"[red]{exc.message}[/]")
    return 1 if bad else 0


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        bundle = _load_yaml(Path(args.bundle))
        parsed = json.loads(args.args) if args.args else None
    except ValidationError as exc:
        err.print(f"[red]{exc.message}[/]")
        return 1
    except json.JSONDecodeError as exc:
        err.print(f"[red]--args is not JSON: {exc}[/]")
        return 1
    inp = PolicyInput(agent_id=args.agent_id or "", kind=args.kind, target=args.target, args=parsed)
    d = bundle.evaluate(inp)
    out.print(f"  {d.verdict.value}  {d.rule_id}" + (f"  {d.reason}" if d.reason else ""))
    if args.explain:
        for tr in bundle.explain(inp):
            mark = "→" if tr.selected else ("✓" if tr.matched else "✗")
            why = "" if tr.matched else f"  ({tr.failed} did not match)"
            out.print(f"    {mark} {tr.rule_id} (line {tr.line}){why}")
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("policy", help="test, check and evaluate policy bundles")
    ps = p.add_subparsers(dest="policy_command", required=True)
    t = ps.add_parser("test", help="run case files against bundles (a bundle file or a tree such as bundles/)")
    t.add_argument("paths", nargs="+")
    t.add_argument("--cases", help="case file (default: <bundle>.policytest.yaml or policy_tests/<bundle>.policytest.yaml)")
    t.add_argument("--agent-id", dest="agent_id")
    t.add_argument("--format", choices=["pretty", "json", "junit"], default="pretty")
    t.add_argument("-r", "--run", help="only cases whose name (or target) matches this regex")
    t.add_argument("--fail-on-empty", action="store_true")
    from kernel.cli_policy_replay import add_replay_arguments

    add_replay_arguments(t)
    t.set_defaults(fn=cmd_test)
    c = ps.add_parser("check", help="the load gate only")
    c.add_argument("paths", nargs="+")
    c.set_defaults(fn=cmd_check)
    e = ps.add_parser("eval", help="evaluate one input and print the decision")
    e.add_argument("bundle")
    e.add_argument("--target", required=True)
    e.add_argument("--args", default=None, help="JSON arguments")
    e.add_argument("--kind", default="tool_call", choices=["tool_call", "llm_call", "local"])
    e.add_argument("--agent-id", dest="agent_id")
    e.add_argument("--explain", action="store_true")
    e.set_defaults(fn=cmd_eval)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
