"""An agent's tools as the gateway offers them: every upstream's tools under `{prefix}_{name}`
(rebuno.mcp.wrap_mcp_tools's names), each with its definition hash and whether it is pinned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp import types
from prometheus_client import CollectorRegistry, Counter

from kernel.manifest_mcp import McpAgent
from kernel.mcp.pins import KernelPins, definition_hash, reportable
from kernel.mcp.upstream import UpstreamConn

# The states a listed tool can be in; only `approved` tools are offered and callable.
APPROVED, CHANGED, NEW = "approved", "changed", "new"


class Metrics:
    """`/metrics` on the gateway's port: calls by agent, upstream and decision; upstream failures;
    refused calls to tools whose definition changed."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("regent_mcp_calls", "MCP tool calls by agent, upstream and outcome",
                             ("agent", "upstream", "decision"), registry=self.registry)
        self.upstream_errors = Counter("regent_mcp_upstream_errors", "Upstream calls that failed, by kind",
                                       ("agent", "upstream", "kind"), registry=self.registry)
        self.pin_refusals = Counter("regent_mcp_pin_refusals",
                                    "Calls refused because the tool's definition differs from its pin",
                                    ("agent", "tool"), registry=self.registry)


@dataclass(frozen=True, slots=True)
class Entry:
    name: str  # namespaced
    upstream: UpstreamConn
    tool: types.Tool  # as the upstream defines it (its bare name)
    digest: str
    pinned: str | None

    @property
    def state(self) -> str:
        if self.pinned is None:
            return NEW
        return APPROVED if self.pinned == self.digest else CHANGED

    def offered(self) -> types.Tool:
        return self.tool.model_copy(update={"name": self.name})


def namespaced(prefix: str, name: str) -> str:
    return f"{prefix}_{name}" if prefix else name


def build(agent_id: str, upstreams: list[UpstreamConn], pins: KernelPins) -> dict[str, Entry]:
    """The catalog from the upstreams' last tools/list and the approvals the kernel last answered
    (`trust_new_tools` is applied by the kernel, which records who trusted what)."""
    out: dict[str, Entry] = {}
    for up in upstreams:
        for tool in up.tools:
            name = namespaced(up.spec.prefix, tool.name)
            digest = definition_hash(tool.name, tool.description, tool.inputSchema)
            out.setdefault(name, Entry(name, up, tool, digest, pins.pinned(agent_id, name)))
    return out


def report(cfg: McpAgent, catalog: dict[str, Entry], agent_pins: dict[str, str]) -> dict[str, Any]:
    """What a gateway tells the kernel (POST /v0/mcp/{agent}/tools): each tool it is offered
    that the kernel can hold, the manifest's pins and whether it trusts new tools."""
    tools = [{"tool": e.name, "upstream": e.upstream.spec.prefix,
              "definition": {"name": e.tool.name, "description": e.tool.description or "",
                             "inputSchema": e.tool.inputSchema}}
             for e in catalog.values() if reportable(e.name, e.tool.name, e.tool.description, e.tool.inputSchema)]
    return {"tools": tools, "manifest_pins": agent_pins, "trust_new_tools": cfg.trust_new_tools}
