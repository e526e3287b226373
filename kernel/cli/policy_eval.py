"""`regent policy eval`: one input (from flags or a whole input document) → the decision, and with
`--explain` how it was reached, as text or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from kernel.domain import JudgeAnswer, PolicyInput, resolve_judge
from kernel.errors import ValidationError
from kernel.policy.testing import load_bundle

_DOCUMENT_KEYS = {"agent_id", "kind", "target", "args", "idempotency", "execution", "usage", "now"}
_KINDS = ("tool_call", "llm_call", "local")


def policy_input(args: argparse.Namespace) -> PolicyInput:
    """The input from `--input FILE` (a whole input document, `-` for stdin) and the flags, which
    override the file's fields; raises ValidationError naming what is wrong."""
    doc: dict[str, Any] = {}
    if args.input:
        text = Path(args.input).read_text(encoding="utf-8") if args.input != "-" else sys.stdin.read()
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{args.input}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
        if not isinstance(doc, dict):
            raise ValidationError(f"{args.input}: an input document is a JSON object")
        unknown = sorted(set(doc) - _DOCUMENT_KEYS)
        if unknown:
            raise ValidationError(f"{args.input}: unknown key {unknown[0]!r} (an input document has "
                                  f"{', '.join(sorted(_DOCUMENT_KEYS))})")
    if args.args is not None:
        doc["args"] = _json_flag("--args", args.args)
        if not isinstance(doc["args"], dict):
            raise ValidationError("--args must be a JSON object")
    if args.usage is not None:
        doc["usage"] = _json_flag("--usage", args.usage)
    for flag in ("target", "kind", "agent_id", "now"):
        value = getattr(args, flag)
        if value is not None:
            doc[flag] = value
    if not doc.get("target"):
        raise ValidationError("a target is needed: --target, or \"target\" in the --input document")
    kind = doc.get("kind") or "tool_call"
    if kind not in _KINDS:
        raise ValidationError(f"kind must be one of {', '.join(_KINDS)}, not {kind!r}")
    usage = doc.get("usage") or {}
    if not isinstance(usage, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in usage.values()):
        raise ValidationError('usage must be an object of token counts, e.g. {"input_tokens": 812, "output_tokens": 96}')
    execution = doc.get("execution") or {}
    if not isinstance(execution, dict):
        raise ValidationError("execution must be an object")
    agent = str(doc.get("agent_id") or "")
    if args.execution_id is not None:
        execution = {**execution, "id": args.execution_id}
    if execution and "agent_id" not in execution:
        execution["agent_id"] = agent
    extra: dict[str, Any] = {}
    if "now" in doc:
        extra["now"] = str(doc["now"])
    if "idempotency" in doc:
        extra["idempotency"] = str(doc["idempotency"])
    return PolicyInput(agent_id=agent, kind=kind, target=str(doc["target"]), args=doc.get("args"),
                       execution=execution, usage={"input_tokens": 0, "output_tokens": 0, **usage}, **extra)


def _json_flag(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{flag} is not JSON: {exc}") from None


def run_eval(args: argparse.Namespace, engine: Any, out: Console, err: Console) -> int:
    try:
        judge = _judge_mock(args.judge)
    except ValueError as exc:
        err.print(f"--judge: {exc}", style="red", markup=False, highlight=False)
        return 1
    try:
        bundle = load_bundle(Path(args.bundle), engine, strict=args.strict)
        inp = policy_input(args)
    except (ValidationError, OSError) as exc:
        err.print(f"{getattr(exc, 'message', exc)}", style="red", markup=False, highlight=False)
        return 1
    from kernel.policy.explain import explain_document

    doc = explain_document(bundle.compiled, inp, explain=args.explain, rules=tuple(args.rule or ()),
                           judge=lambda d: resolve_judge(d, JudgeAnswer.mocked(judge)))
    if args.format == "json":
        print(json.dumps(doc, indent=2, ensure_ascii=False))
        return 0
    _pretty(doc, out, explain=args.explain)
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


def _pretty(doc: dict[str, Any], out: Console, *, explain: bool) -> None:
    from kernel.policy.explain import explain_lines

    lines = explain_lines(doc, explain=explain)
    out.print(f"  {lines[0]}", highlight=False, markup=False)
    for line in lines[1:]:
        out.print(f"    {line}", highlight=False, markup=False)
