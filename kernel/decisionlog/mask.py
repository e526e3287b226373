"""Mask rules: JSON-pointer paths in a decision-log entry's `input`, removed or replaced before the
entry leaves the kernel (OPA's `mask` ops `remove` and `upsert`).

The entry's input is never mutated in place (it may be the kernel's own cached copy of an
execution's input): only the containers on a masked path are copied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernel.errors import ConfigError
from kernel.ids import whole_number

__all__ = ["MaskRule", "apply_masks", "parse_mask_rules"]


@dataclass(frozen=True, slots=True)
class MaskRule:
    op: str  # "remove" | "upsert"
    path: tuple[str, ...]  # pointer tokens below `input`
    value: Any = None

    @property
    def pointer(self) -> str:
        """As OPA reports it in `erased` / `masked`: `/input/...`."""
        return "/input" + "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in self.path)


def _tokens(pointer: str) -> tuple[str, ...]:
    if not pointer.startswith("/"):
        raise ConfigError(f"decision-log mask {pointer!r}: a JSON pointer starts with '/' (e.g. /args/password)")
    tokens = tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))
    if tokens[:1] == ("input",):  # OPA writes `/input/...`; Regent's paths are below input
        tokens = tokens[1:]
    if not tokens or any(t == "" for t in tokens):
        raise ConfigError(f"decision-log mask {pointer!r}: names no field below input")
    return tokens


def parse_mask_rules(text: str | None) -> tuple[MaskRule, ...]:
    """`/args/password,/execution/input/ssn` (each removed), or OPA's JSON form
    `[{"op": "upsert", "path": "/input/args/token", "value": "**REDACTED**"}, ...]`."""
    if text is None or not text.strip():
        return ()
    text = text.strip()
    if not text.startswith("["):
        return tuple(MaskRule("remove", _tokens(p.strip())) for p in text.split(",") if p.strip())
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"decision-log mask: not a JSON list of rules ({exc})") from None
    rules = []
    for item in raw:
        if not isinstance(item, dict) or set(item) - {"op", "path", "value"} or "path" not in item:
            raise ConfigError(f"decision-log mask rule {item!r}: expected {{op, path, value?}}")
        op = item.get("op", "remove")
        if op not in ("remove", "upsert"):
            raise ConfigError(f"decision-log mask rule {item!r}: op must be remove or upsert")
        if op == "upsert" and "value" not in item:
            raise ConfigError(f"decision-log mask rule {item!r}: upsert needs a value")
        if not isinstance(item["path"], str):
            raise ConfigError(f"decision-log mask rule {item!r}: path must be a string")
        rules.append(MaskRule(op, _tokens(item["path"]), item.get("value")))
    return tuple(rules)


def apply_masks(entry: dict[str, Any], rules: tuple[MaskRule, ...]) -> dict[str, Any]:
    """A copy of `entry` whose input has every rule applied; `erased` / `masked` list the
    pointers that were removed / replaced, as in OPA's decision logs."""
    if not rules or "input" not in entry:
        return entry
    out = dict(entry)
    doc = entry["input"]
    erased: list[str] = []
    masked: list[str] = []
    for rule in rules:
        doc, hit = _apply(doc, rule.path, rule)
        if hit:
            (erased if rule.op == "remove" else masked).append(rule.pointer)
    out["input"] = doc
    if erased:
        out["erased"] = erased
    if masked:
        out["masked"] = masked
    return out


def _apply(node: Any, path: tuple[str, ...], rule: MaskRule) -> tuple[Any, bool]:
    """(new node, whether the rule changed something). Containers on the path are copied."""
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        if head not in node:
            if rule.op == "upsert" and not rest:
                return {**node, head: rule.value}, True
            return node, False
        if not rest:
            copy = dict(node)
            if rule.op == "remove":
                del copy[head]
            else:
                copy[head] = rule.value
            return copy, True
        child, hit = _apply(node[head], rest, rule)
        if not hit:
            return node, False
        return {**node, head: child}, True
    if isinstance(node, list) and (i := whole_number(head, len(node) - 1)) is not None:
        items = list(node)
        if not rest:
            if rule.op == "remove":
                del items[i]
            else:
                items[i] = rule.value
            return items, True
        child, hit = _apply(node[i], rest, rule)
        if not hit:
            return node, False
        items[i] = child
        return items, True
    return node, False
