"""Pinned tool definitions: the hash of each upstream tool's name, description and input schema
that an operator approved, kept in a JSON file beside the gateway; a tool whose definition no
longer hashes to its pin is refused until the new definition is approved (docs/mcp.md)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def definition_hash(name: str, description: str | None, input_schema: Any) -> str:
    """sha256 of the canonical JSON of {name, description, inputSchema} (the upstream's bare name)."""
    text = json.dumps({"name": name, "description": description or "", "inputSchema": input_schema},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class PinStore:
    """Approved definition hashes per agent and namespaced tool: the manifest's `mcp.pins`, then
    whatever was approved since (the file, written whole and renamed into place)."""

    def __init__(self, path: Path | None, manifest_pins: Mapping[str, Mapping[str, str]]):
        self.path = path
        self._lock = threading.Lock()
        self._pins: dict[str, dict[str, str]] = {a: dict(p) for a, p in manifest_pins.items()}
        if path is not None and path.exists():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: expected a JSON object of agent -> tool -> hash")
            for agent, tools in loaded.items():
                if isinstance(tools, dict):
                    self._pins.setdefault(agent, {}).update({str(k): str(v) for k, v in tools.items()})

    def pinned(self, agent: str, tool: str) -> str | None:
        return self._pins.get(agent, {}).get(tool)

    def all(self, agent: str) -> dict[str, str]:
        return dict(self._pins.get(agent, {}))

    def approve(self, agent: str, tool: str, digest: str) -> None:
        with self._lock:
            self._pins.setdefault(agent, {})[tool] = digest
            if self.path is None:
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self._pins, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)
