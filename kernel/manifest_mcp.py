"""An agent's `mcp:` section of the provisioning manifest (docs/mcp.md): its upstream MCP servers,
which tools are `at_most_once`, which tool definitions are pinned, and how long a call waits.

The manifest's schema, beside `manifest.py`, which validates it at load; the MCP gateway
(`kernel/mcp/`) reads it from there, so the manifest never imports the gateway."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_KEYS = ("upstreams", "client_token", "at_most_once", "pins", "trust_new_tools", "approval_wait_seconds",
         "lease_wait_seconds", "call_timeout_seconds", "max_args_bytes", "max_result_bytes",
         "resume_seconds", "record_before_answer", "pins_refresh_seconds", "hide_denied_tools")
_UPSTREAM_KEYS = ("prefix", "command", "args", "env", "cwd", "url", "headers", "timeout_seconds")
# The SDK's `{prefix}_{name}`: a prefix is a plain identifier so the joined name stays one.
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
_HASH = re.compile(r"[0-9a-f]{64}")


class McpConfigError(ValueError):
    """A bad `mcp:` section; the message names the key."""


@dataclass(frozen=True, slots=True)
class Upstream:
    prefix: str  # tool names are `{prefix}_{name}`, as rebuno.mcp.wrap_mcp_tools names them
    command: str | None = None  # a stdio server: command, args, env, cwd
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None  # a streamable-HTTP server: url, headers
    headers: tuple[tuple[str, str], ...] = ()
    timeout_seconds: float | None = None  # per upstream call (else mcp.call_timeout_seconds, 30 s)

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


@dataclass(frozen=True, slots=True)
class McpAgent:
    upstreams: tuple[Upstream, ...]
    client_token: str | None = None  # the bearer HTTP clients of this agent present
    at_most_once: tuple[str, ...] = ()  # namespaced tool names (fnmatch globs) that must not re-run
    pins: Mapping[str, str] = field(default_factory=dict)  # namespaced tool name -> definition sha256
    trust_new_tools: bool = False  # pin a tool's first-seen definition instead of holding it back
    approval_wait_seconds: float = 30.0  # how long a call blocked on approval waits, with progress
    lease_wait_seconds: float = 15.0  # how long a call waits for the kernel's dispatch
    call_timeout_seconds: float = 30.0  # per upstream call, for upstreams that set none; past it the step fails
    max_args_bytes: int = 256 * 1024
    max_result_bytes: int = 1024 * 1024
    resume_seconds: float = 300.0  # a keyed session's execution stays open this long after it ends
    record_before_answer: bool = False  # record a result before answering it (else while answering)
    pins_refresh_seconds: float = 5.0  # how often the gateway re-reads the kernel's approvals
    # tools/list leaves out the tools the agent's bundle denies whatever the arguments (presentation
    # only: a call to one is still a step the kernel denies and records)
    hide_denied_tools: bool = False


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86_400:
        raise McpConfigError(f"`mcp.{key}` must be a number of seconds in (0, 86400]")
    return float(value)


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise McpConfigError(f"`{key}` must be a list of non-empty strings")
    return tuple(value)


def _string_map(value: Any, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise McpConfigError(f"`{key}` must be a mapping of strings to strings (quote numbers)")
    return tuple(value.items())


def _upstream(raw: Any, i: int) -> Upstream:
    where = f"mcp.upstreams[{i}]"
    if not isinstance(raw, dict):
        raise McpConfigError(f"`{where}` must be a mapping")
    unknown = sorted(set(raw) - set(_UPSTREAM_KEYS))
    if unknown:
        raise McpConfigError(f"`{where}`: unknown key {unknown[0]!r} (allowed: {', '.join(_UPSTREAM_KEYS)})")
    prefix = raw.get("prefix")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise McpConfigError(f"`{where}.prefix` must be 1-64 letters, digits or '-' (tools are `{{prefix}}_{{name}}`)")
    has_cmd, has_url = "command" in raw, "url" in raw
    if has_cmd == has_url:
        raise McpConfigError(f"`{where}` needs exactly one of `command` (stdio) or `url` (streamable HTTP)")
    timeout = _seconds(raw["timeout_seconds"], f"upstreams[{i}].timeout_seconds") if "timeout_seconds" in raw else None
    if has_cmd:
        if not isinstance(raw["command"], str) or not raw["command"]:
            raise McpConfigError(f"`{where}.command` must be a non-empty string")
        if "url" in raw or "headers" in raw:
            raise McpConfigError(f"`{where}`: `headers` go with `url`, not `command`")
        cwd = raw.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise McpConfigError(f"`{where}.cwd` must be a string")
        return Upstream(prefix, command=raw["command"], args=_strings(raw.get("args", []), f"{where}.args"),
                        env=_string_map(raw.get("env", {}), f"{where}.env"), cwd=cwd, timeout_seconds=timeout)
    url = raw["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise McpConfigError(f"`{where}.url` must be an http(s) URL")
    if any(k in raw for k in ("args", "env", "cwd")):
        raise McpConfigError(f"`{where}`: `args`, `env` and `cwd` go with `command`, not `url`")
    return Upstream(prefix, url=url, headers=_string_map(raw.get("headers", {}), f"{where}.headers"),
                    timeout_seconds=timeout)


def parse_mcp(raw: Any) -> McpAgent:
    """Validate an agent's `mcp:` mapping (already YAML-decoded and environment-expanded)."""
    if not isinstance(raw, dict):
        raise McpConfigError("`mcp` must be a mapping")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise McpConfigError(f"`mcp`: unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    ups = raw.get("upstreams")
    if not isinstance(ups, list) or not ups:
        raise McpConfigError("`mcp.upstreams` must be a non-empty list")
    upstreams = tuple(_upstream(u, i) for i, u in enumerate(ups))
    prefixes = [u.prefix for u in upstreams]
    if len(set(prefixes)) != len(prefixes):
        raise McpConfigError("`mcp.upstreams`: each upstream needs its own `prefix`")
    token = raw.get("client_token")
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        raise McpConfigError("`mcp.client_token` must be a string of at least 16 characters")
    pins = raw.get("pins", {})
    if not isinstance(pins, dict) or not all(isinstance(k, str) and isinstance(v, str) and _HASH.fullmatch(v)
                                             for k, v in pins.items()):
        raise McpConfigError("`mcp.pins` must map tool names to definition hashes (64 lowercase hex digits)")
    trust = raw.get("trust_new_tools", False)
    if not isinstance(trust, bool):
        raise McpConfigError("`mcp.trust_new_tools` must be true or false")
    strict = raw.get("record_before_answer", False)
    if not isinstance(strict, bool):
        raise McpConfigError("`mcp.record_before_answer` must be true or false")
    hide = raw.get("hide_denied_tools", False)
    if not isinstance(hide, bool):
        raise McpConfigError("`mcp.hide_denied_tools` must be true or false")
    sizes = {}
    for key in ("max_args_bytes", "max_result_bytes"):
        if key in raw:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 1024 <= v <= 64 * 1024 * 1024:
                raise McpConfigError(f"`mcp.{key}` must be a whole number of bytes in [1024, 64 MiB]")
            sizes[key] = v
    waits = {k: _seconds(raw[k], k) for k in ("approval_wait_seconds", "lease_wait_seconds",
                                                "call_timeout_seconds", "resume_seconds",
                                                "pins_refresh_seconds") if k in raw}
    return McpAgent(upstreams=upstreams, client_token=token,
                    at_most_once=_strings(raw.get("at_most_once", []), "mcp.at_most_once"),
                    pins=dict(pins), trust_new_tools=trust, record_before_answer=strict,
                    hide_denied_tools=hide, **sizes, **waits)  # type: ignore[arg-type]
