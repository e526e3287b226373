"""The provisioning manifest (rebuno-v0 §3.8): `agents: [{id, webhook_url, secret,
lease_timeout_seconds, policy | policy_file}]`, environment-expanded, strictly parsed, upserted on
every boot. Agents the manifest does not list are left alone."""

from __future__ import annotations

import json
import logging
import os
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kernel.core.agents import MIN_LEASE_SECONDS, register_agent, validate_agent_fields
from kernel.core.kernel import MAX_LEASE_SECONDS, Kernel
from kernel.errors import ConfigError
from kernel.errors import ValidationError as FieldError
from kernel.manifest_mcp import McpAgent, McpConfigError, parse_mcp
from kernel.yamldoc import SafeLoader12

log = logging.getLogger("kernel.manifest")

_AGENT_KEYS = ("id", "webhook_url", "secret", "lease_timeout_seconds", "policy", "policy_file", "judge_provider",
               "bundle", "shadow_policy", "shadow_policy_file", "mcp")
# `bundle:` pulls the agent's bundle from a bundle server (docs/policy-rollout.md).
_BUNDLE_KEYS = ("url", "resource", "min_delay_seconds", "max_delay_seconds", "verification_key", "key_id",
                "algorithm", "scope", "keys")
# `bundle.keys`: verification keys by key id, as OPA's `keys` config (the signature's `kid` picks one).
_KEY_KEYS = ("key", "algorithm", "scope")
_REQUIRED = ("id", "webhook_url", "secret")
# `$VAR`, `${VAR}`, and (a Regent extension) `${VAR:-default}` for an unset or empty VAR.
_VAR = re.compile(r"\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")
_LEFTOVER = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*")

PolicySource = Path | str  # a policy_file (resolved against the manifest) or inline bundle text
PolicyHook = Callable[[str, PolicySource], None]


@dataclass(frozen=True, slots=True)
class ManifestBundle:
    """Where an agent's bundle is pulled from; unset fields take the REGENT_BUNDLE_* settings."""

    url: str | None = None  # a full URL
    resource: str | None = None  # a path under REGENT_BUNDLE_SERVER_URL
    min_delay_seconds: float | None = None
    max_delay_seconds: float | None = None
    verification_key: str | None = None  # PEM text or file, or an HMAC secret
    key_id: str | None = None
    algorithm: str | None = None
    scope: str | None = None
    # Several verification keys by key id (OPA's `keys`): (key_id, key, algorithm, scope).
    keys: tuple[tuple[str, str, str | None, str | None], ...] = ()


@dataclass(frozen=True, slots=True)
class ManifestAgent:
    id: str
    webhook_url: str
    secret: str
    line: int  # where the entry starts, for messages
    lease_timeout_seconds: int | None = None
    policy: str | None = None  # inline bundle text
    policy_file: Path | None = None  # absolute path
    judge_provider: Path | None = None  # this agent's judge provider file (docs/judge.md)
    bundle: ManifestBundle | None = None
    shadow_policy: str | None = None  # a shadow (candidate) bundle, inline
    shadow_policy_file: Path | None = None
    mcp: McpAgent | None = None  # `regent mcp`'s upstreams for this agent (docs/mcp.md)

    @property
    def policy_source(self) -> PolicySource | None:
        return self.policy_file if self.policy_file is not None else self.policy

    @property
    def shadow_source(self) -> PolicySource | None:
        return self.shadow_policy_file if self.shadow_policy_file is not None else self.shadow_policy


@dataclass(frozen=True, slots=True)
class Manifest:
    path: Path
    agents: tuple[ManifestAgent, ...]
    warnings: tuple[str, ...] = field(default=())
    judge_provider: Path | None = None  # the deployment's judge provider file, if REGENT_JUDGE_PROVIDER is unset


def expand_env(text: str, env: Mapping[str, str]) -> str:
    """Expand `$VAR` / `${VAR}` from `env`; an unset variable is left exactly as written.
    `${VAR:-default}` yields the default when VAR is unset or empty."""

    def sub(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("bare")
        value = env.get(name)
        if m.group("default") is not None and not value:
            return m.group("default")
        return value if value is not None else m.group(0)

    return _VAR.sub(sub, text)


def load_manifest(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Manifest:
    """Read, expand and parse a manifest file. Raises ConfigError naming the file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the provisioning manifest: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: the provisioning manifest is not UTF-8 text") from None
    return parse_manifest(text, p, os.environ if env is None else env)


def parse_manifest(text: str, path: Path, env: Mapping[str, str]) -> Manifest:
    return _Parser(expand_env(text, env), path).manifest()


class _Parser:
    def __init__(self, text: str, path: Path):
        self.text = text
        self.path = path
        self.base = path.resolve().parent
        self.warnings: list[str] = []
        self._constructor = SafeLoader12("")

    def fail(self, node: Node | None, reason: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(f"{self.path}{line}: {reason}")

    def manifest(self) -> Manifest:
        try:
            root = yaml.compose(self.text, Loader=SafeLoader12)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{self.path}{where}: invalid YAML: {exc.problem or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{self.path}: invalid YAML: {exc}") from None
        if root is None:
            raise ConfigError(f"{self.path}: the manifest is empty (expected `agents: [...]`)")
        top = self.mapping(root, "the manifest", allowed=("agents", "judge_provider"))
        judge = self.file_path(top["judge_provider"], "judge_provider", "the manifest") if "judge_provider" in top else None
        agents_node = top.get("agents")
        if agents_node is None:
            raise self.fail(root, "missing key `agents`")
        if isinstance(agents_node, ScalarNode) and agents_node.tag.endswith(":null"):
            return Manifest(self.path, (), tuple(self.warnings), judge_provider=judge)
        if not isinstance(agents_node, SequenceNode):
            raise self.fail(agents_node, "`agents` must be a list of agents")
        agents: list[ManifestAgent] = []
        seen: dict[str, int] = {}
        for item in agents_node.value:
            a = self.agent(item)
            if a.id in seen:
                raise self.fail(item, f"agent {a.id!r} is listed twice (first at line {seen[a.id]})")
            seen[a.id] = a.line
            agents.append(a)
        return Manifest(self.path, tuple(agents), tuple(self.warnings), judge_provider=judge)

    def mapping(self, node: Node, what: str, allowed: tuple[str, ...]) -> dict[str, Node]:
        if not isinstance(node, MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        out: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                raise self.fail(key_node, f"{what}: keys must be plain strings")
            key = key_node.value
            if key not in allowed:
                raise self.fail(key_node, f"{what}: unknown key {key!r} (allowed: {', '.join(allowed)})")
            if key in out:
                raise self.fail(key_node, f"{what}: duplicate key {key!r}")
            out[key] = value_node
        return out

    def scalar(self, node: Node, key: str) -> object:
        if not isinstance(node, ScalarNode):
            raise self.fail(node, f"`{key}` must be a single value")
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # a number YAML 1.1 and 1.2 read differently, 1e400
            raise self.fail(node, f"`{key}`: {getattr(exc, 'problem', None) or exc}") from None

    def string(self, node: Node, key: str) -> str:
        value = self.scalar(node, key)
        if not isinstance(value, str):
            raise self.fail(node, f"`{key}` must be a string (quote it)")
        return value

    def agent(self, node: Node) -> ManifestAgent:
        fields = self.mapping(node, "an agent entry", allowed=_AGENT_KEYS)
        for key in _REQUIRED:
            if key not in fields:
                raise self.fail(node, f"an agent entry is missing `{key}`")
        agent_id = self.string(fields["id"], "id")
        webhook_url = self.string(fields["webhook_url"], "webhook_url")
        secret = self.string(fields["secret"], "secret")
        try:
            validate_agent_fields(agent_id, webhook_url, secret)
        except FieldError as exc:
            raise self.fail(node, f"agent {agent_id!r}: {exc.message.removeprefix('validation error: ')}") from None
        for key, value in (("webhook_url", webhook_url), ("secret", secret)):
            left = _LEFTOVER.search(value)
            if left:
                self.warnings.append(
                    f"{self.path}:{fields[key].start_mark.line + 1}: agent {agent_id!r} {key} contains "
                    f"{left.group(0)!r}, an unset environment variable left as written"
                )
        lease = self.lease(fields.get("lease_timeout_seconds"), agent_id)
        if "policy" in fields and "policy_file" in fields:
            raise self.fail(fields["policy_file"], f"agent {agent_id!r}: `policy` and `policy_file` are mutually exclusive")
        policy = self.inline_policy(fields["policy"], agent_id) if "policy" in fields else None
        policy_file = self.policy_path(fields["policy_file"], agent_id) if "policy_file" in fields else None
        judge = (self.file_path(fields["judge_provider"], "judge_provider", f"agent {agent_id!r}")
                 if "judge_provider" in fields else None)
        bundle = self.bundle(fields["bundle"], agent_id) if "bundle" in fields else None
        if bundle is not None and (policy is not None or policy_file is not None):
            raise self.fail(fields["bundle"], f"agent {agent_id!r}: `bundle` and `policy`/`policy_file` are "
                            "mutually exclusive (the bundle server decides the agent's bundle)")
        if "shadow_policy" in fields and "shadow_policy_file" in fields:
            raise self.fail(fields["shadow_policy_file"],
                            f"agent {agent_id!r}: `shadow_policy` and `shadow_policy_file` are mutually exclusive")
        shadow = self.inline_policy(fields["shadow_policy"], agent_id, "shadow_policy") if "shadow_policy" in fields else None
        shadow_file = (self.file_path(fields["shadow_policy_file"], "shadow_policy_file", f"agent {agent_id!r}")
                       if "shadow_policy_file" in fields else None)
        mcp = self.mcp(fields["mcp"], agent_id) if "mcp" in fields else None
        return ManifestAgent(id=agent_id, webhook_url=webhook_url, secret=secret, line=node.start_mark.line + 1,
                             lease_timeout_seconds=lease, policy=policy, policy_file=policy_file,
                             judge_provider=judge, bundle=bundle, shadow_policy=shadow,
                             shadow_policy_file=shadow_file, mcp=mcp)

    def mcp(self, node: Node, agent_id: str) -> McpAgent:
        try:
            return parse_mcp(self._constructor.construct_object(node, deep=True))
        except McpConfigError as exc:
            raise self.fail(node, f"agent {agent_id!r}: {exc}") from None

    def bundle(self, node: Node, agent_id: str) -> ManifestBundle:
        fields = self.mapping(node, f"agent {agent_id!r} bundle", allowed=_BUNDLE_KEYS)
        values: dict[str, object] = {}
        for key, value_node in fields.items():
            if key == "keys":
                values["keys"] = self.bundle_keys(value_node, agent_id)
                continue
            value = self.scalar(value_node, key)
            if key.endswith("_seconds"):
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise self.fail(value_node, f"agent {agent_id!r}: bundle `{key}` must be a number of seconds")
                value = float(value)
            elif not isinstance(value, str) or not value:
                raise self.fail(value_node, f"agent {agent_id!r}: bundle `{key}` must be a non-empty string")
            values[key] = value
        if "url" in values and "resource" in values:
            raise self.fail(node, f"agent {agent_id!r}: bundle `url` and `resource` are mutually exclusive")
        if "verification_key" in values:
            values["verification_key"] = self.key_file(str(values["verification_key"]))
        return ManifestBundle(**values)  # type: ignore[arg-type]

    def key_file(self, key: str) -> str:
        if "\n" not in key and not key.startswith("-----") and (self.base / key).is_file():
            return str(self.base / key)  # a key file beside the manifest
        return key

    def bundle_keys(self, node: Node, agent_id: str) -> tuple[tuple[str, str, str | None, str | None], ...]:
        what = f"agent {agent_id!r} bundle keys"
        if not isinstance(node, MappingNode) or not node.value:
            raise self.fail(node, f"{what} must be a mapping of key id to {{key, algorithm, scope}}")
        out: list[tuple[str, str, str | None, str | None]] = []
        for key_node, entry_node in node.value:
            if not isinstance(key_node, ScalarNode) or not key_node.value:
                raise self.fail(key_node, f"{what}: key ids must be plain strings")
            key_id = key_node.value
            if any(k[0] == key_id for k in out):
                raise self.fail(key_node, f"{what}: duplicate key id {key_id!r}")
            fields = self.mapping(entry_node, f"{what} {key_id!r}", allowed=_KEY_KEYS)
            got: dict[str, str] = {}
            for name, value_node in fields.items():
                value = self.scalar(value_node, name)
                if not isinstance(value, str) or not value:
                    raise self.fail(value_node, f"{what} {key_id!r}: `{name}` must be a non-empty string")
                got[name] = value
            if "key" not in got:
                raise self.fail(entry_node, f"{what} {key_id!r}: `key` is required (a PEM file or text, or an "
                                "HMAC secret)")
            out.append((key_id, self.key_file(got["key"]), got.get("algorithm"), got.get("scope")))
        return tuple(out)

    def lease(self, node: Node | None, agent_id: str) -> int | None:
        if node is None:
            return None
        value = self.scalar(node, "lease_timeout_seconds")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(node, f"agent {agent_id!r}: `lease_timeout_seconds` must be a whole number of seconds")
        if value > MAX_LEASE_SECONDS:
            raise self.fail(node, f"agent {agent_id!r}: `lease_timeout_seconds` must be at most {MAX_LEASE_SECONDS}")
        if 0 < value < MIN_LEASE_SECONDS:
            # Rebuno's registration rule: below the minimum is ignored (the kernel default applies).
            self.warnings.append(
                f"{self.path}:{node.start_mark.line + 1}: agent {agent_id!r} lease_timeout_seconds {value} is "
                f"below {MIN_LEASE_SECONDS}; the kernel default lease applies"
            )
        return value or None

    def inline_policy(self, node: Node, agent_id: str, key: str = "policy") -> str:
        if isinstance(node, ScalarNode):
            value = self.scalar(node, key)
            if not isinstance(value, str):
                raise self.fail(node, f"agent {agent_id!r}: `{key}` must be bundle text or a mapping")
            return value
        if isinstance(node, MappingNode):
            # An inline bundle: keep its own text (comments, order) so its revision hash is stable.
            line_start = self.text.rfind("\n", 0, node.start_mark.index) + 1
            pad = " " * (node.start_mark.index - line_start)
            return textwrap.dedent(pad + self.text[node.start_mark.index:node.end_mark.index]).rstrip() + "\n"
        raise self.fail(node, f"agent {agent_id!r}: `{key}` must be bundle text or a mapping")

    def policy_path(self, node: Node, agent_id: str) -> Path:
        return self.file_path(node, "policy_file", f"agent {agent_id!r}")

    def file_path(self, node: Node, key: str, owner: str) -> Path:
        """A file named relative to the manifest, which must exist."""
        rel = self.string(node, key)
        p = Path(rel)
        p = p if p.is_absolute() else self.base / p
        if not p.exists():
            raise self.fail(node, f"{owner}: {key} {rel!r} not found (looked for {p})")
        return p


def policy_content(source: PolicySource) -> tuple[str, str]:
    """(kind, stored content) of a manifest bundle: a `.yaml`/`.yml` file or inline text is YAML;
    a directory or a `.tar.gz`/`.tgz` is a Rego bundle (stored as its JSON mapping)."""
    if isinstance(source, str):
        return "yaml", source
    name = source.name.lower()
    if source.is_dir() or name.endswith((".tar.gz", ".tgz")):
        from kernel.policy.rego import load_rego_bundle

        b = load_rego_bundle(source)
        mapping = {"modules": dict(b.modules), "data": b.data, "manifest": b.manifest}
        return "rego", json.dumps(mapping, sort_keys=True, ensure_ascii=False)
    return "yaml", source.read_text(encoding="utf-8")


def provision(k: Kernel, manifest: Manifest, apply: PolicyHook | None = None) -> list[ManifestAgent]:
    """Upsert every listed agent (its stored policy kept), then store each bundle and shadow bundle
    (compiled first: a bundle that does not compile fails the boot naming the manifest and the
    agent). The same shadow again keeps its tallies; no `shadow_policy` leaves any shadow alone."""
    from kernel.core.policies import Actor, store_policy
    from kernel.core.shadow import store_shadow
    from kernel.errors import ValidationError

    by = Actor(str(manifest.path), "manifest")  # the policy audit trail names the manifest file
    for a in manifest.agents:
        register_agent(k, a.id, a.webhook_url, a.secret, a.lease_timeout_seconds, keep_policy=True)
        for source, shadow in ((a.policy_source, False), (a.shadow_source, True)):
            if source is None:
                continue
            if apply is not None:
                if not shadow:
                    apply(a.id, source)
                continue
            try:
                kind, content = policy_content(source)
                if shadow:
                    store_shadow(k, a.id, kind, content, by)
                else:
                    store_policy(k, a.id, kind, content, by)
            except (ValidationError, OSError) as exc:
                where = f"{source}" if isinstance(source, Path) else f"inline {'shadow_policy' if shadow else 'policy'}"
                raise ConfigError(f"{manifest.path}: agent {a.id!r}: {where}: "
                                  f"{getattr(exc, 'message', exc)}") from None
    return list(manifest.agents)
