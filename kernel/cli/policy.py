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

from kernel.cli.sign import add_sign_command, add_verify_arguments, verify_signature
from kernel.domain import JudgeAnswer, PolicyInput, resolve_judge
from kernel.errors import ValidationError
from kernel.policy.cases import Report, parse_cases, run_cases
from kernel.policy.testing import (
    LoadedBundle,
    RegoTestResult,
    discover,
    load_bundle,
    run_rego_test_file,
)
from kernel.policy.testing.runner import bundle_name, case_file_for, rego_test_files

out = Console()
err = Console(stderr=True)


def _engine() -> Any:
    from kernel.policy.resolver import LazyRegoEngine

    return LazyRegoEngine(size=1, timeout=5.0)


def cmd_test(args: argparse.Namespace) -> int:
    if args.execution or args.last is not None:
        from kernel.cli.policy_replay import run_replay

        return run_replay(args)
    engine = _engine()
    try:
        return _test(args, engine)
    finally:
        engine.close()


def _test(args: argparse.Namespace, engine: Any) -> int:
    rx = None
    try:
        rx = re.compile(args.run) if args.run else None
        suites: list[tuple[Path, Report]] = []
        loaded: list[LoadedBundle] = []
        rego: list[RegoTestResult] = []
        for bundle_path in discover(args.paths):
            bundle = load_bundle(bundle_path, engine)
            loaded.append(bundle)
            cases_path = Path(args.cases) if args.cases else case_file_for(bundle_path)
            tests = rego_test_files(bundle_path) if bundle.kind == "rego" else []
            if cases_path is None and not tests:
                if len(args.paths) == 1 and Path(args.paths[0]) == bundle_path:
                    raise ValidationError(f"no cases: expected {bundle_path.parent / (bundle_name(bundle_path) + '.policytest.yaml')}, or pass --cases")
                continue
            for tf in tests:
                rego += run_rego_test_file(tf, bundle.modules, bundle.data, run=rx)
            if cases_path is None:
                continue
            cases = parse_cases(cases_path.read_text(encoding="utf-8"), source=str(cases_path),
                                default_agent=args.agent_id or "")
            if rx is not None:
                cases = [c for c in cases if rx.search(c.name or c.target)]
            suites.append((bundle_path, _run_with_progress(args, bundle, cases)))
    except (ValidationError, OSError, re.error) as exc:
        err.print(f"[red]{getattr(exc, 'message', exc)}[/]")
        return 1
    total = sum(len(r.results) for _, r in suites) + len(rego)
    failed = sum(r.failed for _, r in suites) + sum(1 for x in rego if not x.passed)
    coverage = _coverage(suites)
    if args.format == "json":
        print(json.dumps({"suites": [_json(p, r) for p, r in suites], "rego_tests": [_rego_json(x) for x in rego],
                          "shadowed": _shadowed(loaded), "coverage": coverage,
                          "failed": failed, "total": total}, indent=2))
    elif args.format == "junit":
        print(_junit(suites, rego))
    else:
        _pretty(suites)
        _pretty_rego(rego)
        for b in loaded:
            for rule, by in b.shadowed:
                out.print(f"  [yellow]{b.path}: rule {rule} never matches: shadowed by rule {by}[/]")
        out.print(f"  rule coverage {coverage['percent']:.1f}% ({coverage['covered']} of {coverage['rules']} rules)")
    if total == 0 and args.fail_on_empty:
        err.print("[red]no cases ran (--fail-on-empty)[/]")
        return 1
    if failed:
        return 2
    if args.threshold is not None and coverage["percent"] < args.threshold:
        err.print(f"[red]rule coverage {coverage['percent']:.1f}% is below --threshold {args.threshold:g}[/]")
        return 2
    return 0


def _run_with_progress(args: argparse.Namespace, bundle: LoadedBundle, cases: list[Any]) -> Report:
    """A progress bar on long runs, pretty format on a terminal only (JSON/JUnit stay clean)."""
    if args.format != "pretty" or len(cases) < 200 or not err.is_terminal:
        return run_cases(bundle.compiled, cases, bundle.rule_ids)
    from rich.progress import Progress

    with Progress(console=err, transient=True) as bar:
        task = bar.add_task(str(bundle.path), total=len(cases))
        return run_cases(bundle.compiled, cases, bundle.rule_ids, on_case=lambda: bar.advance(task))


def _coverage(suites: list[tuple[Path, Report]]) -> dict[str, Any]:
    rules = covered = 0
    for _, r in suites:
        ran = {x.rule_id for x in r.results}
        n = len(r.unexercised_rules) + len(ran - {"default", "bundle-error", "eval-error"})
        rules += n
        covered += n - len(r.unexercised_rules)
    return {"rules": rules, "covered": covered, "percent": 100.0 * covered / rules if rules else 100.0}


def _shadowed(loaded: list[LoadedBundle]) -> list[dict[str, str]]:
    return [{"bundle": str(b.path), "rule_id": r, "shadowed_by": by} for b in loaded for r, by in b.shadowed]


def _rego_json(x: RegoTestResult) -> dict[str, Any]:
    row = {"file": x.file, "name": x.name, "status": x.status}
    if x.message:
        row["message"] = x.message
    return row


def _pretty_rego(rego: list[RegoTestResult]) -> None:
    if not rego:
        return
    t = Table(title="Rego unit tests", show_header=False, box=None, padding=(0, 2))
    colour = {"pass": "green", "fail": "red", "error": "red", "skip": "yellow"}
    for x in sorted(rego, key=lambda x: x.passed):
        t.add_row(f"[{colour[x.status]}]{x.status.upper()}[/]", x.name, x.message, x.file)
    out.print(t)
    bad = sum(1 for x in rego if not x.passed)
    out.print(f"  {bad} of {len(rego)} Rego tests failed" if bad else f"  {len(rego)} Rego tests passed")
    out.print()


def _json(path: Path, r: Report) -> dict[str, Any]:
    results = []
    for x in r.results:
        row: dict[str, Any] = {"name": x.case.name, "target": x.case.target, "kind": x.case.kind,
                               "decision": x.decision, "rule_id": x.rule_id, "pass": x.passed}
        for key in ("agent_id", "expect", "expect_rule", "expect_reason"):
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


def _junit(suites: list[tuple[Path, Report]], rego: list[RegoTestResult] = ()) -> str:  # type: ignore[assignment]
    root = ET.Element("testsuites")
    for path, r in suites:
        s = ET.SubElement(root, "testsuite", name=str(path), tests=str(len(r.results)), failures=str(r.failed),
                          errors="0", skipped="0")
        for x in r.results:
            tc = ET.SubElement(s, "testcase", classname=path.stem, name=x.case.name or x.case.target)
            if not x.passed:
                f = ET.SubElement(tc, "failure", message=x.failure)
                f.text = f"decision {x.decision} by rule {x.rule_id}"
    by_file: dict[str, list[RegoTestResult]] = {}
    for t in rego:
        by_file.setdefault(t.file, []).append(t)
    for file, ts in by_file.items():
        s = ET.SubElement(root, "testsuite", name=file, tests=str(len(ts)),
                          failures=str(sum(t.status == "fail" for t in ts)),
                          errors=str(sum(t.status == "error" for t in ts)),
                          skipped=str(sum(t.status == "skip" for t in ts)))
        for t in ts:
            tc = ET.SubElement(s, "testcase", classname=Path(file).stem, name=t.name)
            if t.status in ("fail", "error"):
                ET.SubElement(tc, "failure" if t.status == "fail" else "error", message=t.message)
            elif t.status == "skip":
                ET.SubElement(tc, "skipped", message="todo test")
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
        paths = discover(args.paths)
    except ValidationError as exc:
        err.print(f"[red]{exc.message}[/]")
        return 1
    engine = _engine()
    try:
        for p in paths:
            refused = verify_signature(args, p)  # --verify-key: the signature before the load gate
            if refused is not None:
                bad += 1
                err.print(f"[red]{refused}[/]")
                continue
            try:
                b = load_bundle(p, engine)
                out.print(f"[green]ok[/]  {p}")
                for rule, by in b.shadowed:
                    out.print(f"  [yellow]rule {rule} never matches: shadowed by rule {by}[/]")
            except ValidationError as exc:
                bad += 1
                err.print(f"[red]{exc.message}[/]")
    finally:
        engine.close()
    return 1 if bad else 0


def cmd_eval(args: argparse.Namespace) -> int:
    engine = _engine()
    try:
        return _eval(args, engine)
    finally:
        engine.close()


def _eval(args: argparse.Namespace, engine: Any) -> int:
    try:
        bundle = load_bundle(Path(args.bundle), engine)
        parsed = json.loads(args.args) if args.args else None
    except ValidationError as exc:
        err.print(f"[red]{exc.message}[/]")
        return 1
    except json.JSONDecodeError as exc:
        err.print(f"[red]--args is not JSON: {exc}[/]")
        return 1
    if parsed is not None and not isinstance(parsed, dict):
        err.print("[red]--args must be a JSON object[/]")
        return 1
    try:
        judge = _judge_mock(args.judge)
    except ValueError as exc:
        err.print(f"[red]--judge: {exc}[/]")
        return 1
    inp = PolicyInput(agent_id=args.agent_id or "", kind=args.kind, target=args.target, args=parsed)
    if args.explain:
        from kernel.core.playground import explain

        d, lines = explain(bundle.compiled, inp)
    else:
        d, lines = bundle.compiled.evaluate(inp), []
    if d.judge is not None:  # a judge rule asks the --judge stand-in, or denies as unconfigured
        d = resolve_judge(d, JudgeAnswer.mocked(judge))
    out.print(f"  {d.verdict.value}  {d.rule_id}" + (f"  {d.reason}" if d.reason else ""))
    for line in lines:
        out.print(f"    {line}", markup=False, highlight=False)
    return 0


def _judge_mock(text: str | None) -> dict[str, float] | None:
    """`--judge '{"allow": 0.2, "deny": 0.7}'`: the probabilities a judge rule gets."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    outcomes = ("allow", "deny", "require_approval")
    if not isinstance(value, dict) or not value or any(
        k not in outcomes or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1
        for k, v in value.items()
    ):
        raise ValueError("an object mapping allow, deny and require_approval to probabilities in [0, 1]")
    return {k: float(v) for k, v in value.items()}


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
    t.add_argument("--threshold", type=float, default=None, help="fail (exit 2) when rule coverage is below N percent")
    from kernel.cli.policy_replay import add_replay_arguments

    add_replay_arguments(t)
    t.set_defaults(fn=cmd_test)
    c = ps.add_parser("check", help="the load gate only")
    c.add_argument("paths", nargs="+")
    add_verify_arguments(c)
    c.set_defaults(fn=cmd_check)
    add_sign_command(ps)
    e = ps.add_parser("eval", help="evaluate one input and print the decision")
    e.add_argument("bundle")
    e.add_argument("--target", required=True)
    e.add_argument("--args", default=None, help="JSON arguments")
    e.add_argument("--kind", default="tool_call", choices=["tool_call", "llm_call", "local"])
    e.add_argument("--agent-id", dest="agent_id")
    e.add_argument("--explain", action="store_true")
    e.add_argument("--judge", default=None, metavar="JSON",
                   help='probabilities a judge rule gets, e.g. \'{"allow": 0.2, "deny": 0.7}\' (default: no judge, deny)')
    e.set_defaults(fn=cmd_eval)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
