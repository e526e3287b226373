"""Mask rules: JSON-pointer paths in a decision-log entry's `input`, removed or replaced before the
entry leaves the kernel (OPA's `mask` ops `remove` and `upsert`, Regent's `replace`, and the
wildcard segments `*` and `**` that find a field wherever the step carries it).

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

OPS = ("remove", "upsert", "replace")
ANY_ONE, ANY_DEPTH = "*", "**"  # a whole segment: any one key or index / any number of them, none included
MAX_REPORTED = 100  # pointers listed in `erased` / `masked` per entry (a `**` rule may hit many)

Tokens = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MaskRule:
    """`remove` deletes the field; `upsert` sets it, adding it (and any missing objects above
    it) when absent, as OPA does; `replace` sets it only where it exists. A path with a `*` or
    `**` segment adds nothing: it masks the fields it finds."""

    op: str  # "remove" | "upsert" | "replace"
    path: Tokens  # pointer tokens below `input`
    value: Any = None

    @property
    def pointer(self) -> str:
        """As OPA reports it in `erased` / `masked`: `/input/...`."""
        return _pointer(self.path)

    @property
    def wild(self) -> bool:
        return ANY_ONE in self.path or ANY_DEPTH in self.path


def _pointer(tokens: Tokens) -> str:
    return "/input" + "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _tokens(pointer: str) -> Tokens:
    if not pointer.startswith("/"):
        raise ConfigError(f"decision-log mask {pointer!r}: a JSON pointer starts with '/' (e.g. /args/password)")
    tokens = tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))
    if tokens[:1] == ("input",):  # OPA writes `/input/...`; Regent's paths are below input
        tokens = tokens[1:]
    if not tokens or any(t == "" for t in tokens):
        raise ConfigError(f"decision-log mask {pointer!r}: names no field below input")
    if tokens[-1] in (ANY_ONE, ANY_DEPTH) and len(tokens) == 1:
        raise ConfigError(f"decision-log mask {pointer!r}: would mask the whole input (name a field)")
    if tokens[-1] == ANY_DEPTH:
        raise ConfigError(f"decision-log mask {pointer!r}: `**` must be followed by the field to mask")
    return tokens


def parse_mask_rules(text: str | None) -> tuple[MaskRule, ...]:
    """`/args/password,/execution/input/ssn,/**/iban` (each removed), or OPA's JSON form
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
    if not isinstance(raw, list):
        raise ConfigError("decision-log mask: not a JSON list of rules")
    rules = []
    for item in raw:
        if isinstance(item, str):  # OPA takes a bare pointer in the list as a remove
            rules.append(MaskRule("remove", _tokens(item)))
            continue
        if not isinstance(item, dict) or set(item) - {"op", "path", "value"} or "path" not in item:
            raise ConfigError(f"decision-log mask rule {item!r}: expected {{op, path, value?}}")
        op = item.get("op", "remove")
        if op not in OPS:
            raise ConfigError(f"decision-log mask rule {item!r}: op must be one of {', '.join(OPS)}")
        if op != "remove" and "value" not in item:
            raise ConfigError(f"decision-log mask rule {item!r}: {op} needs a value")
        if not isinstance(item["path"], str):
            raise ConfigError(f"decision-log mask rule {item!r}: path must be a string")
        rules.append(MaskRule(op, _tokens(item["path"]), item.get("value")))
    return tuple(rules)


def apply_masks(entry: dict[str, Any], rules: tuple[MaskRule, ...], *, create: bool = True) -> dict[str, Any]:
    """A copy of `entry` whose input has every rule applied; `erased` / `masked` list the
    pointers that were removed / set (the fields found, for a wildcard rule), as in OPA's
    decision logs. `create=False` applies `upsert` as `replace` (nothing is added)."""
    if not rules or "input" not in entry:
        return entry
    out = dict(entry)
    doc = entry["input"]
    erased: list[str] = []
    masked: list[str] = []
    for rule in rules:
        hits: list[Tokens] = []
        adds = create and rule.op == "upsert" and not rule.wild
        doc = _apply(doc, rule.path, (), rule, adds, hits)
        listed = erased if rule.op == "remove" else masked
        listed.extend(_pointer(h) for h in hits[: max(MAX_REPORTED - len(listed), 0)])
    out["input"] = doc
    if erased:
        out["erased"] = erased
    if masked:
        out["masked"] = masked
    return out


def _apply(node: Any, path: Tokens, at: Tokens, rule: MaskRule, adds: bool, hits: list[Tokens]) -> Any:
    """`node` with the rule applied below it at `path` (its pointer is `at`): the node itself when
    nothing changed, else a copy of the containers on the changed paths. Each field changed is
    appended to `hits`."""
    head, rest = path[0], path[1:]
    if head == ANY_DEPTH:
        # Zero segments (the rest of the path applies here), then any number: every child with
        # the whole path again. A field this node's own step just set is not searched again.
        here = len(hits)
        node = _apply(node, rest, at, rule, adds, hits)
        touched = {h[len(at)] for h in hits[here:] if len(h) == len(at) + 1}
        return _each_child(node, at, lambda child, where: child if where[-1] in touched
                           else _apply(child, path, where, rule, adds, hits))
    if head == ANY_ONE:
        if not rest:
            return _set_children(node, at, rule, hits)
        return _each_child(node, at, lambda child, where: _apply(child, rest, where, rule, adds, hits))
    if isinstance(node, dict):
        if head not in node:
            if not adds:
                return node
            if rest:  # OPA's upsert makes the missing objects on its way down
                child = _apply({}, rest, (*at, head), rule, adds, hits)
                return {**node, head: child} if child != {} else node
            hits.append((*at, head))
            return {**node, head: rule.value}
        if not rest:
            hits.append((*at, head))
            copy = dict(node)
            if rule.op == "remove":
                del copy[head]
            else:
                copy[head] = rule.value
            return copy
        child = _apply(node[head], rest, (*at, head), rule, adds, hits)
        return node if child is node[head] else {**node, head: child}
    if isinstance(node, list) and (i := whole_number(head, len(node) - 1)) is not None:
        if not rest:
            hits.append((*at, head))
            items = list(node)
            if rule.op == "remove":
                del items[i]
            else:
                items[i] = rule.value
            return items
        child = _apply(node[i], rest, (*at, head), rule, adds, hits)
        if child is node[i]:
            return node
        items = list(node)
        items[i] = child
        return items
    return node


def _each_child(node: Any, at: Tokens, step: Any) -> Any:
    """`node` with `step(child, pointer)` applied to each child, copied only if one changed."""
    if isinstance(node, dict):
        changed = {k: c for k, v in node.items() if (c := step(v, (*at, k))) is not v}
        return {**node, **changed} if changed else node
    if isinstance(node, list):
        items = [step(v, (*at, str(i))) for i, v in enumerate(node)]
        return items if any(a is not b for a, b in zip(items, node, strict=True)) else node
    return node


def _set_children(node: Any, at: Tokens, rule: MaskRule, hits: list[Tokens]) -> Any:
    """A trailing `*`: every member (or item) of `node` removed or set."""
    if isinstance(node, dict) and node:
        hits.extend((*at, k) for k in node)
        return {} if rule.op == "remove" else dict.fromkeys(node, rule.value)
    if isinstance(node, list) and node:
        hits.extend((*at, str(i)) for i in range(len(node)))
        return [] if rule.op == "remove" else [rule.value] * len(node)
    return node
