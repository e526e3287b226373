"""YAML from outside the process (case files, a bundle's data.yaml, configuration), with what its
aliases expand to bounded.

PyYAML builds an alias as a second reference to one object, so loading "a billion laughs" is
cheap; everything after it is not: a 300-byte data.yaml of seven nested aliases became 4.8 million
values and 1.9 GB of memory when the bundle's data was turned into JSON, and its signature check
hashes the same expansion before any signature is read. Here the composed document is measured
first, each alias counted as the whole of what it names, and refused past a bound that no
document without aliases can reach (at least one node per byte of text, and a million).

Numbers are read as YAML 1.2's core schema reads them (`1e6`, `1E3` and `.5` are numbers, which
PyYAML's YAML 1.1 rules read as strings), and a plain scalar the two versions read as different
values (`017`, `0o17`, `0b101`, `1_000`, `12:30`) is refused with its line: quote it to mean text.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_EXPANDED_NODES = 1_000_000

__all__ = ["AMBIGUOUS_NUMBER", "MAX_EXPANDED_NODES", "SafeLoader12", "YamlTooLarge", "ambiguity",
           "check_expansion", "describe_error", "load_first", "safe_load", "yaml12_numbers"]

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
AMBIGUOUS_NUMBER = "tag:regent,2026:ambiguous-number"
# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), hexadecimal included.
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
# Plain scalars YAML 1.1 and 1.2 read as different values: a leading zero (1.1 octal: 017 is 15),
# 0o and 0b prefixes, digit-group underscores, base-60 (12:30 is 750 in 1.1).
_AMBIGUOUS = re.compile(r"^(?:[-+]?0[0-9_]+|[-+]?0[oO][0-7_]*|[-+]?0b[01_]*|[-+]?0x[0-9a-fA-F]*_[0-9a-fA-F_]*"
                        r"|[-+]?[0-9]*_[0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
                        r"|[-+]?\.[0-9]*_[0-9_]*(?:[eE][-+]?[0-9]+)?"
                        r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?)$")
_NUMBER_FIRST = "-+0123456789."


def yaml12_numbers(loader: type) -> type:
    """Give a PyYAML loader class YAML 1.2's number resolution (in place; returns it)."""
    resolvers = {k: [r for r in v if r[0] not in (_INT_TAG, _FLOAT_TAG)]
                 for k, v in loader.yaml_implicit_resolvers.items()}  # type: ignore[attr-defined]
    for first in _NUMBER_FIRST:
        ours = [(AMBIGUOUS_NUMBER, _AMBIGUOUS), (_INT_TAG, _INT_12), (_FLOAT_TAG, _FLOAT_12)]
        resolvers[first] = ours + resolvers.get(first, [])
    loader.yaml_implicit_resolvers = resolvers  # type: ignore[attr-defined]
    if hasattr(loader, "add_constructor"):
        loader.add_constructor(AMBIGUOUS_NUMBER, _refuse_ambiguous)
        loader.add_constructor(_FLOAT_TAG, _finite_float)
    return loader


def ambiguity(text: str) -> str:
    """Why the plain scalar ``text`` is refused (YAML 1.1 and 1.2 read it differently)."""
    return (f"{text} is read as different values by YAML 1.1 and YAML 1.2 (a leading zero, 0o, 0b, "
            "an underscore or a colon): quote it for text, or write the number plainly")


def _refuse_ambiguous(loader: Any, node: Node) -> Any:
    raise ConstructorError(None, None, ambiguity(str(node.value)), node.start_mark)


def _finite_float(loader: Any, node: ScalarNode) -> float:
    value = float(yaml.SafeLoader.construct_yaml_float(loader, node))
    text = str(node.value)
    if math.isinf(value) and "inf" not in text.lower():  # 1e400: beyond float64, not `.inf`
        raise ConstructorError(None, None, f"{text} is beyond float64's range", node.start_mark)
    return value


class SafeLoader12(yaml.SafeLoader):
    """PyYAML's SafeLoader with YAML 1.2 numbers (for composing nodes)."""


yaml12_numbers(SafeLoader12)


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The fast safe loader with YAML 1.2 numbers."""


_LOADER: Any = yaml12_numbers(_Loader)


def describe_error(source: str, exc: yaml.YAMLError) -> str:
    """``source:LINE: problem`` for a YAML error that has a position (``source: …`` otherwise)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None and problem:
        return f"{source}:{mark.line + 1}: {problem}"
    return f"{source}: {' '.join(str(exc).split())}"


class YamlTooLarge(yaml.YAMLError):
    """A document whose aliases expand past the bound, or refer to themselves."""


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expansion(root: Node, max_nodes: int) -> int:
    """The number of nodes `root` stands for once every alias is expanded (iteratively: depth is
    not a limit here); YamlTooLarge past `max_nodes` or for an alias inside what it names.
    Scalars count 1 and are never stacked (most of a document is scalars)."""
    if isinstance(root, ScalarNode):
        return 1
    sizes: dict[int, int] = {}  # collections measured so far
    path: set[int] = set()  # the collections being measured: an alias to one of them is a cycle
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, measured = stack.pop()
        key = id(node)
        if measured:
            total = 1 + sum(sizes.get(id(c), 1) for c in _children(node))
            path.discard(key)
            if total > max_nodes:
                mark = node.start_mark
                raise YamlTooLarge(f"line {mark.line + 1}: the document expands past {max_nodes} values "
                                   "(aliases repeat what they name)")
            sizes[key] = total
        elif key not in sizes:
            if key in path:
                raise YamlTooLarge(f"line {node.start_mark.line + 1}: an alias refers to a value that contains it")
            path.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if not isinstance(c, ScalarNode) and id(c) not in sizes)
    return sizes[id(root)]


def load_first(loader: Any, text_length: int) -> Any:
    """The first document `loader` (a PyYAML loader over the text) holds, constructed only after
    its expansion is measured; None when there is none."""
    if not loader.check_node():
        return None
    node = loader.get_node()
    if node is None:
        return None
    check_expansion(node, max(MAX_EXPANDED_NODES, text_length))
    return _construct(loader, node)


def safe_load(text: str) -> Any:
    """`yaml.safe_load(text)` (one document), with the expansion bounded."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expansion(node, max(MAX_EXPANDED_NODES, len(text)))
        return _construct(loader, node)
    finally:
        loader.dispose()


def _construct(loader: Any, node: Node) -> Any:
    try:
        return loader.construct_document(node)
    except RecursionError:  # PyYAML constructs recursively
        raise YamlTooLarge(f"line {node.start_mark.line + 1}: nested too deep") from None
