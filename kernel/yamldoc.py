"""YAML from outside the process (case files, a bundle's data.yaml, configuration), with what its
aliases expand to bounded.

PyYAML builds an alias as a second reference to one object, so loading "a billion laughs" is
cheap; everything after it is not: a 300-byte data.yaml of seven nested aliases became 4.8 million
values and 1.9 GB of memory when the bundle's data was turned into JSON, and its signature check
hashes the same expansion before any signature is read. Here the composed document is measured
first, each alias counted as the whole of what it names, and refused past a bound that no
document without aliases can reach (at least one node per byte of text, and a million).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_EXPANDED_NODES = 1_000_000
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

__all__ = ["MAX_EXPANDED_NODES", "YamlTooLarge", "check_expansion", "load_first", "safe_load"]


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
