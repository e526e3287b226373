"""Fixtures for the Rego engine tests: bundle builders and a shared worker pool."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kernel.domain.decision import PolicyInput
from kernel.policy.rego import RegoBundle, RegoEngine, parse_rego_bundle

HEADER = "package shell\nimport rego.v1\n\n"


def bundle_of(
    policy: str,
    *,
    data: dict[str, Any] | None = None,
    roots: list[str] | None = None,
    regent: dict[str, Any] | None = None,
    revision: str | None = None,
    extra_modules: dict[str, str] | None = None,
) -> RegoBundle:
    """A bundle with one module `shell/policy.rego` (HEADER prepended unless it has a package)."""
    source = policy if policy.lstrip().startswith("package") else HEADER + policy
    manifest: dict[str, Any] = {"roots": roots if roots is not None else ["shell"]}
    if regent is not None:
        manifest["metadata"] = {"regent": regent}
    if revision is not None:
        manifest["revision"] = revision
    return parse_rego_bundle(
        {
            "modules": {"shell/policy.rego": source, **(extra_modules or {})},
            "data": data or {},
            "manifest": manifest,
        }
    )


def step(target: str = "shell_exec", kind: str = "tool_call", **args: Any) -> PolicyInput:
    return PolicyInput(
        agent_id="shell",
        kind=kind,
        target=target,
        args=args,
        execution={
            "id": "exec-1",
            "agent_id": "shell",
            "input": {},
            "created_at": "2026-12-02T18:59:00Z",
        },
        usage={"input_tokens": 812, "output_tokens": 96},
        now="2026-12-02T19:00:00Z",
    )


def decision_policy(value: Any) -> str:
    """A policy whose entrypoint is `value` (JSON is valid Rego)."""
    return f"decision := {json.dumps(value)}\n"


@pytest.fixture(scope="session")
def engine() -> Iterator[RegoEngine]:
    with RegoEngine(size=2, timeout=1.0, test_hooks=True) as e:
        yield e
