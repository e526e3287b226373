"""Pinned tool definitions as a gateway reads them: the kernel holds the approvals (docs/mcp.md,
"Pinned tool definitions"); each gateway reports what its upstreams offer, gets the approved
hashes back, and keeps the last answer in a file only to start when the kernel is unreachable."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from kernel.domain.tool_pin import (
    MAX_DEFINITION_BYTES,
    MAX_TOOL_NAME,
    canonical_definition,
    definition_hash,
)

__all__ = ["KernelPins", "definition_hash", "reportable"]

log = logging.getLogger("regent.mcp")


def reportable(tool: str, name: str, description: str | None, input_schema: Any) -> bool:
    """Whether the kernel can hold this definition: a hostile upstream's over-long or unprintable
    name, or a definition over the bound, is never reported, so it is never approvable."""
    if not 0 < len(tool) <= MAX_TOOL_NAME or not tool.isprintable() or any(0xD800 <= ord(c) <= 0xDFFF for c in tool):
        return False
    try:
        size = len(canonical_definition(name, description, input_schema).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError, RecursionError):
        return False
    return size <= MAX_DEFINITION_BYTES


class KernelPins:
    """Approved definition hashes per agent and namespaced tool, as the kernel last answered them.
    Until the kernel has answered (unreachable at start), the fallback file's last answer, else
    the manifest's `mcp.pins`: fail closed, a tool approved nowhere is refused."""

    def __init__(self, path: Path | None, manifest_pins: Mapping[str, Mapping[str, str]]):
        self.path = path
        self.manifest_pins = {a: dict(p) for a, p in manifest_pins.items()}
        self._lock = threading.Lock()
        self._answered: dict[str, dict[str, str]] = {}  # from the kernel, this process
        # The tools the agent's bundle denies whatever the arguments, as the kernel last answered
        # (`denied_always`); not kept in the fallback file: until the kernel answers, none is hidden.
        self._denied: dict[str, frozenset[str]] = {}
        self._fallback: dict[str, dict[str, str]] = {}
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                log.warning("%s: unreadable pin fallback (%s); using the manifest's pins", path, type(e).__name__)
                loaded = {}
            if isinstance(loaded, dict):
                self._fallback = {a: {str(k): str(v) for k, v in t.items()} for a, t in loaded.items()
                                  if isinstance(t, dict)}

    def _current(self, agent: str) -> dict[str, str]:
        if agent in self._answered:
            return self._answered[agent]
        return self._fallback.get(agent, self.manifest_pins.get(agent, {}))

    def pinned(self, agent: str, tool: str) -> str | None:
        return self._current(agent).get(tool)

    def denied_always(self, agent: str) -> frozenset[str]:
        return self._denied.get(agent, frozenset())

    def answered(self, agent: str) -> bool:
        return agent in self._answered

    def take(self, agent: str, answer: Any) -> bool:
        """The kernel's answer to a report; True when the approvals changed."""
        tools = answer["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ValueError("not a list of tools")
        pins = {str(t["tool"]): str(t["approved_sha256"]) for t in tools if t.get("approved_sha256")}
        denied = frozenset(str(t["tool"]) for t in tools if t.get("denied_always") is True)
        with self._lock:
            self._denied[agent] = denied
            changed = pins != self._current(agent) or agent not in self._answered
            self._answered[agent] = pins
            if changed and self.path is not None:
                snapshot = {**self._fallback, **self._answered}
                tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(snapshot, indent=1, sort_keys=True), encoding="utf-8")
                os.replace(tmp, self.path)
        return changed

    async def sync(self, agent: str, send: Any, report: dict[str, Any]) -> bool | None:
        """Report through `send` (the agent's signed POST); True/False: the approvals changed or
        not; None: the kernel did not answer (the last answer, or the fallback, stays)."""
        try:
            r = await send(report)
        except httpx.HTTPError as e:
            log.warning("%s: the kernel is unreachable for tool pins (%s); keeping the last approvals",
                        agent, type(e).__name__)
            return None
        if r.status_code != 200:
            log.warning("%s: the kernel refused the tool report: %s %s", agent, r.status_code, r.text[:300])
            return None
        try:
            return self.take(agent, r.json())
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: the kernel's tool pins were not readable", agent)
            return None
