"""rego-cpp compile errors → `file:line:col: message` lines (pure: no regopy here).

rego-cpp raises `RegoError` with an s-expression such as::

    (rego-errorseq
      (error 13:dir/file.rego|30|2
        (errormsg 16:this is unclosed)
        (errorast |30|2)))

Atoms ``N:text`` are length-prefixed (bytes); a location is ``|offset|length``, preceded by
``N:filename`` when the file changes and followed by ``:text`` (the located source) on some nodes.
Offsets count bytes, so columns are byte columns, as in rego-cpp's own report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CompileError", "compile_errors", "line_col"]


@dataclass(frozen=True, slots=True)
class CompileError:
    message: str
    file: str = ""
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.file and self.line:
            return f"{self.file}:{self.line}:{self.col}: {self.message}"
        if self.file:
            return f"{self.file}: {self.message}"
        return self.message


@dataclass
class _Node:
    kind: str
    file: str = ""
    offset: int = -1
    value: str = ""
    children: list[_Node] = field(default_factory=list)


def line_col(source: str, offset: int) -> tuple[int, int]:
    """1-based line and byte column of a byte offset into `source`."""
    raw = source.encode("utf-8")[: max(offset, 0)]
    line = raw.count(b"\n") + 1
    return line, len(raw) - (raw.rfind(b"\n") + 1) + 1


def compile_errors(error: str, report: str, sources: Mapping[str, str]) -> list[CompileError]:
    """The errors in a rego-cpp compile failure, located in `sources` (bundle path → text)."""
    try:
        errors = _from_sexpr(error.encode("utf-8"), sources)
    except (ValueError, IndexError):
        errors = []
    if not errors:
        errors = _from_report(report)
    if not errors:
        text = " ".join(error.split())[:300] or "rego-cpp could not compile the bundle"
        errors = [CompileError(text)]
    return errors


def _from_sexpr(data: bytes, sources: Mapping[str, str]) -> list[CompileError]:
    root = _parse(data)
    found: list[CompileError] = []
    for node in _walk(root):
        if node.kind != "error":
            continue
        message = next((n.value for n in _walk(node) if n.kind == "errormsg" and n.value), "")
        located = next((n for n in _walk(node) if n.offset >= 0 and n.file), None)
        if located is not None and located.file in sources:
            line, col = line_col(sources[located.file], located.offset)
            found.append(CompileError(message or "compile error", located.file, line, col))
        else:
            found.append(CompileError(message or "compile error"))
    return found


def _walk(node: _Node) -> list[_Node]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(n.children))
    return out


_LOCATION = re.compile(rb"\|(\d+)\|(\d+)")


def _parse(data: bytes) -> _Node:
    root = _Node("root")
    stack = [root]
    current_file = ""
    i, n = 0, len(data)
    while i < n:
        c = data[i : i + 1]
        if c in b" \t\r\n":
            i += 1
        elif c == b"(":
            j = i + 1
            while j < n and data[j : j + 1] not in b" \t\r\n()":
                j += 1
            node = _Node(data[i + 1 : j].decode("utf-8", "replace"))
            stack[-1].children.append(node)
            stack.append(node)
            i = j
        elif c == b")":
            if len(stack) > 1:
                stack.pop()
            i += 1
        elif c.isdigit() or c == b"|":
            text = None
            if c.isdigit():
                j = i
                while data[j : j + 1].isdigit():
                    j += 1
                if data[j : j + 1] != b":":
                    raise ValueError("unexpected atom")
                length = int(data[i:j])
                text = data[j + 1 : j + 1 + length].decode("utf-8", "replace")
                i = j + 1 + length
            m = _LOCATION.match(data, i)
            node = stack[-1]
            if m:
                if text is not None:
                    current_file = text
                if node.offset < 0:
                    node.offset, node.file = int(m.group(1)), current_file
                i = m.end()
                if data[i : i + 1] == b":":  # the located source text follows
                    i += 1 + int(m.group(2))
            elif text is not None:
                node.value = text
            else:
                raise ValueError("bad location")
        else:
            j = i
            while j < n and data[j : j + 1] not in b" \t\r\n()":
                j += 1
            i = j
    return root


_REPORT_LOCATION = re.compile(r"^-- (.+?):(\d+):(\d+)\s*$")


def _from_report(report: str) -> list[CompileError]:
    """Fallback: rego-cpp's printed report (message lines, then `-- file:line:col`)."""
    body = report.split("Errors:", 1)[-1]
    found = []
    for block in re.split(r"\n-{8,}\n", body):
        lines = [ln for ln in block.strip("\n").splitlines()]
        message_lines = []
        location = None
        for ln in lines:
            if ln.startswith("-- "):
                location = _REPORT_LOCATION.match(ln)
                break
            if ln.strip():
                message_lines.append(ln.strip())
        message = " ".join(message_lines)
        if not message or message.startswith("Pass "):
            continue
        if location:
            found.append(
                CompileError(
                    message, location.group(1), int(location.group(2)), int(location.group(3))
                )
            )
        else:
            found.append(CompileError(message))
    return found
