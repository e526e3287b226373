"""Strict YAML reading for bundles: the first document as a node tree, typed access with lines.

We compose nodes (never construct Python objects), so every value keeps its source mark and its
scalar text. Typing follows Go's yaml.v3 decoding into Rebuno's structs: a string field takes any
scalar's text (so `equals: 1.0` is the string "1.0"), null is the zero value, ints and durations
must be written as such, and mapping keys are unique and known.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kernel.errors import ValidationError
from kernel.policy.duration import DurationError, parse_duration
from kernel.yamldoc import AMBIGUOUS_NUMBER, ambiguity, yaml12_numbers

__all__ = ["BundleReader", "bundle_error", "parse_document"]

_TAG = "tag:yaml.org,2002:"
STR, INT, NULL = _TAG + "str", _TAG + "int", _TAG + "null"
FLOAT, BOOL = _TAG + "float", _TAG + "bool"

# Scalar tags whose text we accept; explicit application tags (`!foo`, `!!binary`) are refused.
_SCALAR_TAGS = frozenset(
    [*(_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp", "merge", "value")), AMBIGUOUS_NUMBER]
)
_KIND = {MappingNode: "mapping", SequenceNode: "sequence", ScalarNode: "scalar"}
_INT64 = (-(1 << 63), (1 << 63) - 1)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose composed nodes keep their start marks (PyYAML records them on every node).

    Only composition is used: the constructor would lose marks and silently merge duplicate keys.
    Numbers resolve as YAML 1.2 reads them (kernel/yamldoc.py).
    """


yaml12_numbers(_StrictLoader)


def bundle_error(line: int | None, detail: str, **details: Any) -> ValidationError:
    where = f"line {line}: " if line else ""
    extra = {"line": line, **details} if line else details
    return ValidationError(f"invalid policy bundle: {where}{detail}", details=extra or None)


def line_of(node: Node) -> int:
    return node.start_mark.line + 1


def parse_document(text: str) -> Node | None:
    """The first YAML document of ``text`` as a node tree; None when there is none (or it is null).

    Later documents are never read, so a syntax error after the first ``---`` is not reported
    (Rebuno decodes one document the same way).
    """
    try:
        # The reader checks the text when the loader is built: a control character raises there.
        loader = _StrictLoader(text)
    except yaml.YAMLError as exc:
        raise bundle_error(None, f"YAML: {exc}") from None
    try:
        if not loader.check_node():
            return None
        node = loader.get_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            problem = f"{problem} ({exc.context})"
        raise bundle_error(mark.line + 1 if mark else None, f"YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise bundle_error(None, f"YAML: {exc}") from None
    except RecursionError:
        raise bundle_error(None, "YAML: nesting too deep") from None
    finally:
        loader.dispose()
    if isinstance(node, ScalarNode) and node.tag == NULL:
        return None
    return node


class BundleReader:
    """Typed, strict access to composed nodes. ``where`` strings name the field for messages
    (``then.rate_limit.max_calls``); ``scope`` prefixes every message (``rule "rm-rf": ``).

    Counts nodes visited so that aliases cannot amplify a small text into huge work.
    """

    def __init__(self, max_nodes: int) -> None:
        self._budget = max_nodes
        self.scope = ""
        self.scope_details: dict[str, Any] = {}

    def fail(self, node: Node | None, detail: str) -> NoReturn:
        line = line_of(node) if node is not None else None
        raise bundle_error(line, self.scope + detail, **self.scope_details)

    def _spend(self, node: Node, count: int = 1) -> None:
        self._budget -= count
        if self._budget < 0:
            self.fail(node, "bundle too large (too many YAML nodes after alias expansion)")

    @staticmethod
    def is_null(node: Node | None) -> bool:
        return node is None or (isinstance(node, ScalarNode) and node.tag == NULL)

    def mapping(
        self, node: Node, allowed: frozenset[str] | None, where: str, *, name: str = ""
    ) -> Iterator[tuple[str, ScalarNode, Node]]:
        """Yield ``(key, key_node, value_node)`` in source order, rejecting duplicate and unknown
        keys at the offending key's line. ``where`` names the mapping in messages ("" for the top
        level and a rule's own keys, ``name`` then says what it is); ``allowed=None`` takes any key.
        """
        self._spend(node)
        if not isinstance(node, MappingNode):
            self.fail(node, f"{name or where} must be a mapping, got {_describe(node)}")
        self._spend(node, len(node.value))
        inside = f" in {where}" if where else ""
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.fail(
                    key_node, f"mapping keys must be strings, got {_describe(key_node)}{inside}"
                )
            key = key_node.value
            if key in seen:
                self.fail(key_node, f'duplicate key "{key}"{inside} (first at line {seen[key]})')
            seen[key] = line_of(key_node)
            if allowed is not None and key not in allowed:
                self.fail(key_node, f'unknown key "{key}"{inside}')
            yield key, key_node, value_node

    def sequence(self, node: Node, where: str) -> list[Node]:
        """Items of a sequence; null is the empty sequence."""
        if self.is_null(node):
            return []
        if not isinstance(node, SequenceNode):
            self.fail(node, f"{where} must be a list, got {_describe(node)}")
        self._spend(node, len(node.value) + 1)
        return list(node.value)

    def text(self, node: Node, where: str) -> str:
        """A string field: any scalar's text (yaml.v3 copies the source text); null is ""."""
        self._spend(node)
        if not isinstance(node, ScalarNode):
            self.fail(node, f"{where} must be a string, got {_describe(node)}")
        if node.tag not in _SCALAR_TAGS:
            self.fail(node, f"{where}: unsupported YAML tag {node.tag}")
        return "" if node.tag == NULL else node.value

    def texts(self, node: Node, where: str) -> list[str]:
        return [
            self.text(item, f"{where}[{i}]") for i, item in enumerate(self.sequence(node, where))
        ]

    def word(self, node: Node, where: str, choices: tuple[str, ...]) -> str:
        """An enumerated string: must be written as a string (``decision: true`` is a type error);
        "" (or null) means "use the default"."""
        self._spend(node)
        if self.is_null(node):
            return ""
        if not isinstance(node, ScalarNode) or node.tag != STR:
            self.fail(node, f"{where} must be a string, got {_describe(node)}")
        value = node.value
        if value and value not in choices:
            self.fail(node, f'{where} must be one of {", ".join(choices)}; got "{value}"')
        return value

    def integer(self, node: Node, where: str) -> int:
        self._spend(node)
        if self.is_null(node):
            return 0
        if not isinstance(node, ScalarNode) or node.tag != INT:
            self.fail(node, f"{where} must be an integer, got {_describe(node)}")
        try:
            value = int(_INT_CONSTRUCTOR.construct_yaml_int(node))
        except ValueError:
            self.fail(node, f'{where} must be an integer, got "{node.value}"')
        if not _INT64[0] <= value <= _INT64[1]:
            self.fail(node, f"{where} is out of range for a 64-bit integer")
        return value

    def number(self, node: Node, where: str) -> tuple[int | float, str]:
        """A YAML int or float (a Regent extension's bound), with its source text; a string,
        NaN or an infinity is an error."""
        self._spend(node)
        if not isinstance(node, ScalarNode) or node.tag not in (INT, FLOAT):
            hint = ""
            if isinstance(node, ScalarNode) and node.tag == AMBIGUOUS_NUMBER:
                hint = f" ({ambiguity(node.value)})"
            elif isinstance(node, ScalarNode) and node.tag == STR and node.style in ('"', "'"):
                hint = " (a quoted value is a string: write the number without quotes)"
            self.fail(node, f"{where} must be a number, got {_describe(node)}{hint}")
        value: int | float
        if node.tag == INT:
            value = self.integer(node, where)
            return value, str(value)
        value = float(_INT_CONSTRUCTOR.construct_yaml_float(node))
        if value != value or value in (float("inf"), float("-inf")):
            self.fail(node, f"{where} must be a finite number, got {_describe(node)}")
        return value, node.value.replace("_", "")

    def boolean(self, node: Node, where: str) -> bool:
        self._spend(node)
        if not isinstance(node, ScalarNode) or node.tag != BOOL:
            self.fail(node, f"{where} must be true or false, got {_describe(node)}")
        return bool(_INT_CONSTRUCTOR.construct_yaml_bool(node))

    def duration(self, node: Node, where: str) -> float:
        """A Go duration written as a YAML string (``timeout: 300`` is an error); null is 0."""
        self._spend(node)
        if self.is_null(node):
            return 0.0
        if not isinstance(node, ScalarNode) or node.tag != STR:
            self.fail(
                node,
                f'{where} must be a duration string such as "30s" or "5m", got {_describe(node)}',
            )
        try:
            return parse_duration(node.value)
        except DurationError as exc:
            self.fail(node, f"{where}: {exc}")


_INT_CONSTRUCTOR = SafeConstructor()  # YAML 1.1 ints: 0x1f, 017, 0b101, 1_000, 1:30


def _describe(node: Node) -> str:
    if isinstance(node, ScalarNode):
        kind = node.tag.removeprefix(_TAG)
        kind = {"str": "string", "int": "integer", "bool": "boolean", "null": "null"}.get(
            kind, kind
        )
        shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        return f'{kind} "{shown}"'
    return _KIND.get(type(node), type(node).__name__)
