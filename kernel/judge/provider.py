"""A judge provider file (the upstream format: `url`, `headers`, `body`, `probabilities`, `timeout`).

```yaml
url: https://api.example.com/v1/judge
headers:
  Authorization: Bearer ${JUDGE_API_KEY}
body: |
  {"state": {"tool_call": {{json .ToolCall}}}, "question": {{json .Question}}}
probabilities: answers.decision.probabilities
timeout: 5s          # optional; else REGENT_JUDGE_TIMEOUT
```

`${VAR}` / `$VAR` in `url` and header values are expanded from the environment when the file is
loaded (a missing variable expands to nothing, as Go's os.ExpandEnv does). The header values are
secrets: they are sent, never logged or recorded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kernel import yamldoc
from kernel.errors import ConfigError
from kernel.judge.template import Template, TemplateError
from kernel.policy.duration import DurationError, parse_duration

__all__ = ["TYPESAFE_KEY_VARIABLES", "TYPESAFE_URL", "JudgeProvider", "load_provider", "parse_provider",
           "typesafe_provider"]

_KEYS = frozenset({"url", "headers", "body", "probabilities", "timeout"})
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
MAX_PROVIDER_BYTES = 256 * 1024


@dataclass(frozen=True)
class JudgeProvider:
    url: str
    body: Template
    probabilities: tuple[str, ...]  # the path of the probabilities object in the answer
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets: never in repr
    timeout_seconds: float | None = None
    source: str = ""  # the file it came from, for messages


def _expand(value: str, env: Mapping[str, str]) -> str:
    return _ENV.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def parse_provider(text: str, env: Mapping[str, str], source: str = "judge provider") -> JudgeProvider:
    """Parse a provider file's text; raises ConfigError naming the file and what is wrong."""
    try:
        doc = yamldoc.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: a judge provider file is a mapping (url, headers, body, probabilities)")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_KEYS))})")
    missing = [k for k in ("url", "body", "probabilities") if not doc.get(k)]
    if missing:
        raise ConfigError(f"{source}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
    for key in ("url", "body", "probabilities"):
        if not isinstance(doc[key], str):
            raise ConfigError(f"{source}: {key} must be a string")
    headers: Any = doc.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ConfigError(f"{source}: headers must map header names to strings")
    url = _expand(doc["url"], env)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{source}: url must be an http:// or https:// URL")
    try:
        body = Template(doc["body"])
    except TemplateError as exc:
        raise ConfigError(f"{source}: body: {exc}") from None
    timeout = None
    if doc.get("timeout") is not None:
        try:
            timeout = parse_duration(str(doc["timeout"]))
        except DurationError as exc:
            raise ConfigError(f"{source}: timeout: {exc}") from None
        if timeout <= 0:
            raise ConfigError(f"{source}: timeout must be positive")
    path = tuple(p for p in doc["probabilities"].split(".") if p)
    return JudgeProvider(
        url=url,
        body=body,
        probabilities=path,
        headers={k: _expand(v, env) for k, v in headers.items()},
        timeout_seconds=timeout,
        source=source,
    )


def load_provider(path: str | Path, env: Mapping[str, str]) -> JudgeProvider:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"judge provider {p}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROVIDER_BYTES:
        raise ConfigError(f"judge provider {p}: larger than {MAX_PROVIDER_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"judge provider {p}: not UTF-8") from None
    return parse_provider(text, env, source=str(p))


# Upstream Rebuno's built-in judge (internal/policy/judge.go, NewJudge): TypeSafe's jev model at a
# fixed endpoint, configured by nothing but an API key (REBUNO_TYPESAFE_API_KEY).
TYPESAFE_URL = "https://api.typesafe.ai/v1/systemone"
TYPESAFE_KEY_VARIABLES = ("REGENT_JUDGE_API_KEY", "REBUNO_TYPESAFE_API_KEY")
_TYPESAFE_BODY = """{
  "model": "jev-latest",
  "state": {"tool_call": {{json .ToolCall}} },
  "questions": {
    "decision": {
      "type": "choice",
      "instructions": {{if .Instructions}}{"question": {{json .Question}}, "note": {{json .Instructions}} }{{else}}{{json .Question}}{{end}},
      "criteria": {{json .Criteria}}
    }
  }
}
"""


def typesafe_provider(api_key: str, url: str = TYPESAFE_URL) -> JudgeProvider:
    """The provider upstream builds from an API key alone: the body it sends, `Authorization:
    Bearer <key>`, and the probabilities at answers.decision.probabilities."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError("REGENT_JUDGE_URL must be an http:// or https:// URL")
    return JudgeProvider(
        url=url,
        body=Template(_TYPESAFE_BODY),
        probabilities=("answers", "decision", "probabilities"),
        headers={"Authorization": f"Bearer {api_key}"},
        source="the API key (TypeSafe)",
    )
