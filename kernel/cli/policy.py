"""`regent policy test | check | eval` (`fmt`: policy_fmt.py): renders what the policy library returns; picks exit codes
(0 all passed, 2 some failed, 1 a bundle or case file could not be loaded or a usage error).

Engine log lines (rego-cpp's start-up notes, the engine's own warnings about a bundle) stay out of
the output unless `-v`: what a command has to say about a bundle, it says itself."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from kernel.cli.policy_eval import run_eval
from kernel.cli.policy_report import (
    Run,
    Suite,
    render_json,
    render_junit,
    render_pretty,
    stdout_console,
)
from kernel.cli.sign import add_sign_command, add_verify_arguments, verify_signature
from kernel.errors import ValidationError
from kernel.policy.cases import Report, parse_cases, run_cases
from kernel.policy.testing import LoadedBundle, discover, load_bundle, run_rego_test_file
from kernel.policy.testing.runner import bundle_name, case_file_for, rego_test_files

err = Console(stderr=True, soft_wrap=True)  # whole lines: messages carry file:line


def _engine() -> Any:
    from kernel.policy.resolver import LazyRegoEngine

    return LazyRegoEngine(size=1, timeout=5.0)


def _quiet(args: argparse.Namespace) -> None:
    logging.getLogger("kernel.policy").setLevel(logging.DEBUG if getattr(args, "verbose", False) else logging.ERROR)


def cmd_test(args: argparse.Namespace) -> int:
    if args.execution or args.last is not None:
        from kernel.cli.policy_replay import run_replay

        return run_replay(args)
    _quiet(args)
    try:
        threshold = _threshold(args.threshold)
    except ValueError as exc:
        err.print(f"{exc}", style="red", markup=False, highlight=False)
        return 1
    if threshold is not None and threshold[0] == "lines":
        args.coverage = True
    engine = _engine()
    try:
        return _test(args, engine, threshold)
    finally:
        engine.close()


def _threshold(raw: str | None) -> tuple[str, float] | None:
    """`--threshold N` (rule coverage, as before), `rules:N` or `lines:N`."""
    if raw is None:
        return None
    which, _, number = raw.rpartition(":")
    which = which or "rules"
    if which not in ("rules", "lines"):
        raise ValueError(f"--threshold {raw!r}: name rules:N or lines:N")
    try:
        return which, float(number)
    except ValueError:
        raise ValueError(f"--threshold {raw!r}: N must be a number of percent") from None


def _test(args: argparse.Namespace, engine: Any, threshold: tuple[str, float] | None) -> int:
    run = Run()
    try:
        rx = re.compile(args.run) if args.run else None
        for bundle_path in discover(args.paths):
            bundle = load_bundle(bundle_path, engine, strict=args.strict)
            run.loaded.append(bundle)
            cases_path = Path(args.cases) if args.cases else case_file_for(bundle_path)
            tests = rego_test_files(bundle_path) if bundle.kind == "rego" else []
            if cases_path is None and not tests:
                if len(args.paths) == 1 and Path(args.paths[0]) == bundle_path:
                    raise ValidationError(f"no cases: expected {bundle_path.parent / (bundle_name(bundle_path) + '.policytest.yaml')}, or pass --cases")
                continue
            recorder = _recorder(args, bundle)
            for tf in tests:
                results = run_rego_test_file(tf, bundle.modules, bundle.data, run=rx, strict=args.strict)
                run.rego += results
                if recorder is not None:
                    recorder.add_tests(tf, results, strict=args.strict)
            suite = None
            if cases_path is not None:
                cases = parse_cases(cases_path.read_text(encoding="utf-8"), source=str(cases_path),
                                    default_agent=args.agent_id or "")
                if rx is not None:
                    cases = [c for c in cases if rx.search(c.name or c.target)]
                suite = _run_suite(args, bundle, cases, str(cases_path), recorder)
                run.suites.append(suite)
            if recorder is not None:
                report = recorder.report()
                run.line_reports.append((bundle, report))
                if suite is not None:
                    suite.line_coverage = report
    except (ValidationError, OSError, re.error) as exc:
        err.print(f"{getattr(exc, 'message', exc)}", style="red", markup=False, highlight=False)
        return 1
    if args.format == "json":
        print(render_json(run))
    elif args.format == "junit":
        print(render_junit(run))
    else:
        render_pretty(run, stdout_console(), full_labels=not sys.stdout.isatty())
    if run.total == 0 and args.fail_on_empty:
        err.print("[red]no cases ran (--fail-on-empty)[/]")
        return 1
    if run.failed:
        return 2
    if threshold is not None:
        which, limit = threshold
        if which == "rules":
            got = run.rule_coverage()["percent"]
        else:
            lines = run.line_coverage()
            got = lines["coverage"] if lines is not None else 100.0
        if got < limit:
            err.print(f"{'rule' if which == 'rules' else 'line'} coverage {got:.1f}% is below --threshold {limit:g}", style="red", markup=False, highlight=False)
            return 2
    return 0


def _recorder(args: argparse.Namespace, bundle: LoadedBundle) -> Any:
    """A Rego bundle's line coverage recorder (cases and unit tests) under --coverage, else None."""
    if not args.coverage or bundle.kind != "rego":
        return None
    from kernel.policy.testing.coverage import RegoLineCoverage

    return RegoLineCoverage(bundle.compiled)


def _run_suite(args: argparse.Namespace, bundle: LoadedBundle, cases: list[Any], source: str,
               recorder: Any) -> Suite:
    """One bundle's cases, through the line coverage ``recorder`` when there is one, and a progress
    bar on long runs in the pretty format on a terminal only (JSON/JUnit stay clean)."""
    evaluate = recorder.evaluate if recorder is not None else None
    evaluate_many = recorder.evaluate_many if recorder is not None else None

    def run(on_case: Any = None) -> Report:
        return run_cases(bundle.compiled, cases, bundle.rule_ids, on_case, kind=bundle.kind, evaluate=evaluate,
                         evaluate_many=evaluate_many)

    if args.format != "pretty" or len(cases) < 200 or not err.is_terminal:
        report = run()
    else:
        from rich.progress import Progress

        with Progress(console=err, transient=True) as bar:
            task = bar.add_task(str(bundle.path), total=len(cases))
            report = run(lambda: bar.advance(task))
    report.source = source
    return Suite(bundle, report)


def cmd_check(args: argparse.Namespace) -> int:
    _quiet(args)
    try:
        paths = discover(args.paths)
    except ValidationError as exc:
        err.print(f"{exc.message}", style="red", markup=False, highlight=False)
        return 1
    engine = _engine()
    rows: list[dict[str, Any]] = []
    try:
        for p in paths:
            row: dict[str, Any] = {"path": str(p), "ok": True, "problems": [], "warnings": []}
            refused = verify_signature(args, p)  # --verify-key: the signature before the load gate
            if refused is not None:
                row["ok"] = False
                row["problems"] = [str(refused)]
                rows.append(row)
                continue
            try:
                b = load_bundle(p, engine, strict=args.strict)
                row["kind"] = b.kind
                if b.kind == "yaml":
                    row["warnings"] = [{"code": x.code, "file": str(p), "line": x.line, "rule_id": x.rule_id,
                                        "message": x.message} for x in b.compiled.lints()]
                else:
                    from kernel.policy.rego.gate import rewrite_notes

                    row["notes"] = rewrite_notes(b.compiled.bundle)
                    row["warnings"] = rego_warnings(b)
            except ValidationError as exc:
                row["ok"] = False
                row["problems"] = [line for line in exc.message.splitlines() if line.strip()]
            rows.append(row)
    finally:
        engine.close()
    bad = sum(1 for r in rows if not r["ok"])
    if args.format == "json":
        print(json.dumps({"bundles": rows, "ok": bad == 0,
                          "warnings": sum(len(r["warnings"]) for r in rows)}, indent=2))
        return 1 if bad else 0
    out = stdout_console()
    for r in rows:
        if r["ok"]:
            out.print(f"[green]ok[/]  {escape(r['path'])}", highlight=False)
        else:
            err.print("\n".join(r["problems"]), style="red", markup=False, highlight=False)
        for note in r.get("notes", []):
            out.print(f"  {note} (rewritten at load)", style="cyan", markup=False, highlight=False)
        for w in r["warnings"]:
            rule = f"rule \"{w['rule_id']}\": " if w["rule_id"] else ""
            out.print(f"  {w['file']}:{w['line']}: warning: {rule}{w['message']}",
                      style="yellow", markup=False, highlight=False)
    return 1 if bad else 0


def rego_warnings(b: Any) -> list[dict[str, Any]]:
    """`policy check` warnings for a Rego bundle: literal times rego-cpp cannot parse."""
    from kernel.policy.rego.timelint import time_literal_lints

    bundle = b.compiled.bundle
    authored = dict(bundle.modules)  # the author's text: b.modules has idioms.py's rewrites applied
    lints = time_literal_lints(authored, {m: bundle.display_path(m) for m in authored})
    return [{"code": x.code, "file": x.file, "line": x.line, "col": x.col, "rule_id": "", "message": x.message}
            for x in lints]


def cmd_eval(args: argparse.Namespace) -> int:
    _quiet(args)
    engine = _engine()
    try:
        return run_eval(args, engine, stdout_console(), err)
    finally:
        engine.close()


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
    t.add_argument("--coverage", action="store_true",
                   help="also measure Rego line coverage (OPA's `opa test --coverage` shape in --format json)")
    t.add_argument("--threshold", default=None, metavar="[rules:|lines:]N",
                   help="fail (exit 2) when rule coverage (N or rules:N) or Rego line coverage (lines:N) is below N percent")
    t.add_argument("--strict", action="store_true",
                   help="Rego: strict-mode checks and strict builtin errors; YAML: authoring warnings are errors")
    t.add_argument("-v", "--verbose", action="store_true", help="show the engine's log lines")
    from kernel.cli.policy_replay import add_replay_arguments

    add_replay_arguments(t)
    t.set_defaults(fn=cmd_test)
    c = ps.add_parser("check", help="the load gate, and authoring warnings with their lines")
    c.add_argument("paths", nargs="+")
    c.add_argument("--format", choices=["pretty", "json"], default="pretty")
    c.add_argument("--strict", action="store_true",
                   help="Rego: OPA strict-mode checks (unused imports …); YAML: warnings are errors")
    c.add_argument("-v", "--verbose", action="store_true", help="show the engine's log lines")
    add_verify_arguments(c)
    c.set_defaults(fn=cmd_check)
    add_sign_command(ps)
    from kernel.cli.policy_fmt import add_fmt_command

    add_fmt_command(ps)
    e = ps.add_parser("eval", help="evaluate one input and print the decision")
    e.add_argument("bundle")
    e.add_argument("--input", help="a whole input document (JSON file, - for stdin); the flags below override it")
    e.add_argument("--target")
    e.add_argument("--args", default=None, help="JSON arguments")
    e.add_argument("--kind", default=None, choices=["tool_call", "llm_call", "local"])
    e.add_argument("--agent-id", dest="agent_id")
    e.add_argument("--execution-id", dest="execution_id")
    e.add_argument("--now", help='the clock the policy sees, e.g. "2026-12-02T19:00:00Z"')
    e.add_argument("--usage", help='the execution\'s token meter, e.g. \'{"input_tokens": 812, "output_tokens": 96}\'')
    e.add_argument("--explain", action="store_true", help="how the decision was reached")
    e.add_argument("--rule", action="append", help="Rego: also trace this rule (a rule name or a rule id); repeatable")
    e.add_argument("--format", choices=["pretty", "json"], default="pretty")
    e.add_argument("--judge", default=None, metavar="JSON",
                   help='probabilities a judge rule gets, e.g. \'{"allow": 0.2, "deny": 0.7}\' (default: no judge, deny)')
    e.add_argument("--strict", action="store_true", help="Rego: strict builtin errors")
    e.add_argument("-v", "--verbose", action="store_true", help="show the engine's log lines")
    e.set_defaults(fn=cmd_eval)
    from kernel.cli.shadow import add_shadow_commands

    add_shadow_commands(ps)
